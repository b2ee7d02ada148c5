"""Several searchers on one study: what the others have finished, and what they are running.

Each searcher keeps its own queue; the storage is the one truth. Before each launch a searcher
re-reads it (autotune.search.store, RealRunStore.sync) with `read_shared`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.search.layout_map import ASKED_ATTR, FrozenParams, freeze_params

__all__ = ["PARAMS_WAIT_S", "SHARED_POLL_S", "read_shared"]

SHARED_POLL_S = 0.5
"""A searcher whose queued layouts are all running in other searchers looks again this often."""
PARAMS_WAIT_S = 2.0
"""How long to wait for an older RUNNING trial's parameters to appear (RealRunStore.sync)."""


def read_shared(study: optuna.Study, free: dict[str, tuple[Any, ...]], mine: int | None,
                known: set[int], paramless: set[int],
                run_params_of: Callable[[dict[str, Any]], FrozenParams] = freeze_params,
                ) -> tuple[dict[FrozenParams, int], list[FrozenTrial], list[int]]:
    """One look at the study from the searcher of trial `mine`: the layouts of the other RUNNING
    trials (by `run_params_of` their parameters), each with the smallest trial number running
    it; the finished trials with a record not in `known`; and the older RUNNING trials still
    without parameters, less `paramless`."""
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    running: dict[FrozenParams, int] = {}
    finished: list[FrozenTrial] = []
    waiting: list[int] = []
    for t in study.get_trials(deepcopy=False, states=states):
        if t.number == mine:
            continue
        if t.state is TrialState.RUNNING:
            # An enqueued layout is known from its creation (fixed_params).
            # A trial of LayoutMap.ask holds only the parameters it was asked (ASKED_ATTR).
            asked = bool(t.user_attrs.get(ASKED_ATTR))
            params = t.params if asked or len(t.params) == len(free) else \
                t.system_attrs.get("fixed_params", {})
            if not asked and not set(free) <= set(params):
                if mine is not None and t.number < mine and t.number not in paramless:
                    waiting.append(t.number)
                continue
            run = run_params_of({d: params[d] for d in free if d in params})
            running[run] = min(running.get(run, t.number), t.number)
        elif t.number not in known and t.user_attrs.get("record"):
            finished.append(t)
    return running, finished, waiting
