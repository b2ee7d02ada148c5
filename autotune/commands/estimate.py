"""`autotune estimate`: one layout's predicted memory per stage, step time, tokens/s and MFU."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from autotune.errors import ConfigError
from autotune.inputs.documents import parse_json
from autotune.inputs.files import read_text
from autotune.inputs.untrusted import for_terminal, shown
from autotune.layouts.layout import DIMENSIONS, Layout, derive_dp, validate
from autotune.predict.calibration import load_calibration
from autotune.predict.cost import estimate_cost
from autotune.predict.memory import estimate_memory
from autotune.predict.trust import (
    STEP_TIME_BAND,
    in_memory_band,
    memory_band,
    outside_range,
    trust_line,
)
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["SEARCH_DIFFERS", "LayoutFile", "defaults_note", "layout_file", "layout_from_fields",
           "run_estimate"]

_GIB = 2**30
# The layout fields `autotune export --format json` writes, less dp: estimate derives it from
# the GPU count, as the enumerator does.
_LAYOUT_KEYS = tuple(k for k in DIMENSIONS if k != "dp")


def _read_layout(path: str) -> dict[str, Any]:
    # Missing, a folder, a FIFO, too large, not UTF-8, malformed or too deep: one line.
    data = parse_json(read_text(Path(path), "layout file"), f"layout file {path}")
    stored = data.get("layout", data) if isinstance(data, dict) else None
    if not isinstance(stored, dict):
        raise ConfigError(f"layout file {path}: expected a JSON object")
    from autotune.report.scripts import JSON_INFO_KEYS, JSON_KEYS

    # A key the export never writes is a typo (`pp_size`): read as absent, its dimension would
    # silently take estimate's default.
    unknown = [str(k) for k in stored if k not in (*JSON_KEYS, *_CONTEXT_TYPES, *JSON_INFO_KEYS)]
    if unknown:
        raise ConfigError(f"layout file {path}: unknown field(s) "
                          f"{for_terminal(', '.join(unknown))[:200]}; a layout file holds what "
                          "`autotune export --format json` writes")
    if not any(k in JSON_KEYS for k in stored):
        raise ConfigError(f"layout file {path} holds no layout field ({', '.join(JSON_KEYS[:3])}"
                          ", ...): not a layout from `autotune export --format json`")
    return stored


def _check_type(path: str, key: str, value: Any, expected: type) -> None:
    # bool is an int to Python; a layout's true/false and its sizes must not pass for each other.
    ok = (isinstance(value, bool) if expected is bool
          else isinstance(value, expected) and not isinstance(value, bool))
    if not ok:
        raise ConfigError(f"layout file {path}: {key} must be {expected.__name__}, "
                          f"got {shown(value)}")


_TIME_TERMS: tuple[tuple[str, str], ...] = (
    ("compute", "compute_s"), ("tp", "tp_comm_s"), ("cp", "cp_comm_s"), ("ep", "ep_comm_s"),
    ("pp", "pp_comm_s"), ("dp", "dp_comm_s"), ("bubble", "bubble_s"),
    ("optimizer", "optimizer_s"), ("step overhead", "overhead_s"),
    ("kernel launch", "launch_s"), ("cpu offload", "offload_s"))
"""(printed label, CostEstimate field): the terms that add up to the step time."""
_CONTEXT_TYPES: dict[str, type] = {"model": str, "gpus": int, "gpu": str, "seq_length": int,
                                   "gpus_per_node": int}


class LayoutFile(NamedTuple):
    """What `estimate --layout FILE` runs: the file's layout, model and machine, the flags
    filling in what it does not say."""

    fields: dict[str, Any]
    model: str | None
    gpus: int | None
    gpu: str | None
    seq_len: int | None
    gpus_per_node: int | None


def layout_file(path: str, *, model_name: str | None, gpus: int | None, gpu: str | None,
                seq_len: int | None, gpus_per_node: int | None) -> LayoutFile:
    """The layout fields of `estimate --layout FILE`, with its model, GPUs, GPU type, sequence
    and GPUs per node. The layout's values, and the machine and sequence it was exported for,
    override the flags; MODEL and --gpus may be left out when the file has them. A layout of
    another model or GPU count is refused: its figures would not be the study's."""
    stored = _read_layout(path)
    fields = {k: v for k, v in stored.items() if k in _LAYOUT_KEYS}
    for key, value in fields.items():
        # An enum dimension is a string in JSON; its value is checked by Megatron's rules.
        _check_type(path, key, value, str if DIMENSIONS[key].choices else DIMENSIONS[key].kind)
    context = {k: stored[k] for k in _CONTEXT_TYPES if stored.get(k) is not None}
    for key, value in context.items():
        _check_type(path, key, value, _CONTEXT_TYPES[key])
    if "gpus" in context and gpus is not None and context["gpus"] != gpus:
        raise ConfigError(f"layout file {path} is for {context['gpus']} GPUs; --gpus says {gpus}")
    # The machine and sequence the file was exported for win over the flags; one typed that
    # says otherwise is refused rather than dropped in silence.
    for key, option, given in (("gpu", "--gpu", gpu), ("seq_length", "--seq-len", seq_len),
                               ("gpus_per_node", "--gpus-per-node", gpus_per_node)):
        if key in context and given is not None and context[key] != given:
            raise ConfigError(f"layout file {path} says {key} {context[key]}; {option} says "
                              f"{given}: leave {option} out, or edit the file")
    if "model" in context and model_name is None:
        from autotune.specs.presets import list_presets

        if context["model"] not in list_presets():
            # A study of a model YAML or config.json exports the model's name, not its file.
            raise ConfigError(f"layout file {path} is a layout of "
                              f"{shown(context['model'])}, which is not a preset: give its "
                              f"model YAML or config.json as MODEL (autotune estimate FILE "
                              f"--layout {path})")
    if "model" in context and model_name is not None:
        from autotune.specs.presets import load_model

        name = load_model(model_name).name
        if context["model"] != name:
            raise ConfigError(f"layout file {path} is a layout of {context['model']}, "
                              f"not of {name}")
    return LayoutFile(fields, model_name if model_name is not None else context.get("model"),
                      gpus if gpus is not None else context.get("gpus"),
                      context.get("gpu", gpu), context.get("seq_length", seq_len),
                      context.get("gpus_per_node", gpus_per_node))


def layout_from_fields(model: ModelSpec, cluster: ClusterSpec,
                       fields: dict[str, Any]) -> Layout:
    """A validated Layout: dp derived from the GPUs, gbs from the model unless given."""
    values = dict(fields)
    values.setdefault("gbs", model.global_batch_size)
    if values["gbs"] is None:
        values["gbs"] = model.global_batch_size
    for key, value in values.items():
        # Options and layout files alike: a value of the wrong type or below the dimension's
        # minimum (--first-stage-layers -3) is refused here, not priced.
        problem = DIMENSIONS[key].check(value) if key in DIMENSIONS else None
        if problem is not None and not DIMENSIONS[key].choices:
            raise ConfigError(f"{DIMENSIONS[key].option} takes {problem}, got "
                              f"{shown(value)}")
    dp = derive_dp(cluster.num_gpus, tp=values.get("tp", 1), pp=values.get("pp", 1),
                   cp=values.get("cp", 1))
    return validate(Layout(dp=dp, **values), model, cluster)


SEARCH_DIFFERS = ("impl", "distributed_optimizer", "overlap_grad_reduce")
"""Options whose default here (Layout's, which is Megatron's own) is not what a search runs:
its default space always overlaps the gradient reduce, and its winners use sdpa or te
attention and the distributed optimizer."""


def defaults_note(names: Iterable[str] = SEARCH_DIFFERS) -> str | None:
    """A sentence on estimate's defaults for the options of SEARCH_DIFFERS among `names` (those
    left unset): what they are, what the search's default space tries instead, and the flags
    that estimate such a layout; None when every one of them was set."""
    from autotune.search.space import load_space

    chosen = [DIMENSIONS[n] for n in SEARCH_DIFFERS if n in set(names)]
    if not chosen:
        return None
    candidates = load_space(None).candidates
    ours, theirs, flags = [], [], []
    for dim in chosen:
        others = [v for v in candidates.get(dim.name, ()) if v != dim.default]
        words = dim.name.replace("_", " ")
        if dim.kind is bool:
            ours.append(f"no {words}")
            theirs.append(words)
            flags.append(dim.option)
        else:
            ours.append(f"{dim.name} {dim.default}")
            theirs.append(f"{dim.name} {'/'.join(map(str, others))}")
            flags.append(f"{dim.option} {others[0]}" if others else dim.option)
    return (f"estimate's defaults: {', '.join(ours)}; the search also tries "
            f"{', '.join(theirs)}: pass {' '.join(flags)} to estimate such a layout")


def run_estimate(model: ModelSpec, cluster: ClusterSpec, fields: dict[str, Any], *,
                 as_json: bool, calibration: str | None = None,
                 defaulted: Iterable[str] = ()) -> None:
    """Print the layout's predictions; `defaulted` names the options left at estimate's
    defaults (the text output says where those differ from the search's)."""
    fields.setdefault("gbs", model.global_batch_size)
    layout = layout_from_fields(model, cluster, fields)
    cost_params, memory_params = (load_calibration(calibration) if calibration
                                  else (None, None))
    memory = estimate_memory(model, layout, cluster, memory_params)
    cost = estimate_cost(model, layout, cluster, cost_params)
    # MFU stays against the bf16 peak (comparable across precisions), so FP8's large GEMMs can
    # take it over 100%: the FP8 peak's share says how close to its own limit it runs.
    mfu_fp8 = cluster.gpu.fp8_peak_share(cost.tflops_per_gpu * 1e12) \
        if layout.fp8 != "off" else None
    names = [n for n in memory.breakdown_gib() if n not in ("total", "saved")]
    note = defaults_note(defaulted)
    xseg = layout.expandable_segments  # the memory band is the allocator's
    if as_json:
        # Everything the text says: the layout's label, each stage's terms, the verdict's
        # reason and the note on estimate's defaults.
        print(json.dumps({
            "model": model.name, "gpus": cluster.num_gpus, "gpu": cluster.gpu.name,
            "seq_length": model.seq_length,
            "gpus_per_node": cluster.gpus_per_node, "label": layout.describe(),
            "layout": {k: getattr(layout, k) for k in ("dp", *_LAYOUT_KEYS)},
            "num_microbatches": layout.num_microbatches,
            "peak_memory_gib": memory.peak_bytes / _GIB, "peak_stage": memory.peak_stage,
            "capacity_gib": memory.capacity_bytes / _GIB, "fits": memory.fits,
            "does_not_fit": None if memory.fits else memory.explain(),
            "memory_breakdown_gib": memory.breakdown_gib(),
            "stages_gib": [{"stage": st.stage,
                            **{n: getattr(st, f"{n}_bytes", 0.0) / _GIB for n in names},
                            "total": st.total_bytes / _GIB, "saved": st.saved_bytes / _GIB}
                           for st in memory.stages],
            "step_time_s": cost.step_time_s, "tokens_per_s": cost.tokens_per_s,
            "tflops_per_gpu": cost.tflops_per_gpu, "mfu": cost.mfu,
            "mfu_fp8": mfu_fp8,
            "time_breakdown_s": {field: getattr(cost, field) for _, field in _TIME_TERMS},
            "predicted": True, "defaults_note": note,
            # the models' held-out error bands and what lies outside the measured range
            "step_time_band": STEP_TIME_BAND, "memory_band": memory_band(cluster, xseg),
            "within_memory_band": in_memory_band(memory, cluster, xseg),
            "outside_measured_range": outside_range(model, cluster),
        }, indent=2))
        return
    print(f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name} "
          f"({cluster.gpus_per_node} per node): {layout.describe()}, "
          f"gbs {layout.gbs}, seq {model.seq_length}, {layout.num_microbatches} micro-batches "
          "(predicted)")
    print(f"memory per GPU by pipeline stage (GiB; capacity {memory.capacity_bytes / _GIB:.1f}):")
    # "saved" is what recompute or CPU offloading keeps off the GPU: shown after the total,
    # which it is not part of.
    saves = any(st.saved_bytes for st in memory.stages)
    print("  stage " + " ".join(f"{n[:11]:>11}" for n in names) + f" {'total':>8}"
          + (f" {'saved by recompute/offload':>27}" if saves else ""))
    for st in memory.stages:
        terms = [getattr(st, f"{n}_bytes", 0.0) / _GIB for n in names]
        mark = "  <- peak" if st.stage == memory.peak_stage else ""
        saved = f" {st.saved_bytes / _GIB:>27.2f}" if saves else ""
        print(f"  {st.stage:>5} " + " ".join(f"{t:>11.2f}" for t in terms) +
              f" {st.total_bytes / _GIB:>8.2f}{saved}{mark}")
    verdict = "fits" if memory.fits else f"does NOT fit: {memory.explain()}"
    band = memory_band(cluster, xseg)
    risky = " (within the memory band of the capacity: a risk)" \
        if in_memory_band(memory, cluster, xseg) else ""
    print(f"peak {memory.peak_bytes / _GIB:.2f} ± {band * memory.peak_bytes / _GIB:.2f} GiB on "
          f"stage {memory.peak_stage}: {verdict}{risky}")
    print(f"step {cost.step_time_s * 1e3:.1f} ms "
          f"(±{STEP_TIME_BAND * cost.step_time_s * 1e3:.1f}): "
          + ", ".join(f"{label} {getattr(cost, field) * 1e3:.1f}" for label, field in _TIME_TERMS)
          + " ms")
    against_fp8 = f" of the bf16 peak, {mfu_fp8:.1%} of the FP8 peak" if mfu_fp8 else ""
    print(f"{cost.tokens_per_s:,.0f} tokens/s, {cost.tflops_per_gpu:.0f} TFLOP/s per GPU, "
          f"MFU {cost.mfu:.1%}{against_fp8}")
    print(f"({trust_line(model, cluster, xseg)})")
    if note:
        print(f"({note})")
