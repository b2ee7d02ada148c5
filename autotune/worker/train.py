"""The timed training loop of a trial: synthetic batches, Megatron's schedules, step timing."""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from autotune.specs.model import padded_vocab_size
from autotune.trials.protocol import step_line
from autotune.trials.trial import ClockSummary, TrialSpec
from autotune.worker.clocks import ClockSampler
from autotune.worker.host import HostWatch, gc_held
from autotune.worker.timing import StepJudge, Timing

__all__ = ["StepTimes", "make_batches", "train"]


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Wall-clock seconds of each step (max over ranks), split into warm-up and timed steps
    (autotune.worker.timing), the last step's loss, and what this rank's host and GPU did
    during the timed steps."""

    timing: Timing
    loss: float | None
    """Mean per-token loss of the last step on a last pipeline stage; None elsewhere."""
    step_losses: tuple[float | None, ...] = ()
    """Mean per-token loss of every step, warm-up and timed, on a last pipeline stage (empty
    elsewhere): what the FP8 loss guard compares with a bf16 twin's (autotune.search.
    loss_guard)."""
    clocks: ClockSummary | None = None
    """This rank's GPU during the timed steps (autotune.worker.clocks); None without NVML."""
    host: dict[str, Any] | None = None
    """This rank's host during the timed steps (autotune.worker.host.HostWatch.over), with
    the garbage collector's passes over the timed steps (gc_pauses, gc_pause_s: none while it
    is held off) and over all steps, warm-up included (gc_pauses_all_steps)."""

    @property
    def times_s(self) -> tuple[float, ...]:
        """The timed steps."""
        return self.timing.timed_s

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)


def make_batches(spec: TrialSpec, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """One synthetic micro-batch per micro-batch of a step, the same on every rank of a DP
    replica (fixed seed): tokens [mbs, seq] int64, labels = tokens shifted by one. With context
    parallelism each rank keeps its share of the sequence, as Megatron-LM's get_batch does."""
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    from autotune.megatron.megatron_versions import GET_BATCH_ON_THIS_CP_RANK, call_kwargs, running

    m, s = spec.model, spec.layout
    cp_kwargs = call_kwargs(GET_BATCH_ON_THIS_CP_RANK, running())
    if s.cp > 1:  # pretrain_gpt.py at core_v0.19.0 passes the group; 0.16.1 reads it the same
        cp_kwargs["cp_group"] = parallel_state.get_context_parallel_group()
    generator = torch.Generator(device="cpu").manual_seed(spec.seed)
    # Draw from the real vocabulary, not the padded one, as a tokenizer would.
    vocab = min(m.vocab_size, padded_vocab_size(m, s.tp))
    position_ids = torch.arange(m.seq_length, device=device).unsqueeze(0).expand(s.mbs, -1)
    loss_mask = torch.ones(s.mbs, m.seq_length, dtype=torch.float, device=device)
    batches = []
    for _ in range(s.num_microbatches):
        sample = torch.randint(0, vocab, (s.mbs, m.seq_length + 1), generator=generator)
        sample = sample.to(device)
        batch = {"tokens": sample[:, :-1].contiguous(), "labels": sample[:, 1:].contiguous(),
                 "position_ids": position_ids, "loss_mask": loss_mask}
        # Megatron-LM slices every batch for the rank's CP position (2 x cp chunks, this
        # rank's pair, so that causal attention's work is balanced); the schedule is told the
        # local length, seq / cp.
        batches.append(get_batch_on_this_cp_rank(batch, **cp_kwargs) if s.cp > 1 else batch)
    return batches


def _loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor, *,
               nan_checks: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    # The 3-tuple form of megatron-core's schedules (forward_step_calc_loss): summed loss and
    # token count; the schedule divides by both.
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1)
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    reported = torch.stack([loss.detach(), num_tokens.detach().float()])
    if nan_checks:
        # pretrain_gpt.py's loss_func, as Megatron-LM runs unless
        # --no-check-for-nan-in-loss-and-grad: two checks, each a wait for the GPU
        # (autotune.levers.nan_checks; the gradient buckets' check is megatron-core's DDP's).
        from megatron.core.rerun_state_machine import get_rerun_state_machine

        checks = get_rerun_state_machine()
        for rejection, what in ((torch.isnan, "NaN"), (torch.isinf, "Inf")):
            checks.validate_result(result=loss, rejection_func=rejection,
                                   message=f"found {what} in local forward loss calculation",
                                   tolerance=0.0, fatal=True)
    return loss, num_tokens, {"lm loss": reported}


def _forward_step(data_iterator: Iterator[dict[str, torch.Tensor]], model: Any, *,
                  nan_checks: bool) -> tuple[torch.Tensor, Any]:
    batch = next(data_iterator)
    # attention_mask None: every impl applies the causal mask itself (AttnMaskType.causal).
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(_loss_func, batch["loss_mask"], nan_checks=nan_checks)


def _wire_grad_sync(spec: TrialSpec, model: list[Any], optimizer: Any, config: Any) -> None:
    """Hook DDP and the optimizer into the schedule as Megatron-LM's training.py does."""
    from megatron.core.distributed import finalize_model_grads

    s = spec.layout
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    if s.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in model]
        grad_sync = [chunk.start_grad_sync for chunk in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    if s.overlap_param_gather and s.vpp > 1:
        param_sync = [chunk.start_param_sync for chunk in model]
        config.param_sync_func = param_sync[0] if len(model) == 1 else param_sync


def _step(spec: TrialSpec, model: list[Any], optimizer: Any, iterators: list[Any],
          forward_backward: Any, marks: list[float] | None = None) -> list[dict[str, Any]]:
    """One training step as Megatron-LM's train_step runs it; `marks` gets the host's clock
    when the schedule returns and when the optimizer's step returns."""
    s, m = spec.layout, spec.model
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    losses = forward_backward(
        forward_step_func=partial(_forward_step, nan_checks=s.nan_checks),
        data_iterator=iterators if len(model) > 1 else iterators[0],
        model=model if len(model) > 1 else model[0],
        num_microbatches=s.num_microbatches,
        # The whole sequence, as Megatron-LM's training.py passes it: the schedule divides it
        # by the CP size itself for the pipeline's send/receive shapes (get_tensor_shapes, every
        # megatron-core from 0.14 to 0.19). Passing seq / cp divided twice: on 4 x H200, pp 2
        # with cp 2 crashed in the last stage's cross entropy (logits of half the labels).
        seq_length=m.seq_length,
        micro_batch_size=s.mbs,
        decoder_seq_length=m.seq_length,
        forward_only=False,
    )
    if marks is not None:
        marks.append(time.perf_counter())
    optimizer.step()
    if marks is not None:
        marks.append(time.perf_counter())
    return list(losses or [])


def train(spec: TrialSpec, model: list[Any], optimizer: Any, config: Any) -> StepTimes:
    """Run steps until autotune.worker.timing says the trial has answered; every rank takes
    the same decisions from the same times and returns the same split."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = torch.device("cuda", torch.cuda.current_device())
    _wire_grad_sync(spec, model, optimizer, config)
    batches = make_batches(spec, device)
    # One iterator per model chunk: each virtual stage draws its own micro-batches.
    iterators = [itertools.cycle(batches) for _ in model]
    forward_backward = get_forward_backward_func()
    judge = StepJudge.for_spec(spec)
    announce = torch.distributed.get_rank() == 0
    slowest = torch.zeros(1, dtype=torch.float64, device=device)
    losses: list[dict[str, Any]] = []
    step_losses: list[float | None] = []
    timing = None
    host = HostWatch()
    starts: list[float] = []
    # Per step: the host's seconds in the schedule (its kernels issued, with the syncs it makes
    # inside), in the optimizer's step, and waiting for the GPU at the end (issue 30: a warm
    # rank slower on the host shows more of the first two and no more of the last).
    split: list[tuple[float, float, float]] = []
    torch.cuda.synchronize()
    # The collector held off for the steps (autotune.worker.host), the GPU's clocks sampled
    # (autotune.worker.clocks): both over every step, the timed ones' share taken at the end.
    with gc_held() as pauses, ClockSampler.for_device(device.index or 0) as sampler:
        while timing is None:
            phase = judge.phase()
            host.mark()
            start = time.perf_counter()
            starts.append(start)
            marks: list[float] = []
            losses = _step(spec, model, optimizer, iterators, forward_backward, marks)
            torch.cuda.synchronize()
            end = time.perf_counter()
            slowest.fill_(end - start)
            if len(marks) == 2:
                split.append((marks[0] - start, marks[1] - marks[0], end - marks[1]))
            # A step ends when its slowest rank ends. Reduced after the clock stopped, so the
            # reduction is not timed; it also starts every rank's next step together.
            torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
            step_s = float(slowest.item())
            # After the clock: the step's loss, which the synchronize above has computed.
            step_losses.append(_mean_loss(losses))
            timing = judge.add(step_s)
            if announce:
                print(step_line(len(judge.times), phase, step_s), file=sys.stderr, flush=True)
        host.mark()
    first_timed = len(starts) - len(timing.timed_s)
    clocks = sampler.summary(since=starts[first_timed])
    timed_passes, timed_pause_s = pauses.since(starts[first_timed])
    return StepTimes(timing=timing, loss=_mean_loss(losses),
                     step_losses=tuple(step_losses) if losses else (),
                     clocks=clocks if clocks.samples else None,
                     host={**host.over(first_timed), "gc_pauses": timed_passes,
                           "gc_pause_s": timed_pause_s,
                           "gc_pauses_all_steps": pauses.count,
                           **_split_medians(split[first_timed:])})


def _split_medians(split: list[tuple[float, float, float]]) -> dict[str, float]:
    """The timed steps' median host seconds in the schedule, in the optimizer's step and in
    the wait for the GPU after them (empty without steps)."""
    if not split:
        return {}
    return {name: statistics.median(step[i] for step in split)
            for i, name in enumerate(("schedule_s", "optimizer_s", "gpu_wait_s"))}


def _mean_loss(losses: list[dict[str, Any]]) -> float | None:
    if not losses:
        return None
    total = torch.stack([d["lm loss"] for d in losses]).sum(dim=0)
    return float(total[0] / total[1].clamp(min=1))
