"""The sampler's conditional asks (autotune.search.layout_map, LayoutMap.ask): a parameter is
asked only where the earlier answers leave it a choice, so no proposal breaks a rule that is a
dependency between dimensions (vpp at pp 1, sequence parallelism at tp 1, the parameter gather
without the distributed optimizer, FP8 without Transformer Engine, ...); and a study whose
trials hold every parameter (an earlier version's) resumes under them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from doubles.fake_backend import FakeBackend, small_cluster, small_model, small_space
from optuna.trial import TrialState

from autotune.layouts.layout import LAYOUT_DEFAULTS
from autotune.search import SearchConfig
from autotune.search.backends import SimulateBackend
from autotune.search.config import Sampler
from autotune.search.layout_map import ASKED_ATTR, LayoutMap, search_sampler
from autotune.search.loop import Search
from autotune.search.records import Source
from autotune.search.shared import read_shared
from autotune.search.space import load_space
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model
from autotune.trials.trial import TrialStatus

ASKS = 60

Values = dict[str, Any]
DEPENDENCIES: dict[str, Callable[[Values, int], bool]] = {
    # A proposal breaks the rule when the predicate holds (its values, the GPU count).
    "vpp needs pp > 1": lambda v, n: v["pp"] == 1 and v["vpp"] != 1,
    "the embedding/loss split needs pp > 1":
        lambda v, n: v["pp"] == 1 and v["embedding_loss_split"] is True,
    "sequence parallelism needs tp > 1": lambda v, n: v["tp"] == 1 and v["sequence_parallel"],
    "the parameter gather needs the distributed optimizer":
        lambda v, n: v["overlap_param_gather"] and not v["distributed_optimizer"],
    "FP8 needs Transformer Engine": lambda v, n: v["fp8"] != "off" and v["impl"] != "te",
    "the FP8 parameter gather needs FP8 and the distributed optimizer":
        lambda v, n: v["fp8_param_gather"] and (v["fp8"] == "off"
                                                or not v["distributed_optimizer"]),
    # A rule that leaves a parameter several values but not every choice (cp 4 of 1, 2, 4 at
    # tp 2 on 4 GPUs; pp 4 at tp 2) is kept by the sampler (ValidSampler): nothing is INVALID.
}


def _config(model: str, gpus: int, tmp_path: Path, **space: list[Any]) -> SearchConfig:
    spec = replace(load_model(model), global_batch_size=16, seq_length=4096)
    cluster = ClusterSpec(num_gpus=gpus, gpus_per_node=gpus, gpu=gpu_spec("h200"))
    base = load_space()
    if space:
        base = replace(base, candidates={**base.candidates,
                                         **{d: tuple(v) for d, v in space.items()}})
    return SearchConfig(model=spec, cluster=cluster, space=base,
                        backend=SimulateBackend(cluster), results_dir=tmp_path)


CASES = {
    # The two studies of session 20 (default space, Transformer Engine present).
    "llama3-8b on 4 x H200": ("llama3-8b", 4, {}),
    "llama-3.2-3b on 1 x H200": ("tests/data/hf/llama-3.2-3b.json", 1, {}),
    # The embedding/loss split listed (session 20's 4-GPU study proposed it at pp 1), the
    # gradient reduce overlap a choice.
    "llama3-8b on 8 GPUs, els listed": ("llama3-8b", 8, {
        "embedding_loss_split": [False, True], "overlap_grad_reduce": [False, True],
        "mbs": [1, 2, 4]}),
}


def _asked(layouts: LayoutMap, seed: int, *, plain: bool = False
           ) -> list[optuna.trial.FrozenTrial]:
    """ASKS trials of the search's sampler (`plain`: TPE without ValidSampler), each told as
    the search would: PRUNED when its parameters break a rule, else a figure of its layout."""
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=search_sampler(Sampler.TPE, seed,
                                                     None if plain else layouts))
    for _ in range(ASKS):
        trial = study.ask()
        layouts.ask(trial)
        s = layouts.layout(trial.params)
        if s is None:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, [1000.0 * s.dp * (1 + 0.1 * s.mbs) / s.pp, 1.0])
    return study.get_trials(deepcopy=False)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_no_proposal_breaks_a_dependency(case: str, seed: int, tmp_path: Path) -> None:
    model, gpus, space = CASES[case]
    layouts = LayoutMap.of(_config(model, gpus, tmp_path, **space))
    trials = _asked(layouts, seed)
    invalid = 0
    for t in trials:
        values = {**LAYOUT_DEFAULTS, **layouts.fixed, **layouts.complete(t.params)}
        broken = [name for name, rule in DEPENDENCIES.items() if rule(values, gpus)]
        assert not broken, (t.number, t.params, broken)
        invalid += layouts.layout(t.params) is None
        # A parameter is asked only where a rule leaves it a choice.
        assert t.user_attrs[ASKED_ATTR]
    # A rule that leaves a parameter several values but not every one is kept too.
    assert invalid == 0


PARTIAL = [
    # (GPUs, earlier answers, parameter, the values a valid layout has with them)
    (4, {"tp": 2}, "pp", (1, 2)),
    (4, {"tp": 1}, "pp", (1, 2, 4)),
    (4, {"tp": 2, "pp": 1}, "cp", (1, 2)),
    (4, {"tp": 1, "pp": 2}, "cp", (1, 2)),
    (4, {"tp": 4, "pp": 1}, "cp", (1,)),
    (4, {"tp": 4}, "pp", (1,)),
]


@pytest.mark.parametrize(("gpus", "answers", "dim", "allowed"), PARTIAL)
def test_allowed_reads_the_rules_through_the_valid_layouts(
        gpus: int, answers: dict[str, Any], dim: str, allowed: tuple[Any, ...],
        tmp_path: Path) -> None:
    layouts = LayoutMap.of(_config("llama3-8b", gpus, tmp_path))
    assert set(layouts.allowed(answers, dim) or ()) == set(allowed)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_valid_sampler_cuts_invalid_asks_and_keeps_distributions(
        seed: int, tmp_path: Path) -> None:
    # llama3-8b on 4 GPUs: the plain sampler proposes pp 4 at tp 2, cp 4 at tp 2, mbs above
    # gbs / dp (INVALID); the wrapped one proposes none, and more new layouts.
    layouts = LayoutMap.of(_config("llama3-8b", 4, tmp_path))
    plain = _asked(layouts, seed, plain=True)
    wrapped = _asked(layouts, seed)
    assert sum(layouts.layout(t.params) is None for t in plain) > 0
    assert all(layouts.layout(t.params) is not None for t in wrapped)
    new = [len({layouts.layout(t.params) for t in ts} - {None}) for ts in (plain, wrapped)]
    assert new[1] > new[0]
    for t in wrapped:  # one distribution per parameter, every candidate, in every trial
        for dim, dist in t.distributions.items():
            assert dist == layouts.distributions[dim]


@pytest.mark.parametrize("case", list(CASES))
def test_a_parameter_is_asked_only_where_it_has_a_choice(case: str, tmp_path: Path) -> None:
    model, gpus, space = CASES[case]
    layouts = LayoutMap.of(_config(model, gpus, tmp_path, **space))
    keys = [dict(k) for k in layouts.by_params]
    for t in _asked(layouts, 0):
        if layouts.layout(t.params) is None:
            continue
        full = layouts.complete(t.params)
        agree = keys  # the valid parameter sets with the answers so far
        for dim in layouts.order:
            if dim not in t.params:
                # Not asked: every valid layout with the earlier answers has one value.
                assert {k[dim] for k in agree} == {full[dim]}, (t.params, dim)
            agree = [k for k in agree if k[dim] == full[dim]]


def test_a_valid_layout_is_its_own_proposal(tmp_path: Path) -> None:
    # Every valid layout, enqueued (a seed, a grid, the queue), is asked back as itself.
    layouts = LayoutMap.of(_config("llama3-8b", 4, tmp_path))
    study = optuna.create_study(directions=["maximize", "minimize"])
    for s in layouts.valid[::50]:
        study.enqueue_trial(layouts.params(s))
        trial = study.ask()
        layouts.ask(trial)
        assert layouts.layout(trial.params) == s
        study.tell(trial, state=TrialState.PRUNED)


def _fake_config(tmp_path: Path, backend: FakeBackend, **overrides: Any) -> SearchConfig:
    values: dict[str, Any] = {"model": small_model(), "cluster": small_cluster(),
                              "space": small_space(), "backend": backend,
                              "results_dir": tmp_path, "study_name": "s", "sampler": "tpe",
                              "stop_rule": "none", "finalists": 0}
    return SearchConfig(**{**values, **overrides})


@pytest.mark.parametrize("old_trials", [3, 12])
def test_a_study_of_full_asks_resumes_under_conditional_asks(tmp_path: Path,
                                                             old_trials: int) -> None:
    backend = FakeBackend(small_cluster())
    old = Search(_fake_config(tmp_path, backend, n_trials=old_trials))
    old.store.conditional = False  # an earlier version: every parameter in every trial
    first = old.run()
    layouts = old.layouts
    assert all(set(t.params) == set(layouts.free) for t in old.store.study.get_trials())

    resumed = Search(_fake_config(tmp_path, backend, n_trials=old_trials + 8, resume=True))
    assert resumed.store.conditional
    result = resumed.run()
    # The old trials read back as the layouts they ran.
    before = {r.number: r.layout for r in first.records if r.status is not TrialStatus.INVALID}
    after = {r.number: r.layout for r in result.records if r.number in before}
    assert after == before
    trials = resumed.store.study.get_trials()
    new = trials[len(first.records):]
    assert any(set(t.params) < set(layouts.free) for t in new)
    assert sum(r.launched for r in result.records) >= old_trials + 8
    for t in new:
        if t.params.get("tp") == 1:
            assert "sequence_parallel" not in t.params


def test_another_searchers_conditional_trial_is_seen_running(tmp_path: Path) -> None:
    # A RUNNING trial that holds fewer parameters than the study's, asked whole (ASKED_ATTR),
    # is a layout being run, not a trial whose parameters are still to come.
    search = Search(_fake_config(tmp_path, FakeBackend(small_cluster()), n_trials=1))
    layouts, study = search.layouts, search.store.study
    s = next(v for v in layouts.valid if v.tp == 1)
    search.store.enqueue(s, Source.USER)
    trial = search.store.ask()
    assert "sequence_parallel" not in trial.params
    running, _, waiting = read_shared(study, layouts.free, trial.number + 1, set(), set(),
                                      run_params_of=layouts.run_params_of)
    assert running == {layouts.run_params(s): trial.number} and waiting == []
    search.store.release()
