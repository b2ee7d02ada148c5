"""Shared studies on a real PostgreSQL server: several searchers, one killed mid-trial.

The server comes from `.ci/postgres.sh start`, which exports AUTOTUNE_TEST_POSTGRES_URL. Without
it these tests are skipped, except in CI (CI=true), where a missing server is a failure.
`test_redact_url_hides_the_password` needs no server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import optuna
import pytest
from doubles.fake_backend import small_model
from doubles.shared_searcher import CLUSTER, shared_space
from optuna.trial import FrozenTrial, TrialState

from autotune.layouts.layout import Layout
from autotune.megatron.identity import representatives
from autotune.search.space import enumerate_space
from autotune.search.storage import redact_url

REPO = Path(__file__).resolve().parents[1]
SEARCHER = Path(__file__).resolve().parent / "doubles" / "shared_searcher.py"
URL_ENV = "AUTOTUNE_TEST_POSTGRES_URL"
# Heartbeats every second; a searcher silent for 3 s is dead. Long enough that a live searcher
# (beating from a thread) is never failed, short enough that the test waits little.
HEARTBEAT_ENV = {"AUTOTUNE_HEARTBEAT_INTERVAL_S": "1", "AUTOTUNE_HEARTBEAT_GRACE_S": "3"}


@pytest.fixture
def pg_url() -> str:
    url = os.environ.get(URL_ENV)
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {URL_ENV} is unset: run `eval \"$(.ci/postgres.sh "
                        "start)\"` before the tests")
        pytest.skip(f"{URL_ENV} is not set (eval \"$(.ci/postgres.sh start)\")")
    return url


@pytest.fixture
def study_name(pg_url: str) -> Iterator[str]:
    """A fresh study in the shared database, deleted afterwards."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    with contextlib.suppress(KeyError):
        optuna.delete_study(study_name=name, storage=pg_url)


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **HEARTBEAT_ENV}


def _searcher(url: str, study: str, log: Path, tmp: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SEARCHER), url, study, str(log),
                             "--results-dir", str(tmp / "results"), *extra],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(what: str, ready: object, procs: list[subprocess.Popen[str]],
              timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        for p in procs:
            if p.poll() is not None:
                out, err = p.communicate()
                pytest.fail(f"a searcher exited ({p.returncode}) before {what}:\n{out}\n"
                            f"{err[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _runs() -> dict[Layout, Layout]:
    """Each valid layout of the shared space -> the layout that runs for it."""
    model = small_model()
    return representatives(model, enumerate_space(shared_space(), model, CLUSTER).valid)


def _layout(t: FrozenTrial) -> str:
    return str(t.user_attrs["record"]["strategy"])


def test_workers_share_a_study_and_retry_the_killed_workers_trial(
        pg_url: str, study_name: str, tmp_path: Path) -> None:
    log, marker = tmp_path / "launches.txt", tmp_path / "blocked"
    layouts = {s.describe() for s in set(_runs().values())}
    # Searcher 0 creates the study; its second launch hangs until it is killed.
    victim = _searcher(pg_url, study_name, log, tmp_path, "--block-on", "2", "--marker",
                     str(marker))
    procs = [victim]
    try:
        _wait_for("the study exists", lambda: study_name in optuna.get_all_study_names(
            pg_url), procs)
        procs += [_searcher(pg_url, study_name, log, tmp_path, "--resume") for _ in range(2)]
        _wait_for("searcher 0 blocks inside a trial", marker.exists, procs)
        # Let the others get going, so that they run beside the doomed trial.
        _wait_for("the other searchers launch", lambda: len(log.read_text().splitlines()) >= 4,
                  procs)
        study = optuna.load_study(study_name=study_name, storage=pg_url)
        killed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                  if _layout_of_running(t) == marker.read_text()]
        assert len(killed) == 1, "the blocked trial is not RUNNING in the storage"
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        for p in procs[1:]:
            out, err = p.communicate(timeout=45)
            assert p.returncode == 0, f"{out}\n{err[-3000:]}"
            assert "every layout of the grid was tried" in out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()

    trials = optuna.load_study(study_name=study_name,
                               storage=pg_url).get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state is TrialState.RUNNING]
    dead = next(t for t in trials if t.number == killed[0].number)
    assert dead.state is TrialState.FAIL

    # Launches, from every process: each layout once, except the killed one (twice).
    launches = Counter(line.split(" ", 1)[1] for line in log.read_text().splitlines())
    assert set(launches) == layouts
    assert {k: n for k, n in launches.items() if n > 1} == {marker.read_text(): 2}
    pids = {line.split(" ", 1)[0] for line in log.read_text().splitlines()}
    assert len(pids) == 3, "every searcher launched trials"

    # The study: every layout COMPLETE exactly once as a launched (non-duplicate) trial, the
    # killed layout by another searcher, after the kill.
    done = [t for t in trials if t.state is TrialState.COMPLETE
            and t.user_attrs["record"].get("duplicate_of") is None]
    assert Counter(_layout(t) for t in done) == Counter(dict.fromkeys(layouts, 1))
    retried = next(t for t in done if _layout(t) == marker.read_text())
    assert retried.number > dead.number
    # Trials told as duplicates point at a real trial of the same layout.
    by_number = {t.number: t for t in trials}
    for t in trials:
        record = t.user_attrs.get("record", {})
        if record.get("duplicate_of") is not None:
            assert _layout(by_number[record["duplicate_of"]]) == _layout(t)


def _layout_of_running(t: FrozenTrial) -> str | None:
    """A RUNNING trial has no record yet: its layout, rebuilt from its parameters."""
    for s in enumerate_space(shared_space(), small_model(), CLUSTER).valid:
        if all(getattr(s, k) == v for k, v in t.params.items()):
            return _runs()[s].describe()
    return None


# -- passwords stay out of everything autotune writes -----------------------------------------


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://user:secret@host/db",
    "postgresql://user:secret@host:5432/db?sslmode=require",
    "mysql+pymysql://u:secret@127.0.0.1/optuna",
])
def test_redact_url_hides_the_password(url: str) -> None:
    redacted = redact_url(url)
    assert "secret" not in redacted and "***" in redacted
    assert redacted.split("***")[0] == url.split("secret")[0]


def _autotune(*args: str, cwd: Path, rc: int = 0) -> str:
    """`autotune ARGS` in a fresh interpreter: its stdout and stderr, after checking its exit
    code (the output is not shown on failure: it is the thing that may hold the password)."""
    code = "import sys\nfrom autotune.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=_env())
    text = proc.stdout + proc.stderr
    password = urlsplit(os.environ[URL_ENV]).password or "\0"
    assert proc.returncode == rc, f"autotune {args[0]}: exit {proc.returncode}\n" + \
        text.replace(password, "<PASSWORD>")[-3000:]
    return text


def test_no_output_or_file_shows_the_storage_password(pg_url: str, study_name: str,
                                                      tmp_path: Path) -> None:
    parts = urlsplit(pg_url)
    password = parts.password
    assert password, f"{URL_ENV} needs a password for this test"
    results = str(tmp_path / "results")
    # 16 layouts, 14 distinct runs (the distributed optimizer is nothing at tp2 pp2 dp1): the
    # simulated study is written to the server in one pass, kept small.
    space = tmp_path / "space.yaml"
    space.write_text("tp: [1, 2]\npp: [1, 2]\nmbs: [1, 2]\ndistributed_optimizer: [false, true]\n"
                     "sequence_parallel: [false]\nrecompute: [none]\nimpl: [sdpa]\n")
    common = ("--storage", pg_url, "--study", study_name, "--results-dir", results)
    search = ("search", "gpt2-medium", "--gpus", "4", "--backend", "simulate", "--space",
              str(space))
    outputs = [
        _autotune(*search, "--sampler", "grid", "--debug", *common, cwd=tmp_path),
        # An error names the storage: --resume of a study that is not there.
        _autotune(*search, "--resume", "--storage", pg_url, "--study", "no-such-study",
                  "--results-dir", results, cwd=tmp_path, rc=2),
        _autotune("report", "--model", "gpt2-medium", *common, cwd=tmp_path),
        _autotune("export", "--format", "torchrun", "--model", "gpt2-medium", "-o",
                  str(tmp_path / "launch.sh"), *common, cwd=tmp_path),
        _autotune("export", "--format", "json", *common, cwd=tmp_path),
        # A server that is not there: the connection error names the URL.
        _autotune("report", "--storage", parts._replace(
            netloc=f"{parts.username}:{password}@127.0.0.1:1").geturl(),
                  "--study", study_name, "--results-dir", results, cwd=tmp_path, rc=2),
    ]
    for i, text in enumerate(outputs):
        assert password not in text, f"command {i} printed the password"
    assert "14 trials simulated" in outputs[0]
    assert "--resume: no study" in outputs[1] and "***" in outputs[1]
    assert "***" in outputs[5]
    assert (tmp_path / "launch.sh").exists()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) > 2, "report wrote nothing"
    for path in written:
        assert password.encode() not in path.read_bytes(), f"{path} holds the password"


# -- the same rules on SQLite (no server needed) ----------------------------------------------


def test_a_layout_running_in_a_dead_worker_is_waited_for_then_retried(tmp_path: Path) -> None:
    """A RUNNING trial of another (here: simulated, then silent) searcher holds its layout until
    its heartbeat goes stale; then this searcher fails it and runs the layout itself."""
    from doubles.fake_backend import FakeBackend

    from autotune.search import SearchConfig
    from autotune.search.lock import lock_study
    from autotune.search.loop import Search
    from autotune.search.storage import Heartbeat, open_study, storage_url

    # The grace is long enough that the held trial is still fresh when the search starts on a
    # loaded 2-core CI machine (with 1 s it went stale before the first ask once, and ran in
    # grid order).
    beat = Heartbeat(interval_s=1, grace_s=4)
    url = storage_url(tmp_path, "s", None)
    study = open_study("s", url, optuna.samplers.RandomSampler(), resume=False, heartbeat=beat)
    held = enumerate_space(shared_space(), small_model(), CLUSTER).valid[5]
    free = {"tp": held.tp, "pp": held.pp, "mbs": held.mbs,
            "distributed_optimizer": held.distributed_optimizer}
    study.enqueue_trial(free)
    dists = {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in
             {"tp": (1, 2), "pp": (1, 2), "mbs": (1, 2),
              "distributed_optimizer": (False, True)}.items()}
    with warnings.catch_warnings():  # heartbeats "belong to Study.optimize"; we beat by hand
        warnings.simplefilter("ignore", UserWarning)
        dead = study.ask(dists)
    study._storage.record_heartbeat(dead._trial_id)  # type: ignore[attr-defined]

    backend = FakeBackend(CLUSTER)
    # The simulated searcher holds the study as a live one would: a search alone on an SQLite
    # study fails every RUNNING trial at once (storage.fail_orphans).
    other = lock_study("s", url)
    try:
        result = Search(SearchConfig(model=small_model(), cluster=CLUSTER,
                                     space=shared_space(), backend=backend,
                                     results_dir=tmp_path, study_name="s", sampler="grid",
                                     resume=True, finalists=0), heartbeat=beat).run()
    finally:
        if other is not None:
            other.release()
    assert result.stop_reason == "every layout of the grid was tried"
    assert Counter(s.describe() for s in backend.calls) == Counter(
        s.describe() for s in set(_runs().values()))
    assert backend.calls[-1] == _runs()[held], "the held layout waited for its searcher"
    trials = optuna.load_study(study_name="s", storage=url).get_trials(deepcopy=False)
    assert trials[dead.number].state is TrialState.FAIL
    assert not [t for t in trials if t.state is TrialState.RUNNING]


def _fresh_schema_url(url: str, schema: str) -> str:
    """`url` with its tables in `schema` (PostgreSQL search_path), an empty database of its own."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def test_workers_started_together_on_an_empty_database_all_open_it(pg_url: str) -> None:
    """Shared workers launched at once (a Slurm array) each create Optuna's tables in an empty
    database; those that lose the race open it again instead of exiting."""
    import threading

    import sqlalchemy

    from autotune.search.storage import open_storage

    workers = 8  # without the retry, 8 threads lost the race in 3 runs of 3
    schema = f"race_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    url = _fresh_schema_url(pg_url, schema)
    start = threading.Barrier(workers)
    opened: list[object] = []
    failed: list[BaseException] = []

    def open_it() -> None:
        start.wait()
        try:
            opened.append(open_storage(url))
        except BaseException as exc:  # reported below, with its message
            failed.append(exc)

    try:
        threads = [threading.Thread(target=open_it) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not failed, [str(e) for e in failed]
        assert len(opened) == workers
        study = optuna.create_study(storage=url, study_name="race")
        assert [s.study_name for s in optuna.get_all_study_summaries(url)] == [study.study_name]
    finally:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()
