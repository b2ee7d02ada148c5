"""How tests/data/old-studies was made: run with the autotune of commit dac948f (before the typed
trial record), from a checkout of that commit:

    python tests/data/old-studies/make.py sqlite:///tests/data/old-studies/study.db
    autotune gpt2 --gpus 2 --backend simulate --study old-plan \
        --space tests/data/old-studies/plan-space.yaml \
        --storage sqlite:///tests/data/old-studies/study.db --results-dir /tmp/old-plan

Both studies share one SQLite file (their schema is most of its size). make.py writes a study
of real-run form (the scripted FakeBackend of tests/doubles over measured-space.yaml) holding
every kind of record that version stored: OK, OOM, PREDICTED_OOM, INVALID, duplicates of
finished trials, a DUPLICATE of a trial another worker was running, and an INTERRUPTED trial
(Ctrl-C mid-run).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for `doubles`

from doubles.fake_backend import GIB, FakeBackend, small_cluster, small_model

from autotune.search.loop import SearchConfig, _Search, run_search
from autotune.search.space import load_space

STUDY = "old-measured"
HERE = Path(__file__).resolve().parent


def main(url: str) -> None:
    cluster = small_cluster()

    def cfg(backend: FakeBackend, **kwargs: object) -> SearchConfig:
        return SearchConfig(model=small_model(), cluster=cluster,
                            space=load_space(str(HERE / "measured-space.yaml")),
                            backend=backend, results_dir=Path("/tmp/old-measured"),
                            storage=url, study_name=STUDY,
                            sampler="tpe", **kwargs)  # type: ignore[arg-type]

    # TPE with a machine that has less memory than predicted: OOMs, predicted OOMs learned from
    # them, INVALID proposals and duplicates; Ctrl-C during the 14th launch: INTERRUPTED.
    backend = FakeBackend(cluster, true_capacity_bytes=9 * GIB, interrupt_on_call=14)
    result = run_search(cfg(backend, n_trials=20))
    assert result.interrupted
    # A worker that finds its layout running in an older trial of another worker: DUPLICATE.
    search = _Search(cfg(FakeBackend(cluster), n_trials=20, resume=True), None)
    search.replay()
    layout = next(s for s in search.valid if search.key(s) not in search.seen
                  and search.gate.decide(s).launch)
    params = {d: getattr(layout, d) for d in search.free}
    search.study.enqueue_trial(params)
    older = search.study.ask(search.distributions)  # the other worker's, still running
    search.study.enqueue_trial(params)
    search.finish(search.study.ask(search.distributions))
    search.finish(older)
    kinds = {r["status"] for t in search.study.get_trials()
             if (r := t.user_attrs.get("record"))}
    assert {"OK", "OOM", "PREDICTED_OOM", "DUPLICATE", "INTERRUPTED"} <= kinds, kinds


if __name__ == "__main__":
    main(sys.argv[1])
