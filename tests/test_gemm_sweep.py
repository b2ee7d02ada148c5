"""tools/gemm_sweep.py's CPU parts (issue 28's GEMM sweep): the shape table against autotune's own
models and FLOP counts, the case list, the statistics, the markdown and the time budget. The
timing itself needs a GPU and is not tested here."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.levers.fp8 import gemm_dims
from autotune.specs.flops import _layer_forward_flops_per_token
from autotune.specs.presets import load_model
from tools import gemm_sweep as gs

ROOT = Path(__file__).resolve().parents[1]
BY_NAME = {f.name: f for f in gs.FAMILIES}
DEVICE = {"device": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "sms": 132, "torch": "2.11"}


def _family_of(trial: dict[str, Any]) -> gs.Family:
    name = trial.get("family") or trial["model"]
    return BY_NAME[name]


@pytest.mark.parametrize("family", gs.FAMILIES, ids=lambda f: f.name)
def test_table_is_the_model_shape(family: gs.Family) -> None:
    spec = load_model(str(ROOT / family.source) if "/" in family.source else family.source)
    assert (family.hidden, family.heads, family.query_groups, family.ffn, family.gated,
            family.kv_channels or family.hidden // family.heads) == (
        spec.hidden_size,
        spec.num_attention_heads,
        spec.query_groups,
        spec.ffn_size,
        spec.gated_linear_unit,
        spec.head_dim,
    )
    for tp in (1, 2, 4):
        # gemm_dims gives (name, input features, weight rows) = (name, k, n) per rank.
        ours = [(g.name, g.k, g.n) for g in gs.layer_gemms(family, 4096, tp)]
        assert ours == gemm_dims(spec, SimpleNamespace(tp=tp))  # type: ignore[arg-type]


@pytest.mark.parametrize("family", gs.FAMILIES, ids=lambda f: f.name)
def test_layer_flops_are_the_cost_models(family: gs.Family) -> None:
    # The four GEMMs' 2 m n k add up to autotune/specs/flops.py's per-token matrix FLOPs of a
    # layer, times the tokens: the sweep times what the cost model prices.
    spec = load_model(str(ROOT / family.source) if "/" in family.source else family.source)
    mats, _ = _layer_forward_flops_per_token(spec)
    tokens = 4096
    total = sum(gs.gemm_flops(g.m, g.n, g.k) for g in gs.layer_gemms(family, tokens))
    assert total == pytest.approx(mats * tokens, rel=1e-12)


def test_every_measured_family_is_in_the_table() -> None:
    trials = json.loads((ROOT / "tests/data/measured_trials.json").read_text())["trials"]
    for t in trials:
        f = _family_of(t)
        spec = load_model(str(ROOT / t["model"]) if "/" in t["model"] else t["model"])
        assert (f.hidden, f.ffn, f.query_groups) == (
            spec.hidden_size,
            spec.ffn_size,
            spec.query_groups,
        ), t["source"]


def test_flops_and_passes() -> None:
    assert gs.gemm_flops(2, 3, 4) == 48
    m, n, k = 4096, 6144, 2048
    assert gs.pass_dims("fwd", m, n, k) == (m, n, k)
    assert gs.pass_dims("dgrad", m, n, k) == (m, k, n)  # dY[m,n] W[n,k]
    assert gs.pass_dims("wgrad", m, n, k) == (n, k, m)  # dY^T[n,m] X[m,k]
    assert {gs.gemm_flops(*gs.pass_dims(p, m, n, k)) for p in gs.PASSES} == {2 * m * n * k}
    with pytest.raises(ValueError):
        gs.pass_dims("bwd", m, n, k)


def test_llama_1b_shapes() -> None:
    g = {x.name: (x.m, x.n, x.k) for x in gs.layer_gemms(BY_NAME["llama-1b"], 16384)}
    # 32 heads of 64 + 2 x 8 KV heads of 64; SwiGLU fc1 = 2 x 8192.
    assert g == {
        "qkv": (16384, 3072, 2048),
        "proj": (16384, 2048, 2048),
        "fc1": (16384, 16384, 2048),
        "fc2": (16384, 2048, 8192),
    }
    # tp 16 > 8 KV groups: one group per rank (megatron-core replicates KV heads).
    qkv = gs.layer_gemms(BY_NAME["llama-1b"], 4096, tp=16)[0]
    assert qkv.n == 2048 // 16 + 2 * 64


def test_cases_default_order_and_merging() -> None:
    cases = gs.build_cases()
    assert [c.name for c in cases[:8]] == [f"square {s}" for s in gs.SQUARE_SIZES]
    square4096 = cases[3]
    assert square4096.labels == ["square 4096", "llama3-8b proj m4096"]
    proj = next(c for c in cases if c.name == "gpt-3.6b proj m4096")
    assert proj.labels == ["gpt-3.6b proj m4096", "llama-3b proj m4096"]
    assert proj.model_x == 3072  # min(tokens, hidden)
    # Every (family, gemm, tokens) is covered exactly once.
    labels = [label for c in cases for label in c.labels]
    assert len(labels) == len(set(labels)) == 8 + len(gs.FAMILIES) * 4 * 2
    assert len({(c.pass_, c.dtype, c.m, c.n, c.k) for c in cases}) == len(cases)
    # 4096 before 16384, so a budget cut takes the second token count last.
    first16k = next(i for i, c in enumerate(cases) if c.name.endswith("m16384"))
    assert not any("m16384" in label for c in cases[:first16k] for label in c.labels)
    assert all(c.pass_ == "fwd" and c.dtype == "bf16" for c in cases)


def test_cases_fp8_forward_only_and_tp_label() -> None:
    cases = gs.build_cases(sizes=[1024], tokens=[4096], passes=gs.PASSES, dtypes=gs.DTYPES, tp=2)
    fp8 = [c for c in cases if c.dtype == "fp8"]
    assert fp8 and all(c.pass_ == "fwd" for c in fp8)
    assert cases.index(fp8[0]) > max(i for i, c in enumerate(cases) if c.dtype == "bf16")
    assert {c.pass_ for c in cases if c.dtype == "bf16"} == set(gs.PASSES)
    assert "gpt2-xl qkv m4096 tp2" in {label for c in cases for label in c.labels}
    with pytest.raises(ValueError):
        gs.build_cases(dtypes=["fp16"])


def test_select_cases_from_the_command_line() -> None:
    args = gs.parse_args(
        ["--sizes", "", "--tokens", "4096", "--families", "wide-8k", "--only", "fc"]
    )
    assert [c.name for c in gs.select_cases(args)] == ["wide-8k fc1 m4096", "wide-8k fc2 m4096"]
    with pytest.raises(SystemExit):
        gs.select_cases(gs.parse_args(["--families", "gpt-5"]))
    with pytest.raises(SystemExit):
        gs.select_cases(gs.parse_args(["--passes", "bwd"]))


def test_dry_run_needs_no_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert gs.main(["--dry-run", "--sizes", "1024", "--tokens", ""]) == 0
    assert "square 1024: bf16 fwd 1024 x 1024 x 1024" in capsys.readouterr().out


def test_summarize() -> None:
    st = gs.summarize([3.0, None, 1.0, math.nan, 2.0, 10.0])
    assert st == gs.Stats(median=2.5, min=1.0, max=10.0, n=4)
    assert gs.summarize([None]) is None
    assert gs.summarize([]) is None


def test_clock_event_reasons() -> None:
    assert gs.reason_names(0) == ()
    assert gs.reason_names(0x4 | 0x40) == ("sw_power_cap", "hw_thermal")
    assert gs.reason_names(0x1000) == ("0x1000",)
    assert gs.reason_shares([0x4, 0x4, 0x0, None, 0x5]) == {"sw_power_cap": 0.75, "gpu_idle": 0.25}
    assert gs.reason_shares([None]) == {}


def test_parse_smi_line() -> None:
    s = gs.parse_smi_line("1755, 699.12, 63, 0x0000000000000004", 1.0)
    assert (s.sm_mhz, s.power_w, s.temp_c, s.reasons, s.power_instant_w) == (
        1755.0,
        699.12,
        63.0,
        4,
        None,
    )
    s = gs.parse_smi_line("[N/A], [N/A], 40, [N/A], 712.5", 2.0, instant=True)
    assert (s.sm_mhz, s.power_w, s.temp_c, s.reasons, s.power_instant_w) == (
        None,
        None,
        40.0,
        None,
        712.5,
    )


def _timing(samples: list[gs.Sample]) -> gs.Timing:
    # 4 batches over 10..12 s, the last two slower (a clock drop in the window's second half).
    return gs.Timing(
        [600.0, 600.0, 500.0, 500.0], [10.0, 10.5, 11.0, 11.5], 400, 10.0, 12.0, samples
    )


def test_summarize_samples_window_and_late_half() -> None:
    samples = [
        gs.Sample(9.0, sm_mhz=1980, power_w=100),  # before the window: left out
        gs.Sample(10.2, sm_mhz=1980, power_w=400, temp_c=50, reasons=0),
        gs.Sample(11.2, sm_mhz=1700, power_w=700, temp_c=60, reasons=4),
        gs.Sample(11.8, sm_mhz=1650, power_w=700, temp_c=61, reasons=4),
    ]
    got = gs.summarize_samples(samples, 10.0, 12.0)
    assert got["samples"] == 3
    assert got["sm_mhz"] == {"median": 1700, "min": 1650, "max": 1980}
    assert got["sm_mhz_late"] == {"median": 1675, "min": 1650, "max": 1700}
    assert got["power_w_late"]["median"] == 700
    assert got["power_instant_w"] is None
    assert got["temp_c"]["max"] == 61
    assert got["clock_events"] == {"sw_power_cap": pytest.approx(0.667)}


def test_case_record_rates() -> None:
    case = gs.build_cases(sizes=[8192], tokens=[])[0]
    samples = [gs.Sample(10.5, sm_mhz=1500.0), gs.Sample(11.5, sm_mhz=1500.0)]
    rec = gs.case_record(case, _timing(samples), DEVICE)
    assert rec["status"] == "ok" and rec["batches"] == 4 and rec["calls"] == 400
    assert rec["tflops"] == 550.0 and rec["tflops_late"] == 500.0
    assert rec["of_datasheet"] == pytest.approx(550 / 989)
    # 132 SMs x 4096 FLOPs/clock x 1.5 GHz = 811 TFLOP/s at the clock it ran.
    assert rec["of_clock_peak"] == pytest.approx(550e12 / (132 * 4096 * 1.5e9))
    unknown = gs.case_record(case, _timing([]), {"device": "Some GPU", "capability": [12, 0]})
    assert unknown["of_datasheet"] is None and unknown["of_clock_peak"] is None
    from autotune.specs.hardware import GPUS  # the one table of datasheet peaks

    assert gs.datasheet_peak("NVIDIA H200", "fp8") == GPUS["h200"].peak_fp8_flops
    assert gs.datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == GPUS["h100-80gb"].peak_bf16_flops


def test_run_sweep_budget_errors_and_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    cases = gs.build_cases(sizes=[1024, 2048, 3072, 4096, 6144], tokens=[])
    now = [0.0]

    def run_case(case: gs.Case) -> gs.Timing:
        now[0] += 2.5  # a fake GPU: every case takes 2.5 s of the fake clock
        if case.m == 2048:
            raise RuntimeError("CUDA out of memory")
        return _timing([gs.Sample(11.0, sm_mhz=1980.0, power_w=500.0, temp_c=55, reasons=0)])

    written: list[dict[str, Any]] = []
    records = gs.run_sweep(
        cases,
        run_case,
        device=DEVICE,
        budget_s=8.0,
        case_s=2.0,
        clock=lambda: now[0],
        on_record=written.append,
    )
    # 0 s: 1024 (2.5 s); 2.5: 2048 fails; 5.0 + 2.5 = 7.5 <= 8: 3072 runs; 7.5 + 2.5 > 8: skip.
    assert [r["status"] for r in records] == ["ok", "error", "ok", "skipped", "skipped"]
    assert written == records
    assert "CUDA out of memory" in records[1]["error"]
    assert records[0]["device"] == DEVICE["device"] and records[0]["m"] == 1024
    out = capsys.readouterr().out
    assert "skipped 2 case(s): square 4096; square 6144" in out

    md = gs.render_markdown(records, {**DEVICE, "power_limit_w": 700.0, "sampler": "pynvml"})
    assert md.startswith("# GEMM sweep: NVIDIA H100 80GB HBM3")
    assert "power limit 700 W" in md
    assert "| square 1024 | fwd | bf16 | 1024 x 1024 x 1024 | 550.0 | 500.0 |" in md
    assert "| square 2048 | fwd | bf16 | 2048 x 2048 x 2048 | error: RuntimeError" in md
    assert "Not run (budget): 2 case(s): square 4096 bf16 fwd; square 6144 bf16 fwd." in md
    rows = [line for line in md.splitlines() if line.startswith("| square")]
    assert len(rows) == 3 and all(row.count("|") == 13 for row in rows)


def test_markdown_names_merged_shapes_and_clock_events() -> None:
    case = gs.build_cases(sizes=[4096], tokens=[4096], families=[BY_NAME["llama3-8b"]])[0]
    rec = {
        **gs.base_record(case, DEVICE),
        **gs.case_record(case, _timing([gs.Sample(11.0, sm_mhz=1600.0, reasons=4)]), DEVICE),
    }
    md = gs.render_markdown([rec], DEVICE)
    assert "| square 4096 (= llama3-8b proj m4096) |" in md
    assert "sw_power_cap 100%" in md
    assert "Not run" not in md


def test_sampler_reads_in_the_background() -> None:
    class Fake:
        source = "fake"
        reads = 0

        def read(self) -> gs.Sample:
            Fake.reads += 1
            if Fake.reads == 2:
                raise OSError("a failed read is skipped")
            return gs.Sample(time.monotonic(), sm_mhz=1980.0)

        def static(self) -> dict[str, Any]:
            return {}

    sampler = gs.Sampler(Fake(), 0.005)
    sampler.start()
    time.sleep(0.06)
    samples = sampler.stop()
    assert len(samples) >= 2 and all(s.sm_mhz == 1980.0 for s in samples)
    assert gs.Sampler(None, 0.01).stop() == []
