"""Cross-check autotune's layout rules against the installed megatron-core's own validation.

    python tools/rules_crosscheck.py [--out DIR] [--random N] [--seeds K]

For each layout megatron-core judges it the way a real launch would, as far as one process can:
`parallel_state.initialize_model_parallel` on a fake process group of the job's world size,
`TransformerConfig(...)`, `get_num_layers_to_build` for every pipeline rank and virtual stage,
the constant micro-batch calculator, and the core attention module of the local spec. Whenever
megatron-core rejects a layout, autotune must reject it too (autotune may reject more: Alpa's
tp-inside-a-node rule, for one). Runs on CPU torch; the CPU CI runs it through
tests/test_megatron_crosscheck.py on 0.16.1, and a Python 3.12 machine runs this script for
0.19.x (tools/device_issue29.sh). Writes DIR/rules-crosscheck-<version>.json and .md; exits 1
on a disagreement.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_block import get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.testing._internal.distributed.fake_pg import FakeStore

from autotune.layouts.layout import Layout, check
from autotune.megatron.megatron_versions import config_kwargs, installed_version, running
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model
from autotune.trials.protocol import te_available

TINY_MOE = ModelSpec(name="tiny-moe", num_layers=8, hidden_size=256, num_attention_heads=8,
                     num_query_groups=4, vocab_size=1000, seq_length=512, global_batch_size=32,
                     num_experts=4, moe_topk=2, gated_linear_unit=True, add_bias_linear=False,
                     normalization="RMSNorm", position_embedding="rope")


def model_by_name(name: str) -> ModelSpec:
    return TINY_MOE if name == "tiny-moe" else load_model(name)


def cluster(gpus: int) -> ClusterSpec:
    """The H100 nodes the rules are judged for: one node up to 8 GPUs, else nodes of 8 (or 4
    where 8 does not divide the count)."""
    per_node = gpus if gpus <= 8 else (8 if gpus % 8 == 0 else 4)
    return ClusterSpec(num_gpus=gpus, gpus_per_node=per_node, gpu=gpu_spec("h100-80gb"))


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
             "num_layers_in_last_pipeline_stage": s.last_stage_layers or None,
             "account_for_embedding_in_pipeline_split": s.embedding_loss_split,
             "account_for_loss_in_pipeline_split": s.embedding_loss_split}
    offload = {"cpu_offloading": s.offload_layers > 0,
               "cpu_offloading_num_layers": s.offload_layers}
    fp8 = {"fp8": None if s.fp8 == "off" else str(s.fp8), "fp8_recipe": str(s.fp8_recipe),
           "fp8_param": s.fp8_param_gather}
    moe: dict[str, Any] = {}
    if model.num_experts:
        moe = {"num_moe_experts": model.num_experts, "moe_router_topk": model.moe_topk}
    kwargs = dict(
        num_layers=model.num_layers, hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads, num_query_groups=model.num_query_groups,
        ffn_hidden_size=model.ffn_size, gated_linear_unit=model.gated_linear_unit,
        add_bias_linear=model.add_bias_linear,
        tensor_model_parallel_size=s.tp, pipeline_model_parallel_size=s.pp,
        virtual_pipeline_model_parallel_size=s.vpp if s.vpp > 1 else None,
        context_parallel_size=s.cp, expert_model_parallel_size=s.ep,
        sequence_parallel=s.sequence_parallel, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, moe_grouped_gemm=bool(moe) and s.impl == "te",
        **recompute, **moe, **split, **offload, **fp8)
    return TransformerConfig(**config_kwargs("TransformerConfig", kwargs, running()))


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
        if _asks_missing_te(str(exc)):
            return None
        return f"{type(exc).__name__}: {exc}"
    except TypeError as exc:
        if "Version" not in str(exc):
            raise
        # is_te_min_version without Transformer Engine in megatron-core 0.16.1 (its version
        # None): megatron-core asks TE, not the layout (FP8 recompute of layernorm or moe_act
        # with a current or block scaling recipe), so this machine cannot judge it.
        return None
    return None


_TE_VERSION_ASKED = re.compile(r"(transformer[-_ ]engine|\bTE)( version)? ?(>=|<)",
                               re.IGNORECASE)
"""A rejection that names a Transformer Engine version (`transformer-engine>=1.7.0`,
`TE version >= 2.3.0`, `TE < 2.3.0`: megatron-core's TransformerConfig checks)."""


def _asks_missing_te(message: str) -> bool:
    """megatron-core rejected the layout for the version of a Transformer Engine this machine
    does not have: it judged the machine, not the layout. From 0.19 megatron-core takes a
    missing TE as version 0.0.0 (utils.get_te_version) and says so in a ValueError where 0.16.1
    raised a TypeError (above); with TE installed the rejection stands."""
    return not te_available() and _TE_VERSION_ASKED.search(message) is not None


def layout_for(model: ModelSpec, gpus: int, **fields: Any) -> Layout:
    inner = fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1)
    fields.setdefault("gbs", model.global_batch_size)
    return Layout(dp=max(1, gpus // inner), **fields)


# model, gpus, fields, whether megatron-core accepts it
TABLE: list[tuple[str, int, dict[str, Any], bool]] = [
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
    # The embedding and the loss counted as layers (TransformerConfig.__post_init__): NVIDIA's
    # Llama 3.1 405B recipes (126 layers, pp 8 vpp 8) run this way.
    ("gpt2-xl", 2, dict(pp=2, embedding_loss_split=True), True),           # 50 over 2
    ("gpt2-xl", 2, dict(pp=2, vpp=5, embedding_loss_split=True), True),    # 25 per rank
    ("gpt2-xl", 4, dict(pp=4, embedding_loss_split=True), False),          # 50 over 4
    ("gpt2-xl", 4, dict(pp=2, vpp=2, embedding_loss_split=True), False),   # 25 per rank
    ("gpt2-xl", 2, dict(pp=2, first_stage_layers=20, embedding_loss_split=True), False),
    ("gpt-3.6b", 8, dict(pp=8, vpp=2, embedding_loss_split=True), True),   # 32 over 8
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
    # FP8 (TransformerConfig.__post_init__).
    ("gpt2-xl", 8, dict(mbs=4, impl="te", fp8="hybrid"), True),
    ("gpt2-xl", 8, dict(mbs=4, impl="te", fp8="e4m3", fp8_recipe="tensorwise"), True),
    ("gpt2-xl", 8, dict(mbs=4, impl="te", distributed_optimizer=True, fp8_param_gather=True),
     False),                                      # fp8_param without fp8
    ("tiny-moe", 8, dict(ep=4, impl="te", fp8="hybrid", recompute="selective",
                         recompute_modules="layernorm"), False),  # delayed scaling
]


def random_layouts(count: int, seed: int) -> list[tuple[str, int, Layout]]:
    rng = random.Random(seed)
    names = ["gpt2", "gpt2-large", "gpt2-xl", "gpt-1.7b", "llama3-8b", "tiny-moe"]
    out = []
    for _ in range(count):
        name = rng.choice(names)
        model = model_by_name(name)
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
            fp8=rng.choice(["off", "off", "hybrid", "e4m3"]),
            fp8_recipe=rng.choice(["delayed", "tensorwise"]),
            fp8_param_gather=rng.random() < 0.2,
            embedding_loss_split=rng.random() < 0.2,
        )
        out.append((name, gpus, layout_for(model, gpus, **fields)))
    return out


def crosscheck(random_count: int, seeds: int) -> dict[str, Any]:
    """Every TABLE row and `seeds` x `random_count` random layouts through megatron-core."""
    table = []
    for name, gpus, fields, accepted in TABLE:
        model = model_by_name(name)
        s = layout_for(model, gpus, **fields)
        verdict = megatron_verdict(model, s, gpus)
        table.append({"model": name, "gpus": gpus, "layout": s.describe(),
                      "expected_accepted": accepted, "megatron": verdict,
                      "autotune": "; ".join(v.message for v in check(s, model, cluster(gpus)))
                      or None})
    disagreements, rejected, judged = [], 0, 0
    for seed in range(seeds):
        for name, gpus, s in random_layouts(random_count, seed):
            model = model_by_name(name)
            judged += 1
            verdict = megatron_verdict(model, s, gpus)
            if verdict is None:
                continue
            rejected += 1
            if not check(s, model, cluster(gpus)):
                disagreements.append({"model": name, "gpus": gpus, "layout": s.describe(),
                                      "megatron": verdict})
    table_wrong = [r for r in table if (r["megatron"] is None) != r["expected_accepted"]
                   or (r["megatron"] is not None and not r["autotune"])]
    return {"megatron_core": installed_version(), "table_row": running().version,
            "python": sys.version.split()[0], "torch": torch.__version__,
            "table": table, "table_disagreements": table_wrong,
            "random_judged": judged, "random_rejected_by_megatron": rejected,
            "random_accepted_by_autotune_but_rejected_by_megatron": disagreements,
            "passed": not table_wrong and not disagreements}


def _markdown(report: dict[str, Any]) -> str:
    lines = [f"# Rules cross-check: megatron-core {report['megatron_core']} "
             f"(Python {report['python']}, torch {report['torch']})", "",
             f"Result: {'PASSED' if report['passed'] else 'FAILED'}. Table rows: "
             f"{len(report['table'])}, wrong: {len(report['table_disagreements'])}. "
             f"Random layouts: {report['random_judged']}, rejected by megatron-core: "
             f"{report['random_rejected_by_megatron']}, of those accepted by autotune: "
             f"{len(report['random_accepted_by_autotune_but_rejected_by_megatron'])}.", "",
             "| model | GPUs | layout | expected | megatron-core | autotune |",
             "|---|---|---|---|---|---|"]
    for r in report["table"]:
        lines.append(f"| {r['model']} | {r['gpus']} | {r['layout']} | "
                     f"{'accept' if r['expected_accepted'] else 'reject'} | "
                     f"{(r['megatron'] or 'accepts')[:90]} | "
                     f"{(r['autotune'] or 'accepts')[:60]} |")
    for d in report["random_accepted_by_autotune_but_rejected_by_megatron"]:
        lines.append(f"- DISAGREES: {d['model']} on {d['gpus']}: {d['layout']} -> "
                     f"{d['megatron']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--out", type=Path, default=Path("."))
    cli.add_argument("--random", type=int, default=150, help="random layouts per seed")
    cli.add_argument("--seeds", type=int, default=4)
    args = cli.parse_args()
    warnings.simplefilter("ignore")
    report = crosscheck(args.random, args.seeds)
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"rules-crosscheck-{report['megatron_core']}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    text = _markdown(report)
    (args.out / f"{stem}.md").write_text(text)
    print(text.split("\n\n")[1])
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
