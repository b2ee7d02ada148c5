"""The worker's CPU-checkable parts: arguments, spec -> TransformerConfig, failure handling,
synthetic data, the SDPA core attention against a reference, and the exit of a failing rank
under torchrun (gloo) while its peer is blocked."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune.layouts.layout import Layout
from autotune.megatron.core_config import core_config
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from autotune.trials.protocol import distributed_timeout_minutes, percentile, started_ranks
from autotune.trials.trial import TrialSpec, TrialStatus
from autotune.worker.__main__ import parse_args
from autotune.worker.report import classify, error_line

ROOT = Path(__file__).resolve().parents[1]


def _spec(model: str | ModelSpec, **layout: object) -> TrialSpec:
    m = load_model(model) if isinstance(model, str) else model
    return TrialSpec(model=m, layout=Layout(**layout))  # type: ignore[arg-type]


def test_parse_args(tmp_path: Path) -> None:
    args = parse_args(["--spec", str(tmp_path / "trial.json"), "--out-dir", str(tmp_path)])
    assert args.spec == tmp_path / "trial.json"
    assert args.out_dir == tmp_path


def test_parse_args_requires_both() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--spec", "trial.json"])


def test_importing_the_package_imports_no_torch() -> None:
    code = "import sys, autotune.worker, autotune.worker.__main__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("message", "status"), [
    ("CUDA out of memory. Tried to allocate 2.00 GiB", TrialStatus.OOM),
    ("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)", TrialStatus.OOM),
    ("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", TrialStatus.NCCL_ERROR),
    ("shapes do not match", TrialStatus.CRASH),
])
def test_classify_by_message(message: str, status: TrialStatus) -> None:
    assert classify(RuntimeError(message)) == status


def test_classify_by_type() -> None:
    torch = pytest.importorskip("torch")
    assert classify(torch.cuda.OutOfMemoryError("boom")) == TrialStatus.OOM
    assert classify(torch.distributed.DistBackendError("x")) == TrialStatus.NCCL_ERROR
    assert classify(ValueError("x")) == TrialStatus.CRASH


def test_error_line_is_last_line_and_bounded() -> None:
    assert error_line(RuntimeError("first\n\nlast line\n")) == "RuntimeError: last line"
    assert error_line(KeyError()) == "KeyError"
    assert len(error_line(RuntimeError("x" * 1000))) == 300


# --- spec -> TransformerConfig (needs torch and megatron-core, CPU is enough) -------------

@pytest.fixture(scope="module")
def build():  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autotune.worker import build as module

    return module


def test_gpt2_config(build) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch.nn.functional as F

    kw = build.transformer_config_kwargs(_spec("gpt2-xl", mbs=4, gbs=64))
    assert kw["num_layers"] == 48 and kw["hidden_size"] == 1600
    assert kw["num_query_groups"] == 25 and kw["ffn_hidden_size"] == 6400
    assert kw["hidden_dropout"] == kw["attention_dropout"] == 0.1
    assert kw["activation_func"] is F.gelu and not kw["gated_linear_unit"]
    assert kw["add_bias_linear"] and kw["normalization"] == "LayerNorm"
    assert kw["params_dtype"] == kw["pipeline_dtype"] == torch.bfloat16 and kw["bf16"]
    assert kw["virtual_pipeline_model_parallel_size"] is None
    assert kw["recompute_granularity"] is None
    assert not kw["variable_seq_lengths"]
    assert "num_moe_experts" not in kw


@pytest.mark.parametrize(("pp", "vpp", "overlap", "batched"), [
    (1, 1, False, True), (4, 1, False, True), (4, 2, True, False), (2, 2, True, False)])
def test_pipeline_p2p_as_megatron_lm_runs_it(build, pp: int, vpp: int, overlap: bool,  # type: ignore[no-untyped-def]
                                             batched: bool) -> None:
    # Megatron-LM: --overlap-p2p-communication on by default, off without vpp; batched = not it.
    kw = build.transformer_config_kwargs(_spec("gpt2-xl", pp=pp, vpp=vpp, mbs=8, gbs=64))
    assert (kw["overlap_p2p_comm"], kw["batch_p2p_comm"]) == (overlap, batched)
    config = build.transformer_config(_spec("gpt2-xl", pp=pp, vpp=vpp, mbs=8, gbs=64))
    assert config.overlap_p2p_comm is overlap


def test_mixtral_config(build) -> None:  # type: ignore[no-untyped-def]
    import torch.nn.functional as F

    spec = _spec("mixtral-8x7b", tp=2, pp=2, dp=2, ep=2, vpp=2, sequence_parallel=True,
                 mbs=1, gbs=8, recompute="full", recompute_method="block",
                 recompute_num_layers=2)
    kw = build.transformer_config_kwargs(spec)
    assert kw["activation_func"] is F.silu and kw["gated_linear_unit"]
    assert kw["hidden_dropout"] == 0.0 and not kw["add_bias_linear"]
    assert kw["num_query_groups"] == 8 and kw["normalization"] == "RMSNorm"
    assert kw["num_moe_experts"] == 8 and kw["moe_router_topk"] == 2
    assert kw["moe_token_dispatcher_type"] == "alltoall"
    assert kw["virtual_pipeline_model_parallel_size"] == 2
    assert (kw["tensor_model_parallel_size"], kw["pipeline_model_parallel_size"],
            kw["expert_model_parallel_size"]) == (2, 2, 2)
    assert kw["sequence_parallel"]
    assert (kw["recompute_granularity"], kw["recompute_method"],
            kw["recompute_num_layers"]) == ("full", "block", 2)
    cfg = build.transformer_config(spec)  # megatron-core's own validation accepts it
    assert cfg.num_moe_experts == 8


@pytest.mark.parametrize(("recompute", "granularity"),
                         [("none", None), ("selective", "selective"), ("full", "full")])
def test_recompute_mapping(build, recompute: str, granularity: str | None) -> None:  # type: ignore[no-untyped-def]
    kw = build.transformer_config_kwargs(_spec("gpt2", recompute=recompute))
    assert kw["recompute_granularity"] == granularity
    if recompute != "full":
        assert kw["recompute_method"] is None and kw["recompute_num_layers"] is None


def test_nccl_timeout_minutes() -> None:
    assert distributed_timeout_minutes(120) == 2
    assert distributed_timeout_minutes(5) == 1
    assert distributed_timeout_minutes(121) == 3


# --- data, percentiles, metrics ----------------------------------------------------------

def test_make_batches_shift_and_shape() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autotune.worker.train import make_batches

    m = ModelSpec(name="t", num_layers=2, hidden_size=64, num_attention_heads=4,
                  vocab_size=1000, seq_length=16, global_batch_size=8)
    spec = TrialSpec(model=m, layout=Layout(mbs=2, gbs=8))
    batches = make_batches(spec, torch.device("cpu"))
    assert len(batches) == 4
    b = batches[0]
    assert b["tokens"].shape == (2, 16) and b["tokens"].dtype == torch.int64
    assert torch.equal(b["tokens"][:, 1:], b["labels"][:, :-1])
    assert int(b["tokens"].max()) < 1000
    again = make_batches(spec, torch.device("cpu"))
    assert torch.equal(again[3]["labels"], batches[3]["labels"])  # fixed seed


@pytest.mark.parametrize(("cp", "rank"), [(2, 0), (2, 1), (4, 0), (4, 3)])
def test_make_batches_keeps_this_cp_ranks_share(cp: int, rank: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With cp > 1 a rank trains on 2 of the 2 x cp sequence chunks (rank and 2cp-1-rank, as
    Megatron-LM's get_batch balances causal attention), with their own positions."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core import parallel_state

    from autotune.worker.train import make_batches

    m = ModelSpec(name="t", num_layers=2, hidden_size=64, num_attention_heads=4,
                  vocab_size=1000, seq_length=32, global_batch_size=4)
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    whole = make_batches(TrialSpec(model=m, layout=Layout(mbs=2, gbs=4)), torch.device("cpu"))
    # The rank's CP group: a fake world of cp ranks (megatron-core 0.19 reads the group only).
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=cp)
    monkeypatch.setattr(parallel_state, "get_context_parallel_group",
                        lambda **_: dist.group.WORLD)
    try:
        mine = make_batches(TrialSpec(model=m, layout=Layout(mbs=2, gbs=4, cp=cp, dp=1)),
                            torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    chunk = m.seq_length // (2 * cp)
    kept = [*range(rank * chunk, (rank + 1) * chunk),
            *range((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)]
    for key in ("tokens", "labels", "position_ids", "loss_mask"):
        assert mine[1][key].shape == (2, m.seq_length // cp)
        assert torch.equal(mine[1][key], whole[1][key][:, kept])


def test_p90() -> None:
    assert percentile([1.0], 0.9) == 1.0
    assert percentile([float(x) for x in range(11)], 0.9) == pytest.approx(9.0)


def test_metrics_from_ranks_uses_model_flops() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autotune.specs.flops import model_flops_per_token
    from autotune.trials.trial import TrialMetrics
    from autotune.worker.run import metrics_from_ranks

    spec = _spec("gpt2-xl", dp=2, mbs=8, gbs=64)
    ranks = [{"rank": r, "loss": 10.5 if r == 1 else None, "peak_allocated_bytes": 10 + r,
              "peak_reserved_bytes": 20 + r, "device_used_bytes": None,
              "outside_torch_at_start_bytes": 30 + r} for r in (1, 0)]
    from autotune.trials.trial import StopReason
    from autotune.worker.timing import Timing
    from autotune.worker.train import StepTimes

    steps = StepTimes(timing=Timing(warmup_s=(9.0,), timed_s=(2.0, 1.0, 1.5),
                                    reason=StopReason.STABLE), loss=None)
    data = metrics_from_ranks(spec, steps, ranks, {"init_s": 1.0}, warm=True,
                              code_paths={"compiled_shapes": "static"})
    assert data["code_paths"] == {"compiled_shapes": "static"}
    metrics = TrialMetrics.from_dict(data)
    assert (metrics.timed_steps, metrics.warmup_s, metrics.timed_s) == (3, 9.0, 4.5)
    assert metrics.stop_reason is StopReason.STABLE and metrics.warm is True
    assert metrics.status == TrialStatus.OK and metrics.step_time_s == 1.5
    assert metrics.tokens_per_s == pytest.approx(64 * 1024 / 1.5)
    tflops = model_flops_per_token(spec.model) * 64 * 1024 / 1.5 / 2 / 1e12
    assert metrics.tflops_per_gpu == pytest.approx(tflops)
    assert metrics.mfu == pytest.approx(tflops * 1e12 / spec.gpu_peak_bf16_flops)
    assert metrics.peak_allocated_bytes == 11 and metrics.loss_finite is True
    assert [r.rank for r in metrics.ranks] == [0, 1]
    assert metrics.device_used_bytes is None
    assert data["outside_torch_at_start_bytes"] == 31  # the most any rank held


# --- SDPA core attention ------------------------------------------------------------------

def _reference_attention(q, k, v):  # type: ignore[no-untyped-def]
    import torch

    s, b, n, d = q.shape
    k = k.repeat_interleave(n // k.shape[2], dim=2)
    v = v.repeat_interleave(n // v.shape[2], dim=2)
    scores = torch.einsum("sbnd,tbnd->bnst", q, k) / math.sqrt(d)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("bnst,tbnd->sbnd", probs, v).reshape(s, b, n * d)


@pytest.mark.parametrize("groups", [4, 2, 1])
def test_sdpa_attention_matches_reference(groups: int) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from autotune.worker.attention import SdpaAttention

    config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                               num_query_groups=groups, attention_dropout=0.0)
    attn = SdpaAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                         attention_type="self")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 2, 4, 8, generator=g)
    k = torch.randn(6, 2, groups, 8, generator=g)
    v = torch.randn(6, 2, groups, 8, generator=g)
    out = attn(q, k, v, None)
    assert out.shape == (6, 2, 32)
    torch.testing.assert_close(out, _reference_attention(q, k, v), rtol=1e-4, atol=1e-5)


def test_sdpa_backend_choice_rejects_unknown() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autotune.worker.attention import configure_sdpa_backends

    with pytest.raises(ValueError, match="AUTOTUNE_SDPA_BACKEND"):
        configure_sdpa_backends("math")


# --- a failing rank ends the job while its peer is blocked (torchrun, gloo, CPU) ----------

_FAILING_RANKS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import torch, torch.distributed as dist
    from autotune.worker.report import exit_with_failure
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        if rank == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        dist.recv(torch.zeros(1), src=1)  # blocks: rank 1 never sends
    except BaseException as exc:
        exit_with_failure(rank, exc, Path(sys.argv[1]))
""")


@pytest.mark.slow
def test_oom_rank_exits_and_peer_is_stopped(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "ranks.py"
    script.write_text(_FAILING_RANKS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOTUNE_ABORT_WAIT_S": "2"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "2", "--rdzv-endpoint", "127.0.0.1:29731", str(script),
                           str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    failure = json.loads((tmp_path / "failure-rank1.json").read_text())
    assert failure["status"] == "OOM" and failure["rank"] == 1
    assert "AUTOTUNE_STATUS rank=1 status=OOM" in proc.stderr
    assert "exitcode  : 3" in proc.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


def test_a_rank_that_cannot_write_its_stacks_gives_no_pid(tmp_path: Path) -> None:
    # Without the handler, the runner's STACKS_SIGNAL would kill the rank: it must not be asked.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "autotune.worker", "--spec",
                           str(tmp_path / "missing.json"), "--out-dir", str(blocker / "out")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": "2"})
    assert proc.returncode != 0
    assert proc.stderr.splitlines()[0] == "AUTOTUNE_STARTED rank=2"


def proc_pid(started_line: str) -> int:
    return int(started_line.split("pid=")[1].split()[0])


def test_worker_announces_its_start_before_anything_can_fail(tmp_path: Path) -> None:
    # The runner tells "no rank ever started" (a rendezvous failure) by this first line.
    proc = subprocess.run([sys.executable, "-m", "autotune.worker", "--spec",
                           str(tmp_path / "missing.json"), "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": "5"})
    assert proc.returncode != 0
    first = proc.stderr.splitlines()[0]
    assert first == f"AUTOTUNE_STARTED rank=5 pid={proc_pid(first)} host={socket.gethostname()}"
    assert started_ranks(first, socket.gethostname()) == {5: proc_pid(first)}
    assert started_ranks(first, "another-node") == {}
    # the stack-dump file is open from the start, empty until the runner asks for it
    assert (tmp_path / "stacks-rank5.txt").read_text() == ""


# --- QKV linear with its bias in the GEMM (impl sdpa) -------------------------------------

def _linear_kwargs(torch, **flags: object) -> dict[str, object]:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    kwargs: dict[str, object] = {
        "input": torch.randn(5, 3, 8, generator=g, requires_grad=True),
        "weight": torch.randn(12, 8, generator=g, requires_grad=True),
        "bias": torch.randn(12, generator=g, requires_grad=True),
        "gradient_accumulation_fusion": False, "allreduce_dgrad": False,
        "sequence_parallel": False, "grad_output_buffer": None, "wgrad_deferral_limit": None,
        "tp_group": None}
    kwargs.update(flags)
    return kwargs


def test_bias_in_gemm_matches_megatron_linear_and_its_grads() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.tensor_parallel.layers import (
        linear_with_grad_accumulation_and_async_allreduce as megatron_linear,
    )

    from autotune.worker.linear import bias_in_gemm

    grads = []
    for impl in (megatron_linear, bias_in_gemm(megatron_linear)):
        kwargs = _linear_kwargs(torch)
        out = impl(**kwargs)
        out.pow(2).sum().backward()
        grads.append((out.detach(), *(kwargs[k].grad for k in ("input", "weight", "bias"))))
    for ours, theirs in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("flags", [
    {"sequence_parallel": True}, {"allreduce_dgrad": True},
    {"gradient_accumulation_fusion": True}, {"grad_output_buffer": []}, {"bias": None}])
def test_bias_in_gemm_leaves_megatron_communication_to_megatron(flags: dict[str, object]) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autotune.worker.linear import bias_in_gemm

    calls: list[dict[str, object]] = []
    kwargs = _linear_kwargs(torch, **flags)
    result = bias_in_gemm(lambda **kw: calls.append(kw) or torch.zeros(1))(**kwargs)
    assert calls == [kwargs]
    assert result.tolist() == [0.0]


@pytest.mark.parametrize(("cp", "sp_tp"), [(1, 1), (2, 1), (4, 2)])
def test_the_schedule_gets_the_whole_sequence_and_shapes_its_own_share(
        cp: int, sp_tp: int) -> None:
    """Megatron-LM passes args.seq_length to forward_backward; megatron-core divides it by the
    CP (and, with sequence parallelism, TP) size for the pipeline's tensors. The worker must
    pass the same, or a pipeline with cp > 1 sends seq / cp**2 tokens per micro-batch."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from types import SimpleNamespace

    from megatron.core.pipeline_parallel.schedules import get_tensor_shapes

    from autotune.worker.train import _step

    m = ModelSpec(name="t", num_layers=2, hidden_size=64, num_attention_heads=4,
                  vocab_size=1000, seq_length=1024, global_batch_size=8)
    spec = TrialSpec(model=m, layout=Layout(mbs=2, gbs=8, cp=cp, dp=1))
    seen: dict[str, object] = {}

    class Chunk:
        def zero_grad_buffer(self) -> None:
            pass

    optimizer = SimpleNamespace(zero_grad=lambda: None, step=lambda: None)
    _step(spec, [Chunk()], optimizer, [iter(())], lambda **kw: seen.update(kw) or [])
    assert seen["seq_length"] == seen["decoder_seq_length"] == m.seq_length

    # megatron-core 0.19 reads variable_seq_lengths first (shapes sent with each tensor when
    # set); the worker's configuration fixes it off, as Megatron-LM does for GPT.
    config = SimpleNamespace(sequence_parallel=sp_tp > 1, hidden_size=m.hidden_size,
                             variable_seq_lengths=core_config(m, spec.layout).transformer[
                                 "variable_seq_lengths"])
    shapes = get_tensor_shapes(seq_length=seen["seq_length"], micro_batch_size=2,
                               decoder_seq_length=seen["decoder_seq_length"], config=config,
                               tp_group=SimpleNamespace(size=lambda: sp_tp),
                               cp_group=SimpleNamespace(size=lambda: cp))
    assert shapes == [(m.seq_length // cp // sp_tp, 2, m.hidden_size)]


def test_grad_clip_code_names_what_clip_grads_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core import utils as mcore_utils
    from megatron.core.optimizer import clip_grads

    from autotune.worker import build

    def te_kernel() -> None: ...

    te_kernel.__module__ = "transformer_engine_torch"
    for impl, code in [(mcore_utils.local_multi_tensor_l2_norm, "local"),
                       (build._foreach_l2_norm, "foreach"), (te_kernel, "te")]:
        monkeypatch.setattr(clip_grads, "l2_norm_impl", impl)
        assert build.grad_clip_code() == code


# --- what a trial's record keeps of its process and its steps' host time (issue 30) ---------

def test_process_state_names_the_trials_before_and_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from autotune.worker import run

    monkeypatch.setattr(run, "_earlier_trials", [])
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("AUTOTUNE_UNRELATED", "x")
    first = run.process_state(_spec("gpt2-xl", dp=2, mbs=8, gbs=64))
    second = run.process_state(_spec("gpt2-xl", tp=2, dp=1, mbs=4, gbs=64))
    assert (first["trials_before"], first["after"]) == (0, [])
    assert second["trials_before"] == 1
    assert second["after"] == [Layout(dp=2, mbs=8, gbs=64).describe()]
    assert first["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert first["env"]["NCCL_NVLS_ENABLE"] == "0" and "AUTOTUNE_UNRELATED" not in first["env"]
    assert first["gc_objects"] > 0 and first["process_groups"] >= 0
    assert first["torch_threads"] >= 1 and sum(first["threads"].values()) >= 1


def test_the_step_marks_the_schedule_and_the_optimizer() -> None:
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from autotune.worker.train import _split_medians, _step

    spec = _spec("gpt2-xl", dp=1, mbs=8, gbs=8)

    class Chunk:
        def zero_grad_buffer(self) -> None:
            pass

    marks: list[float] = []
    optimizer = SimpleNamespace(zero_grad=lambda: None, step=lambda: time.sleep(0.01))
    _step(spec, [Chunk()], optimizer, [iter(())], lambda **kw: [], marks)
    assert len(marks) == 2 and marks[1] - marks[0] >= 0.01
    assert _split_medians([]) == {}
    assert _split_medians([(1.0, 0.1, 0.0), (3.0, 0.2, 0.5), (2.0, 0.3, 0.1)]) == {
        "schedule_s": 2.0, "optimizer_s": 0.2, "gpu_wait_s": 0.1}


@pytest.mark.parametrize(("layout", "grad_enabled"), [
    ({}, True),  # bf16: built as Megatron-LM builds it
    ({"fp8": "hybrid", "impl": "te"}, True),  # FP8 compute, bf16 weights: nothing to copy
    ({"fp8": "hybrid", "impl": "te", "distributed_optimizer": True,
      "fp8_param_gather": True}, False),  # FP8 weights: no host copy of their init values
])
def test_fp8_weights_are_built_without_autograd(build, layout, grad_enabled) -> None:  # type: ignore[no-untyped-def]
    """megatron-core keeps each FP8 weight's initial value on the host only when autograd is on
    (fp8_utils.get_fp8_context: preserve_high_precision_init_val=torch.is_grad_enabled())."""
    import torch

    with build.init_grad_mode(_spec("gpt2-xl", mbs=4, gbs=64, **layout)):
        assert torch.is_grad_enabled() is grad_enabled
    assert torch.is_grad_enabled()


def test_fp8_weights_lend_the_optimizer_an_owned_init_value(build, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The optimizer's seed of an FP8 weight built without autograd owns its memory and has no
    history: megatron-core's branch `get_high_precision_init_val().view(-1)[shard].clone()`
    (distrib_optimizer.py) then keeps neither the whole fp32 weight nor its accumulator."""
    import megatron.core.fp8_utils as fp8_utils
    import torch

    class _FakeFp8Weight(torch.nn.Parameter):
        """Stands in for TE's FP8 weight: its dequantize() goes through autograd, as TE's."""

        def dequantize(self) -> torch.Tensor:  # type: ignore[override]
            return self * 1.0

    monkeypatch.setattr(fp8_utils, "is_float8tensor", lambda t: isinstance(t, _FakeFp8Weight))
    module = torch.nn.Module()
    module.fp8 = _FakeFp8Weight(torch.arange(8, dtype=torch.float32))
    module.plain = torch.nn.Parameter(torch.ones(3))
    assert build.lend_fp8_init_values(module) == 1
    assert not hasattr(module.plain, "get_high_precision_init_val")
    seed = module.fp8.get_high_precision_init_val().view(-1)[2:6].clone().float()
    assert seed.grad_fn is None and not seed.requires_grad
    assert seed.untyped_storage().nbytes() == 4 * seed.element_size()
    assert seed.tolist() == [2.0, 3.0, 4.0, 5.0]
    module.fp8.clear_high_precision_init_val()
    assert not hasattr(module.fp8, "get_high_precision_init_val")
    assert not hasattr(module.fp8, "clear_high_precision_init_val")
    assert build.lend_fp8_init_values(module) == 1  # given again only while missing
    assert build.lend_fp8_init_values(module) == 0


@pytest.mark.parametrize(("file", "qkv_bias", "qk_norm"), [
    ("qwen2-7b.json", True, False), ("qwen3-8b.json", False, True),
    ("llama-3-8b.json", False, False)])
@pytest.mark.parametrize("impl", ["local", "sdpa"])
def test_qwen_attention_features_reach_megatron_core(build, monkeypatch, file: str,  # type: ignore[no-untyped-def]
                                                     qkv_bias: bool, qk_norm: bool,
                                                     impl: str) -> None:
    from megatron.core.transformer import transformer_block
    from megatron.core.transformer.identity_op import IdentityOp

    # The layer count per pipeline chunk reads the parallel state, which this test leaves out.
    monkeypatch.setattr(transformer_block, "get_num_layers_to_build", lambda *a, **k: 1)

    spec = _spec(str(Path(__file__).parent / "data" / "hf" / file), mbs=1, gbs=8, impl=impl)
    kw = build.transformer_config_kwargs(spec)
    assert (kw.get("add_qkv_bias", False), kw.get("qk_layernorm", False)) == (qkv_bias, qk_norm)
    config = build.transformer_config(spec)  # megatron-core's own validation accepts it
    assert (config.add_qkv_bias, config.qk_layernorm) == (qkv_bias, qk_norm)
    attention = build._layer_spec(spec, config, None).layer_specs[0].submodules \
        .self_attention.submodules
    # Torch's norms (megatron-core's WrappedTorchNorm refuses sequence parallelism).
    expected = build._TorchNorm if qk_norm else IdentityOp
    assert attention.q_layernorm is expected and attention.k_layernorm is expected


@pytest.mark.parametrize("q_lora_rank", [None, 1536])
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("impl", ["local", "sdpa"])
def test_multi_latent_attention_reaches_megatron_core(build, monkeypatch,  # type: ignore[no-untyped-def]
                                                      q_lora_rank: int | None, qk_norm: bool,
                                                      impl: str) -> None:
    from megatron.core.transformer import transformer_block
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    monkeypatch.setattr(transformer_block, "get_num_layers_to_build", lambda *a, **k: 1)
    model = ModelSpec(name="v2-lite", num_layers=2, hidden_size=2048, num_attention_heads=16,
                      ffn_hidden_size=10944, vocab_size=102400, seq_length=4096,
                      global_batch_size=8, normalization="RMSNorm", add_bias_linear=False,
                      gated_linear_unit=True, activation="swiglu", position_embedding="rope",
                      qk_layernorm=qk_norm, multi_latent_attention=True,
                      q_lora_rank=q_lora_rank, kv_lora_rank=512, qk_head_dim=128,
                      qk_pos_emb_head_dim=64, v_head_dim=128)
    spec = _spec(model, mbs=1, gbs=8, impl=impl, tp=2, sequence_parallel=True)
    config = build.transformer_config(spec)  # megatron-core's own validation accepts it
    assert isinstance(config, MLATransformerConfig) and config.multi_latent_attention
    assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim,
            config.qk_pos_emb_head_dim, config.v_head_dim) == (q_lora_rank, 512, 128, 64, 128)
    assert config.rope_type == "yarn" and config.apply_rope_fusion is False  # TE's only
    layer = build._layer_spec(spec, config, None).layer_specs[0]
    assert layer.submodules.self_attention.module is MLASelfAttention
    attention = layer.submodules.self_attention.submodules
    expected = build._TorchNorm if qk_norm else IdentityOp
    assert attention.q_layernorm is expected and attention.kv_layernorm is expected
    if impl == "sdpa":
        from autotune.worker.attention import SdpaAttention

        assert attention.core_attention is SdpaAttention
        assert not hasattr(attention, "linear_qkv")
