"""Alpa's seeds (order, micro-batch, recompute relaxation) and the micro-batch bisection."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from conftest import cluster

from autotune.layouts.layout import Layout
from autotune.predict.gate import MemoryGate, mbs_family
from autotune.search.heuristics import alpa_seeds, next_smaller_mbs
from autotune.search.space import enumerate_space, space_from_mapping
from autotune.specs.presets import load_model

SPACE = {"tp": [1, 2, 4], "pp": [1, 2, 4], "mbs": [1, 2, 4, 8],
         "sequence_parallel": [False, True], "distributed_optimizer": [False, True],
         "overlap_grad_reduce": [True], "overlap_param_gather": [False, True],
         "recompute": ["none", "selective", "full"]}


def seeds_of(model: str, gpus: int, gpu: str, impl: str, seq: int | None = None,
             limit: int = 6) -> tuple[list[Layout], list[Layout], MemoryGate]:
    spec = load_model(model).with_overrides(seq_length=seq, global_batch_size=None)
    c = cluster(gpus, gpu=gpu)
    space = space_from_mapping({**SPACE, "impl": [impl]}, "test")
    valid = enumerate_space(space, spec, c).valid
    gate = MemoryGate(spec, c)
    return alpa_seeds(valid, lambda s: gate.decide(s).launch, impl, limit), valid, gate


def test_seeds_prefer_dp_then_less_tp_then_less_pp_at_the_largest_fitting_mbs() -> None:
    seeds, valid, gate = seeds_of("gpt2-medium", 8, "h100-80gb", "sdpa")
    assert [(s.tp, s.pp, s.dp) for s in seeds] == [(1, 1, 8), (1, 2, 4), (2, 1, 4), (1, 4, 2),
                                                   (2, 2, 2), (4, 1, 2)]
    for s in seeds:
        same_layout = [v for v in valid if mbs_family(v) == mbs_family(s)]
        assert s.mbs == max(v.mbs for v in same_layout if gate.decide(v).launch)
        # Megatron practice without tuning: no recompute, the distributed optimizer with
        # dp > 1, sequence parallel with tp > 1.
        assert s.recompute == "none" and s.impl == "sdpa"
        assert s.distributed_optimizer == (s.dp > 1) == s.overlap_param_gather
        assert s.sequence_parallel == (s.tp > 1)


def test_seeds_respect_the_limit() -> None:
    seeds, _, _ = seeds_of("gpt2-medium", 8, "h100-80gb", "sdpa", limit=2)
    assert [(s.tp, s.pp, s.dp) for s in seeds] == [(1, 1, 8), (1, 2, 4)]


@pytest.mark.parametrize(("model", "gpus", "gpu", "seq", "recompute", "first"), [
    ("gpt2-medium", 8, "h100-80gb", None, "none", "tp1 pp1 dp8 mbs8 do ogr opg local"),
    # Too large without recompute: selective first, as a user would do next ...
    ("gpt2-xl", 1, "h100-80gb", 4096, "selective", "tp1 pp1 dp1 mbs2 rc=selective ogr local"),
    # ... and full recompute when selective does not fit either.
    ("gpt2-xl", 1, "a100-40gb", 4096, "full", "tp1 pp1 dp1 mbs1 rc=full ogr local"),
    # Nothing fits at all: no seeds.
    ("gpt-3.6b", 1, "a100-40gb", None, None, None),
])
def test_seeds_relax_to_recompute_when_nothing_fits(model: str, gpus: int, gpu: str,
                                                    seq: int | None, recompute: str | None,
                                                    first: str | None) -> None:
    seeds, _, gate = seeds_of(model, gpus, gpu, "local", seq)
    assert {s.recompute for s in seeds} == ({recompute} if recompute else set())
    assert (seeds[0].describe() if seeds else None) == first
    assert all(gate.decide(s).launch for s in seeds)


MBS = (1, 2, 4, 8, 16)


@pytest.mark.parametrize(("candidates", "failed", "known_good", "expected"), [
    (MBS, 16, None, 4),       # middle of 1, 2, 4, 8
    (MBS, 8, None, 2),        # middle of 1, 2, 4
    (MBS, 4, None, 2),        # middle of 1, 2
    (MBS, 2, None, 1),
    (MBS, 1, None, None),     # nothing smaller: give up on the layout
    (MBS, 16, 4, 8),          # between the largest known to fit and the failure
    (MBS, 16, 2, 8),          # middle of 4, 8
    (MBS, 8, 4, None),        # 4 fits, 8 does not: bisection done
    ((16, 1, 4, 2), 16, None, 2),  # candidate order does not matter
    ((1, 2, 4, 8, 16, 32), 32, None, 4),
])
def test_next_smaller_mbs_bisects(candidates: Sequence[int], failed: int,
                                  known_good: int | None, expected: int | None) -> None:
    assert next_smaller_mbs(candidates, failed, known_good) == expected


def test_seeds_use_the_options_the_space_offers() -> None:
    """A space without overlap (single GPU) still gets its Alpa seed: the closest options."""
    from autotune.search.space import enumerate_space, space_from_mapping
    from autotune.specs.presets import load_model
    from tests.conftest import cluster

    model, c = load_model("gpt2-xl"), cluster(1)
    space = space_from_mapping({"mbs": [4, 8, 16, 32], "recompute": ["none", "selective"],
                                "overlap_grad_reduce": [False], "impl": ["local", "sdpa"]},
                               "single")
    valid = enumerate_space(space, model, c).valid
    fits = {s: s.mbs <= 16 and not (s.impl == "local" and s.mbs > 4) for s in valid}
    seeds = alpa_seeds(valid, fits.__getitem__, "sdpa")
    assert [(s.mbs, s.recompute, s.impl) for s in seeds] == [(16, "none", "sdpa")]
