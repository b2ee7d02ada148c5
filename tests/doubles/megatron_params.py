"""Parameter counts of megatron-core GPTModels built as autotune's worker builds them, on CPU.

    python tests/doubles/megatron_params.py MODELS_JSON    # a list of ModelSpec fields
prints a JSON list of {"name", "parameters", "loss", "no_grad"}: every parameter of the model
at tp = pp = 1 (sdpa spec), built from autotune.worker.build's layer spec and TransformerConfig,
so that autotune.specs.params can be checked against what megatron-core makes of the same shape;
for models without dropout (whose CUDA RNG tracker a CPU run lacks), the mean loss of one
forward and backward pass on 2 x 32 random tokens and the parameters left without a gradient
(else null). Run in a process of its own: it starts a one-rank gloo world for megatron-core's
parallel state.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import warnings


def main(path: str) -> int:
    warnings.filterwarnings("ignore")
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel

    from autotune.layouts.layout import Layout
    from autotune.specs.model import ModelSpec, padded_vocab_size
    from autotune.trials.trial import TrialSpec
    from autotune.worker import build

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sock.getsockname()[1]))
    dist.init_process_group("gloo", rank=0, world_size=1)
    build._patch_megatron_core()  # the installed release's holes, as the worker fills them
    # MLA's rotary embeddings (megatron-core 0.16.1 multi_latent_attention.py builds
    # YarnRotaryEmbedding / RotaryEmbedding without use_cpu_initialization) ask for the current
    # CUDA device for two frequency buffers, no parameter: on a CPU-only torch, the CPU.
    import torch

    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"
    parallel_state.initialize_model_parallel(1, 1)
    rows = []
    with open(path) as f:
        models = [ModelSpec(**fields) for fields in json.load(f)]
    for m in models:
        spec = TrialSpec(model=m, layout=Layout(mbs=1, gbs=m.global_batch_size, impl="sdpa"))
        kwargs = build.transformer_config_kwargs(spec)
        kwargs.update(use_cpu_initialization=True, perform_initialization=False)
        if m.is_moe:  # the alltoall dispatcher makes a CUDA stream; no parameter of its own
            kwargs["moe_token_dispatcher_type"] = "allgather"
        config = build.transformer_config_class(kwargs)(**kwargs)  # MLA's own with MLA
        model = build._gpt_model(GPTModel, spec, config, padded_vocab_size(m), None)
        row = {"name": m.name, "parameters": sum(p.numel() for p in model.parameters()),
               "loss": None, "no_grad": None}
        if not m.hidden_dropout and not m.attention_dropout:
            row.update(_step(model, padded_vocab_size(m)))
        rows.append(row)
    print(json.dumps(rows))
    return 0


def _step(model: object, vocab: int) -> dict[str, object]:
    """One forward and backward pass of `model` (a GPTModel) on random tokens, in fp32."""
    import torch

    torch.manual_seed(0)
    model = model.float()  # type: ignore[attr-defined]
    with torch.no_grad():  # built without initialization (perform_initialization=False)
        for param in model.parameters():  # type: ignore[attr-defined]
            param.normal_(0.0, 0.02) if param.dim() > 1 else param.fill_(1.0)
    tokens = torch.randint(0, vocab, (2, 32))
    positions = torch.arange(32).expand(2, 32)
    mask = torch.ones(2, 1, 32, 32, dtype=torch.bool).triu(1)
    loss = model(tokens, positions, mask, labels=tokens).mean()  # type: ignore[operator]
    loss.backward()
    # Multi-Token Prediction and MoE log their losses in process-wide trackers sized by the
    # first model's layers (multi_token_prediction.py MTPLossLoggingHelper, moe_utils.py
    # save_to_aux_losses_tracker: an MTP model's MoE layers number num_layers + mtp_num_layers):
    # emptied for the next model.
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossLoggingHelper.tracker.clear()
    get_moe_layer_wise_logging_tracker().clear()
    no_grad = [n for n, p in model.named_parameters()  # type: ignore[attr-defined]
               if p.grad is None or not torch.isfinite(p.grad).all()]
    return {"loss": float(loss), "no_grad": no_grad}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
