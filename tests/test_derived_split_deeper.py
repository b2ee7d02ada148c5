"""The derived pipeline split judged at the complete layout: the splits that tie at pp's level
(joint_candidates) are kept, and each valid layout of the enumeration holds the split of least
predicted step among megatron-core's splits that fit for its other fields (best_split), held
here against a brute force over every split split_choices lists."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autotune.layouts.layout import Layout, check, with_fields
from autotune.levers.pipeline_split import split_choices, stage_layers
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.search.derive import PACE_TIE, best_split, joint_candidates, safe_limit_bytes
from autotune.search.space import enumerate_space, load_space, space_from_mapping
from autotune.specs.hardware import ClusterSpec
from autotune.specs.hf_config import read_hf_config
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model

HF = Path(__file__).parent / "data" / "hf"
DGX = Path(__file__).parent.parent / "search_spaces" / "clusters" / "dgx-h100.yaml"
SPLIT = ("first_stage_layers", "last_stage_layers", "embedding_loss_split")
ALL_FREE = frozenset(SPLIT)


def _deepseek_v3(mtp: int = 1) -> ModelSpec:
    # Session 23's plan: sequence 4096, batch 4096; its config.json trains one MTP layer.
    spec = read_hf_config(str(HF / "deepseek-v3.json")).spec
    return dataclasses.replace(spec, seq_length=4096, global_batch_size=4096,
                               mtp_num_layers=mtp)


def _llama(vocab: int | None = None) -> ModelSpec:
    model = load_model("llama3-8b")
    return model if vocab is None else dataclasses.replace(model, vocab_size=vocab)


def _narrow(**fields: tuple[Any, ...]) -> dict[str, list[Any]]:
    """The default space (the split derived) with the given dimensions narrowed."""
    candidates = {d: list(v) for d, v in load_space().candidates.items()}
    candidates.update({d: list(v) for d, v in fields.items()})
    return candidates


# DeepSeek-V3's plan on 1,024 H100 (tp 1, pp 16, ep 8, full recompute, the distributed
# optimizer), its deeper fields over the values the default space offers that move the split:
# the micro-batch, FP8 and FP8 parameter gathering, the overlapped parameter gather.
_DSV3_PLAN = dict(tp=(1,), pp=(16,), cp=(1,), vpp=(1,), ep=(1, 8), sequence_parallel=(False,),
                  mbs=(1, 2, 4), recompute=("full",), recompute_method=("uniform",),
                  distributed_optimizer=(True,), overlap_param_gather=(False, True),
                  impl=("te",), fp8=("off", "hybrid"), fp8_recipe=("delayed",))
# llama3-8b on 8 GPUs at pp 2 and 4: 32 layers, which both divide.
_LLAMA_PLAN = dict(tp=(1, 2, 4), pp=(2, 4), cp=(1,), vpp=(1, 2), ep=(1,), mbs=(1, 2, 4),
                   recompute=("none", "full"), recompute_method=("uniform",),
                   distributed_optimizer=(True,), overlap_param_gather=(True,), impl=("te",),
                   fp8=("off", "hybrid"), fp8_recipe=("delayed",), fp8_param_gather=(False,))

CASES = [
    ("dsv3-mtp", lambda: _deepseek_v3(), 1024, _DSV3_PLAN),
    ("dsv3-no-mtp", lambda: _deepseek_v3(0), 1024, _DSV3_PLAN),
    ("llama3-8b", _llama, 8, _LLAMA_PLAN),
    ("1m-vocab", lambda: _llama(2 ** 20), 8, _LLAMA_PLAN),
]


def _fitting_options(s: Layout, model: ModelSpec, cluster: ClusterSpec,
                     limit: float) -> list[tuple[float, Layout]]:
    """(step, layout) of `s` with every split split_choices lists for its other fields that
    passes every rule and is predicted to fit."""
    options = []
    for choice in split_choices(s, model, ALL_FREE):
        other = with_fields(s, **choice)
        if check(other, model, cluster) or \
                estimate_memory(model, other, cluster).peak_bytes > limit:
            continue
        options.append((estimate_cost(model, other, cluster).step_time_s, other))
    return options


def _plan(name: str, make: Any, gpus: int, fields: dict[str, tuple[Any, ...]]
          ) -> tuple[ModelSpec, ClusterSpec, Callable[[Layout], float], list[Layout]]:
    """The model, the cluster, each layout's limit (the gate's band is its allocator's) and
    the valid layouts."""
    model = make()
    cluster = ClusterSpec.make(gpus, gpu=str(DGX))
    summary = enumerate_space(space_from_mapping(_narrow(**fields), name), model, cluster)

    def limit_of(s: Layout) -> float:
        return safe_limit_bytes(cluster, expandable=s.expandable_segments)

    return model, cluster, limit_of, summary.valid


@pytest.mark.parametrize(("name", "make", "gpus", "fields"), CASES[:2],
                         ids=[case[0] for case in CASES[:2]])
def test_every_layout_holds_the_fastest_fitting_split_for_its_other_fields(
        name: str, make: Any, gpus: int, fields: dict[str, tuple[Any, ...]]) -> None:
    """DeepSeek-V3 at pp 16 over ep, the micro-batch, FP8 and the parameter gather: each
    valid layout that some split lets fit holds a split that fits, and none of megatron-core's
    splits for its other fields is predicted faster."""
    model, cluster, limit_of, valid = _plan(name, make, gpus, fields)
    judged = 0
    for s in valid:
        assert not check(s, model, cluster), s.describe()
        fitting = _fitting_options(s, model, cluster, limit_of(s))
        if not fitting:
            continue
        judged += 1
        assert estimate_memory(model, s, cluster).peak_bytes <= limit_of(s), s.describe()
        step = estimate_cost(model, s, cluster).step_time_s
        assert step <= min(f[0] for f in fitting) * (1 + PACE_TIE), s.describe()
    assert judged >= 10, "too few layouts fit: the case tests little"


@pytest.mark.parametrize(("name", "make", "gpus", "fields"), CASES,
                         ids=[case[0] for case in CASES])
def test_the_planned_layout_holds_the_fastest_fitting_split(
        name: str, make: Any, gpus: int, fields: dict[str, tuple[Any, ...]]) -> None:
    """The layout a plan ranks first (the most predicted tokens/s among those that fit)
    holds the fastest fitting split of every split megatron-core accepts for its other
    fields; llama3-8b, which pp divides, the even split unless another is faster (a 1M
    vocabulary: an uneven one, fewer layers on the last stage)."""
    model, cluster, limit_of, valid = _plan(name, make, gpus, fields)
    fitting = [s for s in valid
               if estimate_memory(model, s, cluster).peak_bytes <= limit_of(s)]
    top = max(fitting, key=lambda s: estimate_cost(model, s, cluster).tokens_per_s)
    options = _fitting_options(top, model, cluster, limit_of(top))
    fastest = min(step for step, _ in options)
    assert estimate_cost(model, top, cluster).step_time_s <= fastest * (1 + PACE_TIE)
    even = [step for step, s in options if not s.uneven]
    if top.pp > 1 and even and not top.uneven:
        assert even[0] <= fastest * (1 + PACE_TIE)
    if name == "1m-vocab":
        counts = stage_layers(top, model)
        assert top.uneven and counts[-1] < max(counts), top.describe()


def test_deepseek_v3_with_mtp_plans_one_layer_on_its_last_stage() -> None:
    """The plan's layout (tp1 pp16 dp64 ep8 mbs2 rc=full do opg fp8=hybrid fp8pg te): of the
    4 splits megatron-core takes for 61 layers at pp 16, 4 + 14 x 4 + 1 layers is predicted
    fastest (the MTP layer and its logits on the last stage, one MoE layer beside them); the
    level's defaults tie it with 3 + 14 x 4 + 2, which resolve_joint alone takes."""
    model = _deepseek_v3()
    cluster = ClusterSpec.make(1024, gpu=str(DGX))
    limit = safe_limit_bytes(cluster)
    fields = {d: (v,) for d, v in dict(
        tp=1, pp=16, cp=1, vpp=1, ep=8, sequence_parallel=False, mbs=2, recompute="full",
        recompute_method="uniform", distributed_optimizer=True, overlap_param_gather=True,
        impl="te", fp8="hybrid", fp8_recipe="delayed", fp8_param_gather=True).items()}
    summary = enumerate_space(space_from_mapping(_narrow(**fields), "plan"), model, cluster)
    (planned,) = summary.valid
    options = _fitting_options(planned, model, cluster, safe_limit_bytes(
        cluster, expandable=planned.expandable_segments))
    assert planned == min(options, key=lambda o: o[0])[1]
    assert stage_layers(planned, model) == (4, *(4,) * 14, 1)
    level = Layout(gbs=4096, tp=1, pp=16, dp=64)
    kept = joint_candidates(level, SPLIT, model, cluster, limit_bytes=limit)
    # The two that tie on the pace, and the one of least peak there (1 layer on the first).
    assert [stage_layers(c, model) for c in kept.tied] == [(3, *(4,) * 14, 2),
                                                           (4, *(4,) * 14, 1)]
    assert kept.roomiest is not None
    assert stage_layers(kept.roomiest, model) == (1, *(4,) * 14, 4)


# best_split's order: the fitting one of least step; the least peak where none fits; a
# single layout as it is.
@pytest.mark.parametrize(("limit_gib", "expected"), [
    (1e6, (4, 1)),      # every split fits: the fastest
    (66.0, (4, 1)),     # only 4 + 1 fits (61.6 GiB)
    (1.0, (4, 1)),      # none fits: the least peak
], ids=["all-fit", "one-fits", "none-fits"])
def test_best_split_orders_fit_then_step_then_peak(limit_gib: float,
                                                   expected: tuple[int, int]) -> None:
    model = _deepseek_v3()
    cluster = ClusterSpec.make(1024, gpu=str(DGX))
    s = Layout(gbs=4096, tp=1, pp=16, dp=64, ep=8, mbs=2, recompute="full",
               distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
               impl="te", fp8="hybrid", fp8_param_gather=True)
    layouts = [with_fields(s, **c) for c in split_choices(s, model, ALL_FREE)]
    best = best_split(layouts, model, cluster, limit_bytes=limit_gib * 2 ** 30)
    counts = stage_layers(best, model)
    assert (counts[0], counts[-1]) == expected
    assert best_split(layouts[:1], model, cluster, limit_bytes=0.0) == layouts[0]


@pytest.mark.megatron
@pytest.mark.parametrize(("name", "make", "gpus", "fields"), CASES[:1] + CASES[2:3],
                         ids=["dsv3-mtp", "llama3-8b"])
def test_the_settled_splits_pass_megatron_core(name: str, make: Any, gpus: int,
                                               fields: dict[str, tuple[Any, ...]]) -> None:
    """Every split the enumeration settles on passes megatron-core 0.16.1's
    TransformerConfig, and each rank builds the layers stage_layers gives it."""
    pytest.importorskip("torch")
    block = pytest.importorskip("megatron.core.transformer.transformer_block")
    from megatron.core.transformer.transformer_config import TransformerConfig

    model = make()
    cluster = ClusterSpec.make(gpus, gpu=str(DGX))
    summary = enumerate_space(space_from_mapping(_narrow(**fields), name), model, cluster)
    splits = {(s.pp, s.vpp, s.first_stage_layers, s.last_stage_layers, s.embedding_loss_split)
              for s in summary.valid}
    assert any(first or last for _, _, first, last, _ in splits) or name == "llama3-8b"
    for pp, vpp, first, last, els in sorted(splits):
        config = TransformerConfig(
            num_layers=model.num_layers, hidden_size=64, num_attention_heads=4,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            num_layers_in_first_pipeline_stage=first or None,
            num_layers_in_last_pipeline_stage=last or None,
            account_for_embedding_in_pipeline_split=els,
            account_for_loss_in_pipeline_split=els,
            pipeline_dtype=__import__("torch").bfloat16)
        built = tuple(sum(block.get_num_layers_to_build(
            config, vp_stage=v if vpp > 1 else None, pp_rank=rank) for v in range(vpp))
            for rank in range(pp))
        layout = Layout(pp=pp, vpp=vpp, first_stage_layers=first, last_stage_layers=last,
                        embedding_loss_split=els, gbs=pp * 4)
        assert built == stage_layers(layout, model)
