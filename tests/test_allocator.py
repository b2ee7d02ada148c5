"""The caching allocator's expandable segments (autotune.levers.allocator): the option read and
written, its memory terms against the H200 trials that measured it, and the run's environment
through the exported scripts, `--from-megatron` and the patched script."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.commands.estimate import layout_from_fields
from autotune.errors import ConfigError
from autotune.layouts.layout import DIMENSIONS, Layout
from autotune.levers.allocator import ALLOC_CONF_ENV, expandable_in, option
from autotune.megatron.environment import environment_fields, export_lines, run_environment
from autotune.megatron.megatron_command import (
    layout_changes,
    megatron_layout,
    read_megatron_command,
)
from autotune.megatron.script_patch import patch_script
from autotune.predict.gate import (
    DEFAULT_ERROR_BAND,
    EXPANDABLE_ERROR_BAND,
    MEMORY_ERROR_BAND,
    MemoryGate,
    memory_error_band,
)
from autotune.predict.memory import MemoryParams, estimate_memory
from autotune.report.scripts import megatron_lm_script
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model
from tests.measured import DATA_PATH, trial_inputs

DATA = Path(__file__).parent / "data" / "measured_allocator_trials.json"
GIB = 2**30
LAUNCH = ("torchrun --nproc-per-node 1 pretrain_gpt.py \\\n"
          "    --num-layers 4 --hidden-size 256 --num-attention-heads 8 \\\n"
          "    --seq-length 512 --max-position-embeddings 512 \\\n"
          "    --global-batch-size 16 --micro-batch-size 1 \\\n"
          "    --tokenizer-type NullTokenizer --vocab-size 1000\n")


@pytest.mark.parametrize(("conf", "on"), [
    ("expandable_segments:True", True),
    ("expandable_segments:False", False),
    ("", False),
    ("garbage_collection_threshold:0.6,expandable_segments:True", True),
    ("expandable_segments:True,max_split_size_mb:128", True),
    # The last of a key holds, as PyTorch parses them in order.
    ("expandable_segments:True,expandable_segments:False", False),
    ("expandable_segments:False, expandable_segments:True", True),
    # PyTorch takes True or False only; anything else is not on.
    ("expandable_segments:true", False),
    ("max_split_size_mb:128", False),
])
def test_the_option_is_read_as_pytorch_reads_it(conf: str, on: bool) -> None:
    assert expandable_in(conf) is on
    assert environment_fields({ALLOC_CONF_ENV: conf}) == {"expandable_segments": on}


@pytest.mark.parametrize("on", [False, True])
def test_the_environment_written_reads_back(on: bool) -> None:
    s = Layout(expandable_segments=on)
    assert run_environment(s) == {ALLOC_CONF_ENV: option(on)}
    assert environment_fields(run_environment(s)) == {"expandable_segments": on}
    assert export_lines(s) == [f"export {ALLOC_CONF_ENV}=expandable_segments:{on}"]


def _trials() -> list[dict[str, object]]:
    return json.loads(DATA.read_text())["trials"]


def _estimate(trial: dict[str, object]) -> float:
    model = load_model(str(trial["model"])).with_overrides(seq_length=int(trial["seq_length"]))
    cluster = ClusterSpec.make(1, gpu="h200")
    values: dict[str, object] = {}
    for item in str(trial["layout"]).split(","):
        key, _, value = item.partition("=")
        values[key] = DIMENSIONS[key].parse(value)
    layout = layout_from_fields(model, cluster, values)
    return estimate_memory(model, layout, cluster).peak_bytes / GIB


def _ran(status: str) -> list[dict[str, object]]:
    return [t for t in _trials() if t["status"] == status]


@pytest.mark.parametrize("trial", _ran("OK"), ids=lambda t: f"{t['model']}-{t['layout']}")
def test_measured_device_memory(trial: dict[str, object]) -> None:
    """Expandable segments' trials are predicted within their band below and 5% above (the
    reserve is 0.2-2.7% of the allocated peak; llama-1b at seq 65536 is over-predicted by
    4.5%); with the default segments the same layouts left 3-11 GiB reserved, and the model,
    which prices an average reserve, predicted them up to 12% low: what the memory gate's
    default band is for."""
    used = float(trial["device_used_gib"])
    reserve = float(trial["peak_reserved_gib"]) - float(trial["peak_allocated_gib"])
    error = _estimate(trial) / used - 1
    if "expandable_segments=1" in str(trial["layout"]):
        assert reserve < 0.03 * float(trial["peak_allocated_gib"])
        assert -EXPANDABLE_ERROR_BAND < error < 0.05, error
    else:
        assert reserve > 3.0
        assert -0.12 < error < 0.0, error


@pytest.mark.parametrize("trial", _ran("OOM"), ids=lambda t: f"{t['model']}-{t['layout']}")
def test_what_ran_out_of_memory_is_predicted_not_to_fit(trial: dict[str, object]) -> None:
    """Llama-3.1-8B at dp 1 with the precision-aware optimizer: predicted at 113.6 GiB before
    the optimizer's step copies joined the model (autotune.levers.precision_optimizer)."""
    assert _estimate(trial) > ClusterSpec.make(1, gpu="h200").gpu.memory_bytes / GIB


def _allocated_under() -> float:
    """The memory model's worst under-prediction of the allocated peak over the OK trials of
    tests/data/measured_trials.json that recorded it (the allocator's segments change the
    reserve beyond it, not the peak itself)."""
    worst = 0.0
    for t in json.loads(DATA_PATH.read_text())["trials"]:
        if t["status"] != "OK" or not t.get("peak_allocated_bytes"):
            continue
        model, s, cluster = trial_inputs(t)
        peak = estimate_memory(model, s, cluster).peak
        worst = max(worst, t["peak_allocated_bytes"] / peak.allocated_bytes - 1)
    return worst


def test_the_expandable_band_is_the_allocated_peaks_error_and_the_reserve() -> None:
    xseg = [t for t in _ran("OK") if "expandable_segments=1" in str(t["layout"])]
    reserve = max(float(t["peak_reserved_gib"]) / float(t["peak_allocated_gib"]) - 1
                  for t in xseg)
    band = _allocated_under() + reserve - MemoryParams().expandable_fragmentation
    assert pytest.approx(band, abs=0.002) == EXPANDABLE_ERROR_BAND
    # The trials' own worst miss of the device memory in use lies inside it.
    worst = max(1 - _estimate(t) / float(t["device_used_gib"]) for t in xseg)
    assert 0 < worst < EXPANDABLE_ERROR_BAND


@pytest.mark.parametrize(("gpu", "expandable", "band"), [
    ("h200", True, EXPANDABLE_ERROR_BAND),
    ("h100-80gb", True, EXPANDABLE_ERROR_BAND),
    ("h200", False, MEMORY_ERROR_BAND["h200"]),
    # A GPU without measured trials keeps the widest band either way.
    ("a100-80gb", True, DEFAULT_ERROR_BAND),
    ("a100-80gb", False, DEFAULT_ERROR_BAND),
])
def test_the_band_follows_the_allocator(gpu: str, expandable: bool, band: float) -> None:
    assert memory_error_band(gpu, expandable) == band


def test_the_gate_runs_a_layout_near_the_capacity_as_safe_with_expandable_segments() -> None:
    # Llama-3.2-3B at seq 8192, mbs 4, block recompute of 12 layers: predicted at 93.1% of an
    # H200 with expandable segments (127.5 GiB measured, 130.7 predicted): inside the default
    # segments' band, outside expandable segments'.
    model = load_model("tests/data/hf/llama-3.2-3b.json").with_overrides(seq_length=8192)
    cluster = ClusterSpec.make(1, gpu="h200")
    fields = {"mbs": 4, "gbs": 8, "impl": "te", "recompute": "full",
              "recompute_method": "block", "recompute_num_layers": 12}
    gate = MemoryGate(model, cluster)
    xseg = gate.decide(layout_from_fields(model, cluster, {**fields,
                                                           "expandable_segments": True}))
    default = gate.decide(layout_from_fields(model, cluster, fields))
    assert xseg.launch and not xseg.risky
    assert default.launch and default.risky


def test_expandable_segments_leave_no_block_margin() -> None:
    """The default segments need the logits block free beside the peak; expandable ones
    unmap cached pages to map it."""
    model = load_model("gpt2-xl")
    cluster = ClusterSpec.make(1, gpu="h200")
    default = estimate_memory(model, layout_from_fields(
        model, cluster, {"mbs": 38, "gbs": 76, "impl": "te"}), cluster)
    xseg = estimate_memory(model, layout_from_fields(
        model, cluster, {"mbs": 38, "gbs": 76, "impl": "te", "expandable_segments": True}),
        cluster)
    assert any(st.block_margin_bytes > 0 for st in default.stages)
    assert all(st.block_margin_bytes == 0 for st in xseg.stages)
    assert xseg.peak_bytes < default.peak_bytes
    assert xseg.fits and not default.fits


def test_the_exported_script_exports_the_option() -> None:
    model = load_model("gpt2-xl")
    cluster = ClusterSpec.make(1, gpu="h200")
    for on in (False, True):
        s = layout_from_fields(model, cluster, {"mbs": 4, "expandable_segments": on})
        text = megatron_lm_script(model, s, title=["t"])
        lines = text.splitlines()
        export = lines.index(f"export {ALLOC_CONF_ENV}=expandable_segments:{on}")
        assert export < next(k for k, line in enumerate(lines) if line.startswith("torchrun"))


@pytest.mark.parametrize(("before", "on"), [
    ("", False),
    (f"export {ALLOC_CONF_ENV}=expandable_segments:True\n", True),
    (f"export {ALLOC_CONF_ENV}='max_split_size_mb:64,expandable_segments:True'\n", True),
    (f"{ALLOC_CONF_ENV}=expandable_segments:True\nexport {ALLOC_CONF_ENV}\n", True),
    # From the caller's environment: not known, read as the default.
    (f"export {ALLOC_CONF_ENV}=\"$MY_CONF\"\n", False),
])
def test_from_megatron_reads_the_scripts_environment(tmp_path: Path, before: str,
                                                      on: bool) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n" + before + LAUNCH)
    command = read_megatron_command(str(script))
    assert megatron_layout(command, 1).expandable_segments is on


def test_the_launch_prefix_overrides_the_export(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nexport {ALLOC_CONF_ENV}=expandable_segments:True\n"
                      f"{ALLOC_CONF_ENV}=expandable_segments:False " + LAUNCH)
    assert not megatron_layout(read_megatron_command(str(script)), 1).expandable_segments


@pytest.mark.parametrize(("before", "line"), [
    ("", f"export {ALLOC_CONF_ENV}=expandable_segments:True"),
    # The user's other options stay; the option goes last, where it holds.
    (f"export {ALLOC_CONF_ENV}=max_split_size_mb:64\n",
     f"export {ALLOC_CONF_ENV}=max_split_size_mb:64,expandable_segments:True"),
    (f"export {ALLOC_CONF_ENV}='garbage_collection_threshold:0.6 '\n",
     f"export {ALLOC_CONF_ENV}='garbage_collection_threshold:0.6 ,expandable_segments:True'"),
])
def test_the_patch_exports_the_option_before_the_launch(tmp_path: Path, before: str,
                                                        line: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nset -e\n" + before + LAUNCH)
    command = read_megatron_command(str(script))
    old = megatron_layout(command, 1)
    new = replace(old, mbs=2, expandable_segments=True)
    changes = layout_changes(command, old, new)
    assert [c.variable for c in changes if c.variable] == [ALLOC_CONF_ENV]
    patched = patch_script(command, new, changes)
    lines = patched.splitlines()
    assert lines[lines.index(line) + 1].startswith("torchrun")
    # Only the export and the micro-batch changed; the file's other lines are the user's.
    assert [x for x in lines if x != line] == \
        script.read_text().replace("--micro-batch-size 1", "--micro-batch-size 2").splitlines()
    # And bash runs the export: the launched process sees the option.
    (tmp_path / "torchrun").write_text(f"#!/bin/sh\necho \"${ALLOC_CONF_ENV}\" > seen\n")
    (tmp_path / "torchrun").chmod(0o755)
    patched_path = tmp_path / "tuned.sh"
    patched_path.write_text(patched)
    subprocess.run(["bash", str(patched_path)], check=True, cwd=tmp_path, timeout=30,
                   env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert expandable_in((tmp_path / "seen").read_text().strip())


def test_an_unchanged_option_is_not_written_again(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nexport {ALLOC_CONF_ENV}=expandable_segments:True\n"
                      + LAUNCH)
    command = read_megatron_command(str(script))
    new = replace(megatron_layout(command, 1), mbs=2)
    assert new.expandable_segments
    assert not [c for c in layout_changes(command, megatron_layout(command, 1), new)
                if c.variable]


def test_an_option_set_on_the_launch_itself_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n{ALLOC_CONF_ENV}=max_split_size_mb:64 " + LAUNCH)
    command = read_megatron_command(str(script))
    new = replace(megatron_layout(command, 1), expandable_segments=True)
    changes = layout_changes(command, megatron_layout(command, 1), new)
    with pytest.raises(ConfigError, match="the launch command sets PYTORCH_CUDA_ALLOC_CONF"):
        patch_script(command, new, changes)
