"""The memory per layer not recomputed (issue 28; the slope search/ladder.py extrapolates along):
what a RoPE layer keeps of its query, key and value, counted in megatron-core and measured.

results/benchmarks/2026-11-27-cpu-activation-slope.md has the figures before and after."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doubles.requirements import require_torch_and_megatron_core

from autotune.levers.recompute import module_savings
from autotune.levers.transformer_impl import attention_bytes
from autotune.specs.activations import layer_activations, qkv_extra, rope_table_bytes
from autotune.specs.presets import load_model
from tools.recompute_slopes import Series, series_slopes

ROOT = Path(__file__).resolve().parents[1]

# -- what megatron-core 0.16.1 keeps of Q, K and V ------------------------------------------

# Bytes per token beyond Section 4.1's Q, K, V (2h, 2kv, 2kv); h = heads x head_dim on the rank,
# kv = head_dim x the rank's key/value groups. llama2-13b: MHA, h 5120. llama3-8b: GQA, h 4096,
# kv 1024. Transformer Engine copies the three into a layout of its own; local and sdpa keep the
# value's view of the QKV GEMM output beside RoPE's new query and key (MHA), or the key and value
# repeated per head (GQA); a checkpointed core attention keeps its inputs: the query, RoPE's key
# and the value's view.
QKV_EXTRA = [
    # (model, impl, tp, checkpointed, bytes per token)
    ("llama2-13b", "sdpa", 1, False, 2 * 5120 + 2 * 5120),          # 2h + 2kv = 4h
    ("llama2-13b", "local", 1, False, 2 * 5120 + 2 * 5120),
    ("llama2-13b", "te", 1, False, 0),
    ("llama2-13b", "te", 1, True, 2 * 5120 + 2 * 5120),
    ("llama2-13b", "sdpa", 2, False, (2 * 5120 + 2 * 5120) / 2),    # per rank
    ("llama3-8b", "sdpa", 1, False, 4 * 4096 - 4 * 1024),           # 4h - 4kv
    ("llama3-8b", "local", 1, False, 4 * 4096 - 4 * 1024),
    ("llama3-8b", "te", 1, False, 0),
    ("llama3-8b", "sdpa", 1, True, 2 * 4096 + 2 * 1024),            # 2h + 2kv
    ("llama3-8b", "sdpa", 2, False, (4 * 4096 - 4 * 1024) / 2),
    # tp 16 > 8 groups: each rank gathers the whole GEMM output (2 (h + 2 g d) = 12288) and
    # slices its group out; repeated per head nothing of it is kept: 3 q - (q + 2 kv), q 512,
    # kv 256.
    ("llama3-8b", "sdpa", 16, False, 3 * 512 - (512 + 2 * 256)),
    ("llama3-8b", "sdpa", 16, True, 512 + 256 + 12288 - (512 + 2 * 256)),
    # Without RoPE, Q, K and V are views of the GEMM output: what Section 4.1 counts.
    ("gpt2-xl", "sdpa", 1, False, 0),
    ("gpt2-xl", "sdpa", 5, False, 0),
    ("gpt2-xl", "local", 1, True, 0),
    ("gpt2-xl", "te", 1, True, 0),
]

# With the query and key norms (qk_layernorm, Qwen3): each saves its input and an fp32 rstd
# (RMSNorm; LayerNorm a mean too) per head. Torch's norms (sdpa, local) save the key's view,
# which keeps the QKV GEMM output alive, and the query's reshape copy where several groups
# sit on the rank; TE's copy both contiguous. llama3-8b: q 8192 B, kv 2048 B, GEMM output
# 2 (4096 + 2048) = 12288 B per token at tp 1; rstd 4 (32 + 8) = 160.
QK_NORM_EXTRA = [
    ("llama3-8b", "sdpa", 1, False, 4 * 4096 - 4 * 1024 + 12288 + 8192 + 160),
    ("llama3-8b", "sdpa", 1, True, 2 * 4096 + 2 * 1024 + 8192 + 160),
    ("llama3-8b", "te", 1, False, 8192 + 2048 + 160),
    ("llama3-8b", "te", 1, True, 2 * 4096 + 2 * 1024 + 8192 + 2048 + 160),
    # 8 groups on 8 ranks: one group each, the query's reshape is a view.
    ("llama3-8b", "sdpa", 8, False, (4 * 4096 - 4 * 1024) / 8 + 12288 / 8 + 4 * (4 + 1)),
    # MHA: the norms' inputs are views of the GEMM output already kept; their rstd only.
    ("llama2-13b", "sdpa", 1, False, 2 * 5120 + 2 * 5120 + 4 * 80),
    # Without RoPE the norms' outputs are the query and key attention keeps (new tensors), and
    # LayerNorm saves a mean beside the rstd: 2h + 2h + 8 (25 + 25).
    ("gpt2-xl", "sdpa", 1, False, 2 * 1600 + 2 * 1600 + 8 * 50),
]


@pytest.mark.parametrize(("name", "impl", "tp", "checkpointed", "expected"), QK_NORM_EXTRA)
def test_query_and_key_norms_keep_their_inputs(name: str, impl: str, tp: int,
                                               checkpointed: bool, expected: float) -> None:
    model = dataclasses.replace(load_model(name), qk_layernorm=True)
    assert qkv_extra(model, tp, attention_bytes(model, impl),
                     checkpointed=checkpointed) == pytest.approx(expected)


@pytest.mark.parametrize(("name", "impl", "tp", "checkpointed", "expected"), QKV_EXTRA)
def test_qkv_kept_beyond_the_paper(name: str, impl: str, tp: int, checkpointed: bool,
                                   expected: float) -> None:
    model = load_model(name)
    assert qkv_extra(model, tp, attention_bytes(model, impl),
                     checkpointed=checkpointed) == pytest.approx(expected)


@pytest.mark.parametrize(("name", "tp"), [("gpt2-xl", 1), ("gpt2-xl", 5), ("gpt2-large", 1),
                                          ("gpt2-large", 4), ("gpt-3.6b", 1), ("gpt-3.6b", 2)])
@pytest.mark.parametrize("impl", ["local", "sdpa", "te"])
def test_a_gelu_model_is_unchanged(name: str, impl: str, tp: int) -> None:
    # Learned positions: Q, K and V stay views of the QKV GEMM's output, and no RoPE tables.
    model = load_model(name)
    acts = layer_activations(model, tp, attention_bytes(model, impl))
    assert acts.qkv_extra == 0 and acts.per_position == 0 and rope_table_bytes(model) == 0
    assert acts.attn_recomputable == attention_bytes(model, impl).saved_per_head \
        * model.num_attention_heads / tp


def test_rope_tables_per_position() -> None:
    # cos and sin, [s, 1, 1, 128] bf16, once for the query and once for the key.
    assert rope_table_bytes(load_model("llama2-13b")) == 4 * 2 * 128
    assert rope_table_bytes(load_model("gpt2-xl")) == 0


def test_core_attn_recompute_keeps_the_value_view_with_te() -> None:
    # llama3-8b with Transformer Engine: core_attn's checkpoint frees the log-sum-exp (4 B a
    # head) but keeps RoPE's key (2 kv) and the value's view of the GEMM output (2h + 4kv)
    # where TE alone keeps a copy of the value (2 kv): 2h + 2kv more, so it stores more than
    # no recompute. With sdpa it still frees some: the repeated key and value (4h) go.
    model = load_model("llama3-8b")
    h, kv, lse = 4096 * 2, 1024 * 2, 4 * 32

    def freed(impl: str) -> float:
        acts = layer_activations(model, 1, attention_bytes(model, impl))
        return module_savings(acts, ("core_attn",), seq=8192, tp=1, sequence_parallel=False)

    assert freed("te") == pytest.approx(lse - (h + kv))
    assert freed("sdpa") == pytest.approx(lse + (2 * h - 2 * kv) - (h + kv))


# -- the slope against the measured series -----------------------------------------------------

SERIES = {(s.family, s.gpu, s.layout): s for s in series_slopes()}

# (family, GPU, layout, measured allocated GiB per layer not recomputed): every series of
# tests/data/measured_trials.json whose trials differ only in recompute_num_layers. The model's
# peak allocated slope is within 2% of each (it was 9-12% low on every RoPE series, the same
# on GELU ones); the device memory's within 10% (the allocator's reserve varies by trial).
SLOPES = [
    ("gpt-3.6b", "h100-80gb", "seq 2048 tp1 pp1 dp1 mbs1 rc=full(block/n) sdpa", 0.185),
    ("gpt-3.6b", "h100-80gb", "seq 2048 tp1 pp1 dp1 mbs2 rc=full(block/n) sdpa", 0.376),
    ("gpt2-xl", "h100-80gb", "seq 16384 tp1 pp1 dp1 mbs1 rc=full(block/n) sdpa", 0.783),
    ("gpt2-xl", "h100-80gb", "seq 32768 tp1 pp1 dp1 mbs1 rc=full(block/n) sdpa", 1.570),
    ("llama-3b", "h100-80gb", "seq 8192 tp1 pp1 dp1 mbs1 rc=full(block/n) sdpa", 0.711),
    ("llama2-13b", "h200", "seq 4096 tp1 pp2 dp1 mbs1 rc=full(block/n) sdpa", 1.345),
    ("llama2-13b", "h200", "seq 4096 tp1 pp2 dp1 mbs2 rc=full(block/n) sdpa", 2.670),
    ("llama2-13b", "h200", "seq 4096 tp1 pp2 dp1 vpp2 mbs1 rc=full(block/n) sdpa", 3.356),
    ("llama3-8b", "h200", "seq 8192 tp1 pp1 dp2 mbs1 rc=full(block/n) do ogr opg sdpa", 1.103),
    # Session 19 on 4 x H200, TE with FP8 tensorwise: predicted 1.729 (4.3% high) until the
    # projection saved its original bf16 input instead of an FP8 copy (megatron-core 0.16.1
    # attention.py set_save_original_input; autotune.levers.fp8): 1.666 now.
    ("llama3-8b", "h200",
     "seq 8192 tp1 pp1 dp4 mbs2 rc=full(block/n) do ogr opg fp8=hybrid/tensorwise fp8pg te",
     1.658),
    # Session 22 on one H200: Qwen3-4B (kv_channels 128 x 32 heads over hidden 2,560, QK
    # norm under TE), FP8 delayed, block/16 and block/9 of the default search.
    ("qwen3-4b", "h200", "seq 4096 tp1 pp1 dp1 mbs4 rc=full(block/n) fp8=hybrid te", 1.437),
    # Session 25 on one H200 with expandable segments, warm grids near the capacity
    # (2026-11-29-h200-xseg-band-s25.md): Llama-3.2-3B block/10 and /12, llama-1b at seq
    # 65536 block/4 and /6, Qwen3-4B block/8 and /10. Out of sample: 0.3%, 0.7%, 0.2% high.
    ("llama-3b", "h200", "seq 8192 tp1 pp1 dp1 mbs4 rc=full(block/n) te xseg", 2.566),
    ("llama-1b", "h200", "seq 65536 tp1 pp1 dp1 mbs1 rc=full(block/n) te xseg", 4.383),
    ("qwen3-4b", "h200", "seq 4096 tp1 pp1 dp1 mbs4 rc=full(block/n) te xseg", 1.598),
    # Session 26 on 4 x H200: the default search's block/11 and block/4 (s26-l8b4-search/22,
    # /23), FP8 delayed with fp8pg, expandable segments. Out of sample: 0.4% high.
    ("llama3-8b", "h200",
     "seq 8192 tp1 pp1 dp4 mbs2 rc=full(block/n) do ogr opg fp8=hybrid fp8pg te xseg", 1.721),
    # Session 26 on one H200: the default search's block/11 and block/8 at mbs 8 (s26-l3b8-search
    # /14, /15), FP8 delayed, expandable segments. Out of sample: 0.2% high (device: 1.7% low).
    ("llama-3b", "h200", "seq 4096 tp1 pp1 dp1 mbs8 rc=full(block/n) fp8=hybrid te xseg", 2.222),
]
# Series whose device-memory slope misses the model's by more than 10% although the allocated
# slope is right, with the measured device GiB per layer and why.
USED_SLOPE_MISSES: dict[tuple[str, str, str], tuple[float, str]] = {
    # block/4 filled the device (140.39 of 140.4 GiB in use): NVML's figure beyond the
    # allocator's reserve is 7.6 GiB there against 5.0 at block/11 (reserve over allocated
    # 1.2 GiB at both), memory outside torch's allocator that grew with the peak; which
    # library's is not known. The model's device slope is 1.746 (16.5% under).
    ("llama3-8b", "h200",
     "seq 8192 tp1 pp1 dp4 mbs2 rc=full(block/n) do ogr opg fp8=hybrid fp8pg te xseg"):
        (2.092, "memory outside the allocator grew at the device's capacity"),
}
MIXED_STAGES = [
    # block/8 and block/10: the predicted peak moves to the last stage at block/10 (every layer
    # of a chunk recomputed), so two counts mix two stages' slopes (5.998 measured, 6.68
    # predicted); each trial's peak allocated is within 0.7%.
    ("llama2-13b", "h200", "seq 4096 tp1 pp2 dp1 vpp2 mbs2 rc=full(block/n) sdpa"),
]


def test_the_tables_cover_every_series() -> None:
    assert set(SERIES) == {row[:3] for row in SLOPES} | set(MIXED_STAGES)


@pytest.mark.parametrize(("family", "gpu", "layout", "measured"), SLOPES,
                         ids=[f"{r[0]}-{r[2]}" for r in SLOPES])
def test_the_predicted_slope_is_the_measured_one(family: str, gpu: str, layout: str,
                                                 measured: float) -> None:
    s: Series = SERIES[(family, gpu, layout)]
    assert s.one_stage
    assert s.allocated == pytest.approx(measured, abs=0.001)
    assert s.predicted_allocated == pytest.approx(s.allocated, rel=0.02)
    miss = USED_SLOPE_MISSES.get((family, gpu, layout))
    if miss is None:
        assert s.predicted == pytest.approx(s.used, rel=0.10)
    else:
        assert s.used == pytest.approx(miss[0], abs=0.001), miss[1]
        assert s.predicted != pytest.approx(s.used, rel=0.10), "fixed: leave USED_SLOPE_MISSES"


@pytest.mark.parametrize(("family", "gpu", "layout"), MIXED_STAGES)
def test_a_series_across_two_stages_is_left_out(family: str, gpu: str, layout: str) -> None:
    assert not SERIES[(family, gpu, layout)].one_stage


# -- the count itself: one megatron-core layer on CPU -------------------------------------------


QWEN3 = str(ROOT / "tests" / "data" / "hf" / "qwen3-8b.json")


@pytest.mark.slow
@pytest.mark.megatron
@pytest.mark.parametrize(("args", "models"), [
    # The presets' head_dim, GQA and FFN ratios at 1/8 and 1/5 of their widths, mbs 1 and 2.
    ([], ["llama2-13b/8"] * 2 + ["llama3-8b/8"] * 2 + ["gpt2-xl/5"] * 2),
    # q_layernorm and k_layernorm on (Qwen3's): one group per rank (the query a view), two
    # (the query's reshape copied) and MHA.
    (["--qk-layernorm", "--model", QWEN3, "--heads-divisor", "8", "--model", QWEN3,
      "--heads-divisor", "4", "--model", "llama2-13b", "--heads-divisor", "8", "--mbs", "1"],
     ["Qwen3-8B/8", "Qwen3-8B/4", "llama2-13b/8"]),
    # Multi-Latent Attention (DeepSeek-V2-Lite's and V2's attention on 2 heads): with and
    # without the query's latent and the latent norms (tools/saved_tensors.py mla_models).
    (["--mla", "--mbs", "1"], ["v2-lite-attention/8", "v2-attention/8",
                               "v2-lite-attention/8 no norms", "v2-attention/8 no norms"]),
    # The same under selective recompute of MLA's up projections (an output-discarding
    # checkpoint: the query, key and value emptied, RoPE's tables for its frequencies), with
    # core attention's checkpoint and two micro-batch sizes (per token and per position).
    (["--mla", "--mbs", "1", "--mbs", "2", "--recompute-modules", "mla_up_proj"],
     [m for m in ("v2-lite-attention/8", "v2-attention/8", "v2-lite-attention/8 no norms",
                  "v2-attention/8 no norms") for _ in (1, 2)]),
    (["--mla", "--mbs", "1", "--recompute-modules", "core_attn+mla_up_proj"],
     ["v2-lite-attention/8", "v2-attention/8", "v2-lite-attention/8 no norms",
      "v2-attention/8 no norms"]),
], ids=["presets", "qk-layernorm", "mla", "mla-up-proj", "core-attn-mla-up-proj"])
def test_megatron_core_keeps_what_the_model_counts(args: list[str], models: list[str]) -> None:
    # tools/saved_tensors.py builds one layer as the worker does (sdpa) and adds up every
    # storage its forward saves for backward. The model's count is within 0.1% (the norms'
    # fp32 rstd and mean); it was 13-15% short for the RoPE models at seq 256 before qkv_extra
    # and the RoPE tables, and 7.8% short for Qwen3 before the query and key norms' inputs.
    # MLA's latents (mla_latent_bytes) are 8-38% of what these layers keep (2 of 16 heads).
    require_torch_and_megatron_core()
    out = subprocess.run([sys.executable, "tools/saved_tensors.py", "--json", *args],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["model"] for r in rows] == models
    for r in rows:
        assert r["modelled"] == pytest.approx(r["counted"], rel=0.001), r


def test_megatron_core_frees_what_the_model_says_of_the_shared_expert() -> None:
    # tools/saved_tensors.py --moe: an MoE layer with a shared expert (and one with its gate),
    # counted through the allgather dispatcher (alltoall's needs CUDA), so the layer's total is
    # not the model's; what the checkpoint of the shared expert frees (moe_layer.py) is, to the
    # byte: 2304 B/token without the gate, 2818 with it.
    require_torch_and_megatron_core()
    counts = {}
    for chosen in ("", "shared_experts"):
        args = ["--moe", "--mbs", "1"] + (["--recompute-modules", chosen] if chosen else [])
        out = subprocess.run([sys.executable, "tools/saved_tensors.py", "--json", *args],
                             cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        counts[chosen] = json.loads(out.stdout.strip().splitlines()[-1])
    freed = []
    for before, after in zip(counts[""], counts["shared_experts"], strict=True):
        assert before["model"] == after["model"]
        counted = (before["counted"] - after["counted"]) / 256
        modelled = (before["modelled"] - after["modelled"]) / 256
        assert modelled == pytest.approx(counted, rel=1e-9), (before, after)
        freed.append(counted)
    assert freed == [2304, 2818]
