"""Cross-check autotune's rules against megatron-core itself (0.16.1, CPU torch).

For each layout we let megatron-core judge it the way a real launch would, as far as a CPU can:
`parallel_state.initialize_model_parallel` on a fake process group of the job's world size,
`TransformerConfig(...)`, `get_num_layers_to_build` for every pipeline rank and virtual stage,
the constant micro-batch calculator, and the core attention module of the local spec.
Whenever megatron-core rejects a layout, autotune must reject it too.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from autotune.layout import Layout, check
from autotune.model import ModelSpec, load_model
from tests.conftest import cluster

if os.environ.get("CI"):  # CI installs megatron-core on purpose: a skip there would hide a gap.
    import megatron.core  # noqa: F401
    import torch
else:
    pytest.importorskip("megatron.core")
    torch = pytest.importorskip("torch")

import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.num_microbatches_calculator import (
    ConstantNumMicroBatchesCalculator,
)
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_block import get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.testing._internal.distributed.fake_pg import FakeStore

TINY_MOE = ModelSpec(name="tiny-moe", num_layers=8, hidden_size=256, num_attention_heads=8,
                     num_query_groups=4, vocab_size=1000, seq_length=512, global_batch_size=32,
                     num_experts=4, moe_topk=2, gated_linear_unit=True, add_bias_linear=False,
                     normalization="RMSNorm", position_embedding="rope")


@pytest.fixture(scope="module", autouse=True)
def _quiet_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _world(size: int) -> None:
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)


def _transformer_config(model: ModelSpec, s: Layout) -> TransformerConfig:
    recompute: dict[str, Any] = {}
    if s.recompute != "none":
        recompute["recompute_granularity"] = s.recompute
    if s.recompute == "full":
        recompute.update(recompute_method=s.recompute_method,
                         recompute_num_layers=s.recompute_num_layers)
    if s.recompute == "selective":
        recompute["recompute_modules"] = list(s.recompute_modules.modules)
    split = {"num_layers_in_first_pipeline_stage": s.first_stage_layers or None,
             "num_layers_in_last_pipeline_stage": s.last_stage_layers or None}
    offload = {"cpu_offloading": s.offload_layers > 0,
               "cpu_offloading_num_layers": s.offload_layers}
    moe: dict[str, Any] = {}
    if model.num_experts:
        moe = {"num_moe_experts": model.num_experts, "moe_router_topk": model.moe_topk}
    return TransformerConfig(
        num_layers=model.num_layers, hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads, num_query_groups=model.num_query_groups,
        ffn_hidden_size=model.ffn_size, gated_linear_unit=model.gated_linear_unit,
        add_bias_linear=model.add_bias_linear,
        tensor_model_parallel_size=s.tp, pipeline_model_parallel_size=s.pp,
        virtual_pipeline_model_parallel_size=s.vpp if s.vpp > 1 else None,
        context_parallel_size=s.cp, expert_model_parallel_size=s.ep,
        sequence_parallel=s.sequence_parallel, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, moe_grouped_gemm=bool(moe) and s.impl == "te",
        **recompute, **moe, **split, **offload)


def megatron_verdict(model: ModelSpec, s: Layout, gpus: int) -> str | None:
    """None when megatron-core accepts the layout, else its error message."""
    try:
        _world(gpus)
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=s.tp, pipeline_model_parallel_size=s.pp,
            virtual_pipeline_model_parallel_size=s.vpp if s.vpp > 1 else None,
            context_parallel_size=s.cp, expert_model_parallel_size=s.ep,
            create_gloo_process_groups=False)
        config = _transformer_config(model, s)
        for pp_rank in range(s.pp):
            for stage in range(s.vpp) if s.vpp > 1 else [None]:
                get_num_layers_to_build(config, vp_stage=stage, pp_rank=pp_rank)
        dp = parallel_state.get_data_parallel_world_size()
        ConstantNumMicroBatchesCalculator(s.gbs, s.mbs, dp, False, 0)
        if s.impl in ("local", "sdpa"):  # both use the local spec's attention wiring
            # As megatron/core/transformer/attention.py builds it: with fewer KV groups than
            # tp ranks, the core attention sees one group per rank.
            core_config = copy.deepcopy(config)
            if core_config.num_query_groups < s.tp:
                core_config.num_query_groups = s.tp
            DotProductAttention(core_config, layer_number=1,
                                attn_mask_type=AttnMaskType.causal, attention_type="self")
    except (AssertionError, ValueError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _layout(model: ModelSpec, gpus: int, **fields: Any) -> Layout:
    inner = fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1)
    fields.setdefault("gbs", model.global_batch_size)
    return Layout(dp=max(1, gpus // inner), **fields)


# model, gpus, fields, whether megatron-core accepts it
TABLE = [
    ("gpt2-xl", 8, dict(mbs=4), True),
    ("gpt2-xl", 8, dict(tp=2), False),            # 25 heads
    ("gpt2-xl", 6, dict(pp=4), False),            # 4 does not divide 6
    ("gpt2-large", 8, dict(pp=8), False),         # 36 layers
    ("gpt2-large", 8, dict(pp=4, vpp=2), False),  # 9 layers per stage
    ("gpt2-large", 4, dict(pp=2, vpp=2), True),
    ("gpt2-large", 2, dict(sequence_parallel=True), False),
    ("gpt2-large", 4, dict(tp=2, sequence_parallel=True), True),
    ("gpt2-large", 2, dict(cp=2, impl="local"), False),
    ("gpt2-large", 2, dict(cp=2, impl="te"), True),
    ("gpt2-xl", 8, dict(mbs=16), False),          # 16 x 8 > 64
    ("gpt2-xl", 2, dict(ep=2), False),            # dense model
    ("tiny-moe", 8, dict(ep=4), True),
    ("tiny-moe", 8, dict(tp=2, pp=2, ep=4), False),  # 2 x 4 x 2 = 16 > 8 GPUs
    ("llama3-8b", 8, dict(tp=8), True),
    ("llama3-70b", 16, dict(tp=16), True),        # megatron-core allows it; Alpa's rule does not
    ("gpt2-xl", 8, dict(recompute="full", recompute_num_layers=1), True),
    ("gpt2-xl", 8, dict(pp=2, recompute="full", recompute_method="block",
                        recompute_num_layers=30), True),
    # Uneven pipeline splits (TransformerConfig.__post_init__, "Uneven PP").
    ("gpt-3.6b", 2, dict(pp=2, first_stage_layers=14), True),
    ("gpt-3.6b", 2, dict(pp=2, first_stage_layers=14, last_stage_layers=16), True),
    ("gpt-3.6b", 2, dict(pp=2, first_stage_layers=14, last_stage_layers=14), False),
    ("gpt-3.6b", 4, dict(pp=4, first_stage_layers=6, last_stage_layers=6), True),  # 30 layers
    ("gpt-3.6b", 4, dict(pp=4, first_stage_layers=7), False),   # 23 over 3 stages
    ("gpt2-xl", 4, dict(pp=4, vpp=2, first_stage_layers=10, last_stage_layers=10), True),
    ("gpt2-xl", 4, dict(pp=4, vpp=2, first_stage_layers=9, last_stage_layers=13), False),
    ("gpt2-xl", 4, dict(pp=4, vpp=2, first_stage_layers=10), False),  # 38 over 3 stages
    # Selective recompute's modules.
    ("gpt2-xl", 1, dict(recompute="selective", recompute_modules="core_attn+layernorm+mlp"),
     True),
    ("tiny-moe", 8, dict(ep=4, recompute="selective", recompute_modules="moe_act"), False),
    ("tiny-moe", 8, dict(ep=4, recompute="selective", recompute_modules="moe_act",
                         impl="te"), True),
    # Layer-level CPU offloading (TransformerConfig.__post_init__).
    ("gpt2-xl", 1, dict(offload_layers=8, impl="te"), True),
    ("gpt2-xl", 2, dict(pp=2, offload_layers=8, impl="te"), False),
    ("gpt2-xl", 1, dict(offload_layers=8, impl="te", recompute="selective"), False),
    ("gpt2-xl", 1, dict(offload_layers=48, impl="te"), False),
]


def _model(name: str) -> ModelSpec:
    return TINY_MOE if name == "tiny-moe" else load_model(name)


@pytest.mark.parametrize(("name", "gpus", "fields", "accepted"), TABLE)
def test_table_agrees_with_megatron(name: str, gpus: int, fields: dict[str, Any],
                                    accepted: bool) -> None:
    model = _model(name)
    s = _layout(model, gpus, **fields)
    verdict = megatron_verdict(model, s, gpus)
    assert (verdict is None) == accepted, verdict
    if verdict is not None:
        assert check(s, model, cluster(gpus, gpus_per_node=8)), (
            f"megatron-core rejects {s.describe()} ({verdict}) but autotune accepts it")


def _random_layouts(count: int, seed: int) -> list[tuple[str, int, Layout]]:
    rng = random.Random(seed)
    names = ["gpt2", "gpt2-large", "gpt2-xl", "gpt-1.7b", "llama3-8b", "tiny-moe"]
    out = []
    for _ in range(count):
        name = rng.choice(names)
        model = _model(name)
        gpus = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
        fields = dict(
            tp=rng.choice([1, 2, 3, 4, 8]), pp=rng.choice([1, 2, 3, 4, 6, 8]),
            cp=rng.choice([1, 1, 2, 4]), ep=rng.choice([1, 1, 2, 4, 8]),
            vpp=rng.choice([1, 1, 2, 3, 4]), mbs=rng.choice([1, 2, 4, 8, 16]),
            sequence_parallel=rng.random() < 0.4,
            recompute=rng.choice(["none", "selective", "full"]),
            recompute_method=rng.choice(["uniform", "block"]),
            recompute_num_layers=rng.choice([1, 2, 4, 40]),
            impl=rng.choice(["local", "sdpa", "te"]),
            gbs=rng.choice([model.global_batch_size, 48, 96]),
            first_stage_layers=rng.choice([0, 0, 1, 2, 3, 5, 8]),
            last_stage_layers=rng.choice([0, 0, 1, 2, 4, 7]),
            recompute_modules=rng.choice(["core_attn", "mlp", "layernorm+mlp", "moe_act",
                                          "core_attn+moe"]),
            offload_layers=rng.choice([0, 0, 0, 1, 4, 40]),
        )
        out.append((name, gpus, _layout(model, gpus, **fields)))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_random_layouts_never_accepted_when_megatron_rejects(seed: int) -> None:
    disagreements = []
    rejected = 0
    for name, gpus, s in _random_layouts(150, seed):
        model = _model(name)
        verdict = megatron_verdict(model, s, gpus)
        if verdict is None:
            continue
        rejected += 1
        per_node = gpus if gpus <= 8 else (8 if gpus % 8 == 0 else 4)
        if not check(s, model, cluster(gpus, gpus_per_node=per_node)):
            disagreements.append(f"{name} on {gpus}: {s.describe()} -> {verdict}")
    assert rejected > 30  # the sample must exercise megatron-core's checks
    assert not disagreements, "\n".join(disagreements)


def teardown_module() -> None:
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
