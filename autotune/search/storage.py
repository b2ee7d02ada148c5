"""Where studies live: SQLite under results/<study>/ by default, or any Optuna RDB URL."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection

from autotune.errors import ConfigError
from autotune.hardware import ClusterSpec
from autotune.model import ModelSpec
from autotune.space import SearchSpace

__all__ = ["Heartbeat", "default_study_name", "describe_study", "fail_stale", "heartbeat",
           "open_planning_study", "open_study", "redact_url", "storage_url"]

DIRECTIONS: tuple[StudyDirection, ...] = (StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE)
"""Objectives: tokens/s (whole job) and peak memory per GPU in GiB."""
# Environment overrides exist for tests of shared studies: their worker subprocesses cannot be
# monkeypatched, and a killed worker's trial should go stale in seconds, not a minute.
HEARTBEAT_INTERVAL_S = int(os.environ.get("AUTOTUNE_HEARTBEAT_INTERVAL_S", "10"))
"""Seconds between heartbeats of a running trial (RDB storage)."""
HEARTBEAT_GRACE_S = int(os.environ.get("AUTOTUNE_HEARTBEAT_GRACE_S", "60"))
"""A running trial without a heartbeat for this long is failed by the next open (resume) or,
in a shared study, by any other worker before its next trial (search.store)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """How often a running trial beats, and how long without a beat marks its process dead."""

    interval_s: int = HEARTBEAT_INTERVAL_S
    grace_s: int = HEARTBEAT_GRACE_S


def default_study_name(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace,
                       backend: str, variant: dict[str, Any] | None = None) -> str:
    """`gpt2-xl-8gpu-h100-80gb-worker-1a2b3c4d`: the hash covers everything the candidate
    lists depend on, so a changed space or model never reuses a study by accident. `variant`
    adds what else decides the trials' figures: for a planning study, the sampler and the
    calibration (a plan with other constants or another sampler is another plan)."""
    about: dict[str, Any] = {"model": asdict(model), "gpus": cluster.num_gpus,
                             "per_node": cluster.gpus_per_node, "gpu": cluster.gpu.name,
                             "space": {k: list(v) for k, v in space.candidates.items()},
                             "backend": backend}
    if variant:
        about["variant"] = variant
    key = json.dumps(about, sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{model.name}-{cluster.num_gpus}gpu-{cluster.gpu.name}-{backend}-{digest}"


def storage_url(results_dir: Path, study_name: str, storage: str | None) -> str:
    """The storage URL: `storage` as given, else SQLite at results/<study>/study.db."""
    if storage:
        return storage
    folder = results_dir / study_name
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(folder / 'study.db').resolve()}"


_PASSWORD = re.compile(r"(?P<head>[a-z0-9+]+://[^:/@]+:)(?P<secret>[^@]*)(?P<tail>@)", re.I)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ***, for logs and reports."""
    return _PASSWORD.sub(lambda m: f"{m['head']}***{m['tail']}", url)


def open_study(name: str, url: str, sampler: optuna.samplers.BaseSampler, *,
               resume: bool | None, heartbeat: Heartbeat | None) -> optuna.Study:
    """Create the study, or load it with `resume`; resume=None loads it if it exists, else
    creates it. An existing study is never overwritten. With `heartbeat`, running trials beat
    (see `heartbeat()`) and stale ones are failed now."""
    kwargs: dict[str, object] = {}
    if heartbeat is not None:
        # A trial whose process dies stops beating; after the grace period it is marked FAIL
        # by the next worker or resume (optuna.storages.fail_stale_trials).
        kwargs = {"heartbeat_interval": heartbeat.interval_s, "grace_period": heartbeat.grace_s}
    try:
        with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(url, **kwargs)  # type: ignore[arg-type]
    except Exception as exc:  # SQLAlchemy raises many types for a bad URL or server
        raise ConfigError(f"cannot open storage {redact_url(url)}: "
                          f"{str(exc).splitlines()[0]}") from exc
    exists = name in {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if exists and resume is False:
        raise ConfigError(f"study {name} already exists in {redact_url(url)}; pass --resume to "
                          "continue it or --study NAME for a new one")
    if not exists and resume:
        raise ConfigError(f"--resume: no study {name} in {redact_url(url)}")
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                directions=list(DIRECTIONS), load_if_exists=True)
    if heartbeat is not None:
        fail_stale(study)
    return study


def open_planning_study(name: str, url: str, sampler: optuna.samplers.BaseSampler, *,
                        resume: bool) -> tuple[optuna.Study, optuna.Study, int]:
    """For predictions: an in-memory study holding the stored study's finished trials, the
    stored study, and how many trials the stored one has of the in-memory one."""
    # Predictions cost microseconds; a storage round trip per trial would dominate. The
    # study runs in memory and its trials are written in one pass at the end.
    # Predictions are deterministic: running the same planning job again continues (and
    # so shows) the stored study instead of refusing; --resume stays strict.
    persistent = open_study(name, url, sampler, resume=resume or None, heartbeat=None)
    study = optuna.create_study(directions=list(DIRECTIONS), sampler=sampler)
    finished = [t for t in persistent.get_trials(deepcopy=False) if t.state.is_finished()]
    study.add_trials(finished)
    return study, persistent, len(finished)


def _as_stored(value: Any) -> Any:
    """`value` as it reads back from the study's user attributes (JSON: tuples become lists)."""
    return json.loads(json.dumps(value, default=str))


def _conflict(old: Any, new: Any) -> bool:
    """Whether a stored description contradicts the new one. Dicts are compared on the keys
    both have, so a field added in a later version (absent from old studies) is no conflict."""
    if isinstance(old, dict) and isinstance(new, dict):
        return any(old[k] != new[k] for k in old.keys() & new.keys())
    return bool(old != new)


def describe_study(study: optuna.Study, model: ModelSpec, cluster: ClusterSpec,
                   backend: str) -> None:
    """What the study is about, for report, export and optuna-dashboard.

    A study that already describes another model, machine or backend is refused: its trials
    would be mixed with this run's under this run's name (`--study` reused by mistake).
    """
    about = {"model": _as_stored(asdict(model)), "backend": backend,
             "cluster": {"num_gpus": cluster.num_gpus, "gpus_per_node": cluster.gpus_per_node,
                         "gpu": cluster.gpu.name}}
    stored = study.user_attrs
    differs = [key for key, value in about.items() if key in stored
               and _conflict(stored[key], value)]
    if differs:
        old_model = stored.get("model", {})
        old_cluster = stored.get("cluster", {})
        raise ConfigError(
            f"study {study.study_name} holds {old_model.get('name', '?')} (seq "
            f"{old_model.get('seq_length', '?')}, gbs {old_model.get('global_batch_size', '?')})"
            f" on {old_cluster.get('num_gpus', '?')} x {old_cluster.get('gpu', '?')} "
            f"({old_cluster.get('gpus_per_node', '?')} per node) with backend "
            f"{stored.get('backend', '?')}; this run is {model.name} (seq {model.seq_length}, "
            f"gbs {model.global_batch_size}) on {cluster.num_gpus} x {cluster.gpu.name} "
            f"({cluster.gpus_per_node} per node) with backend {backend}: give another --study "
            "or --results-dir")
    for key, value in about.items():
        study.set_user_attr(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # set_metric_names is experimental in Optuna 5
        study.set_metric_names(["tokens_per_s", "peak_memory_gib"])


def fail_stale(study: optuna.Study) -> None:
    """Mark FAIL the RUNNING trials whose heartbeat stopped (their process died)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


@contextmanager
def heartbeat(trial: optuna.Trial) -> Iterator[None]:
    """Beat for `trial` while the block runs (RDB storage with heartbeats; else nothing).

    Optuna beats only inside `Study.optimize`; a trial driven by ask/tell has no heartbeat, so
    `fail_stale_trials` would never fail it once its process is killed. This beats for it.
    """
    storage = trial.storage
    interval = getattr(storage, "get_heartbeat_interval", lambda: None)()
    if interval is None:
        yield
        return
    trial_id = trial._trial_id
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(timeout=interval):
            storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]

    storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
