"""Shared fixtures: GPU detection for the `gpu` marker, and small model/cluster builders."""

from __future__ import annotations

import enum
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from doubles.no_fsync import sqlite_without_fsync

from autotune.dimensions import RecomputeModules
from autotune.layouts.layout import SEARCHED, Layout, check, with_fields
from autotune.levers import unpriced
from autotune.levers.flags import Given
from autotune.levers.fp8 import Fp8, Fp8Recipe
from autotune.search.space import SearchSpace, enumerate_space
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model


def process_gone(pid: int) -> bool:
    """True once no process has `pid` (signal 0 probes without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10)
        return probe.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


HAS_CUDA = _has_cuda()


@pytest.fixture(autouse=True, scope="session")
def _sqlite_without_fsync() -> Iterator[None]:
    """Studies written by this process skip SQLite's fsync (doubles/no_fsync.py says why)."""
    undo = sqlite_without_fsync()
    yield
    undo()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


def cluster(num_gpus: int, gpus_per_node: int | None = None,
            gpu: str = "h100-80gb") -> ClusterSpec:
    """A cluster of a known GPU type (never the local one, so tests do not depend on it)."""
    per_node = gpus_per_node if gpus_per_node is not None else min(8, num_gpus)
    return ClusterSpec(num_gpus=num_gpus, gpus_per_node=per_node, gpu=gpu_spec(gpu))


def heavy_imports_of(args: list[str], cwd: Path | None = None) -> tuple[int, str, str]:
    """Run `autotune ARGS` in a fresh interpreter; (exit code, the heavy modules it imported
    as printed, stderr). The CLI must keep torch, megatron and TE out of its process."""
    code = (
        "import sys\n"
        "from autotune.cli import main\n"
        f"rc = main({args!r})\n"
        "names = ('torch', 'megatron', 'transformer_engine')\n"
        "print('HEAVY', sorted(m for m in names if m in sys.modules))\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=cwd)
    heavy = next((line for line in proc.stdout.splitlines() if line.startswith("HEAVY")), "")
    return proc.returncode, heavy, proc.stderr


def all_dimensions_space() -> SearchSpace:
    """Every searched dimension with at least two candidates (its default and another, every
    choice of an enum): a new dimension varies here without anyone listing it."""
    candidates: dict[str, tuple[Any, ...]] = {}
    for name, dim in SEARCHED.items():
        if name in unpriced():
            candidates[name] = (dim.default,)  # varied on a sample (all_dimensions_layouts)
        elif dim.kind is bool:
            candidates[name] = (False, True)
        elif dim.kind is RecomputeModules:
            # 15 sets: the default and one other, so the space stays small (the MoE modules'
            # terms have tests of their own in test_memory_options.py).
            candidates[name] = (RecomputeModules.CORE_ATTN, RecomputeModules.LAYERNORM__MLP)
        elif dim.kind in (Fp8, Fp8Recipe):
            # The default and one other each (3 formats x 4 recipes would multiply the space by
            # 12): tests/test_fp8.py holds the rest, e4m3 (priced as hybrid) among them.
            candidates[name] = tuple(dim.kind)[:2]
        elif issubclass(dim.kind, enum.Enum):
            candidates[name] = tuple(dim.kind)
        else:
            # Sizes from 1; a count whose 0 means off (an even split, no offload) from 0.
            candidates[name] = (dim.default, dim.default + 1)
    return SearchSpace(candidates=candidates, source="all dimensions")


UNPRICED_SAMPLE = 16
"""all_dimensions_layouts flips an unpriced lever's switch on every this-many-th layout."""


@functools.cache
def all_dimensions_layouts(preset: str, gpus: int) -> tuple[ModelSpec, ClusterSpec,
                                                           tuple[Layout, ...]]:
    """The model, an H100 node of `gpus` GPUs and the valid layouts of all_dimensions_space()
    on it: enumerated once per session (tens of thousands of layouts, 15 to 25 s each) for
    tests/test_identity.py and tests/test_dimension_contract.py. A tuple: no test can change
    what the next one reads."""
    model = load_model(preset)
    cluster = ClusterSpec.make(gpus, gpu="h100-80gb", gpus_per_node=min(8, gpus))
    valid = enumerate_space(all_dimensions_space(), model, cluster).valid
    # The unpriced levers' switches reach no model term, only the worker and the command:
    # each flipped on every UNPRICED_SAMPLE-th layout, where the product would double the
    # space (and these two files' time) per switch.
    flipped = [with_fields(s, **{name: not getattr(s, name)})
               for name in unpriced() for s in valid[::UNPRICED_SAMPLE]]
    return model, cluster, (*valid, *(s for s in flipped if not check(s, model, cluster)))


def given_of(args: list[str]) -> Given:
    """A lever's flag reader input from a command's words: each `--flag` with the word after it
    as its value, or None where the next word is another flag (a switch) or there is none."""
    values: dict[str, str | None] = {}
    for i, word in enumerate(args):
        if word.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            values[word] = None if nxt is None or nxt.startswith("--") else nxt
    return Given(values, "test")


def another_value(name: str, value: object) -> object:
    """A valid value of Layout field `name` other than `value` (tests of what a field moves)."""
    from autotune.layouts.layout import DIMENSIONS

    choices = DIMENSIONS[name].choices
    if choices is not None:
        return next(c for c in choices if c != value)
    if isinstance(value, bool):
        return not value
    assert isinstance(value, int), name
    if name == "ep" and value > 1:
        return value // 2  # the experts still divide over it (mixtral has 8)
    # Doubled (dp keeps a whole expert-data-parallel group), 0 to 1.
    return 2 * value or 1
