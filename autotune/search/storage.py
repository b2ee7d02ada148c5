"""Where studies live: SQLite under results/<study>/ by default, or any Optuna RDB URL."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote_plus

import optuna
from optuna.study import StudyDirection

from autotune.errors import ConfigError, StorageError
from autotune.inputs.untrusted import for_terminal
from autotune.search.space import SearchSpace
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_RESULTS_DIR",
    "STUDY_NAME_MAX",
    "Heartbeat",
    "PlanningStudies",
    "as_stored",
    "check_results_dir",
    "check_storage_url",
    "check_study_name",
    "default_study_name",
    "describe_study",
    "fail_orphans",
    "fail_stale",
    "heartbeat",
    "open_planning_study",
    "open_storage",
    "open_study",
    "redact_url",
    "storage_errors",
    "storage_url",
]

DIRECTIONS: tuple[StudyDirection, ...] = (StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE)
"""Objectives: tokens/s (whole job) and peak memory per GPU in GiB."""
# Environment overrides exist for tests of shared studies: their searcher subprocesses cannot be
# monkeypatched, and a killed searcher's trial should go stale in seconds, not a minute.
HEARTBEAT_INTERVAL_S = int(os.environ.get("AUTOTUNE_HEARTBEAT_INTERVAL_S", "10"))
"""Seconds between heartbeats of a running trial (RDB storage)."""
HEARTBEAT_GRACE_S = int(os.environ.get("AUTOTUNE_HEARTBEAT_GRACE_S", "60"))
"""A running trial without a heartbeat for this long is failed by the next open (resume) or,
in a shared study, by any other searcher before its next trial (search.store)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """How often a running trial beats, and how long without a beat marks its process dead."""

    interval_s: int = HEARTBEAT_INTERVAL_S
    grace_s: int = HEARTBEAT_GRACE_S


DEFAULT_RESULTS_DIR = "results"
"""Where studies go without --results-dir (relative to the working folder)."""
STUDY_NAME_MAX = 100
"""Characters of a study name: it is a folder name, and it appears in scripts and reports."""
_NAME_RULE = (f"a study name (a folder under --results-dir) is 1-{STUDY_NAME_MAX} letters, "
              "digits, '.', '_' or '-', starting with a letter or digit")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _shown(text: str, limit: int = 40) -> str:
    """`text` for a one-line message: quoted, escapes for control characters, cut when long."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_study_name(name: str, what: str = "study name") -> str:
    """`name` if it is a safe study name, else ConfigError in one line.

    A study name becomes a folder under --results-dir and appears in exported scripts and
    report.md, so it is held to a character set that is safe in all three: no path separator,
    no `.`/`..`, no shell or Markdown syntax, no control character.
    """
    if not name:
        raise ConfigError(f"{what} is empty; {_NAME_RULE}")
    if len(name) > STUDY_NAME_MAX:
        raise ConfigError(f"{what} {_shown(name)} has {len(name)} characters; {_NAME_RULE}")
    bad = _UNSAFE.search(name)
    if bad is not None:
        raise ConfigError(f"{what} {_shown(name)} contains {bad.group()!r}; {_NAME_RULE}")
    if not name[0].isalnum():
        raise ConfigError(f"{what} {_shown(name)} starts with {name[0]!r}; {_NAME_RULE}")
    return name


def check_results_dir(path: str | Path, *, writable: bool = True) -> Path:
    """--results-dir as a Path, refused in one line when it (or a folder on its way) is a
    file, it holds a control character, or (`writable`) it could not be written or created.
    Nothing is created here: a search makes its study's folder once it starts."""
    text = str(path)
    if not text or not text.isprintable():
        raise ConfigError(f"--results-dir {_shown(text)} is not a usable folder name (empty or "
                          "with a control character)")
    folder = Path(text)
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "" if existing == folder else f": {existing}"
        raise ConfigError(f"--results-dir {text}{where} is a file, not a folder")
    if writable and existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--results-dir {text} is not writable" if existing == folder else
                          f"--results-dir {text} cannot be created: {existing} is not writable")
    return folder


def _name_part(text: str, limit: int) -> str:
    """`text` (a model name) reduced to the study-name character set, at most `limit` long."""
    part = _UNSAFE.sub("-", text)
    part = re.sub(r"-{2,}", "-", part).strip("-._")[:limit].rstrip("-._")
    return part or "model"


_ADDED_MODEL_FIELDS: dict[str, Any] = {"sliding_window": None, "kv_channels": None,
                                        "add_qkv_bias": False, "qk_layernorm": False,
                                        "moe_shared_expert_intermediate_size": None,
                                        "moe_shared_expert_gate": False,
                                        "multi_latent_attention": False, "q_lora_rank": None,
                                        "kv_lora_rank": None, "qk_head_dim": None,
                                        "qk_pos_emb_head_dim": None, "v_head_dim": None,
                                        "rotary_percent": 1.0, "apply_layernorm_1p": False,
                                        "moe_layer_freq": 1, "mtp_num_layers": 0,
                                        "mtp_loss_scaling_factor": None}
"""ModelSpec fields newer than the first studies, with the value every earlier model had: left
out of the study name's digest at that value, so the studies written before them keep their
names (`--resume` finds them)."""


def default_study_name(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace,
                       backend: str, variant: dict[str, Any] | None = None) -> str:
    """`gpt2-xl-8gpu-h100-80gb-worker-1a2b3c4d`: the hash covers everything the candidate
    lists depend on, so a changed space or model never reuses a study by accident. `variant`
    adds what else decides the trials' figures: for a planning study, the sampler and the
    calibration (a plan with other constants or another sampler is another plan)."""
    # Fields added to ModelSpec later are left out at their old value: the names of the studies
    # written before them stay the same.
    described = {k: v for k, v in asdict(model).items()
                 if not (k in _ADDED_MODEL_FIELDS and v == _ADDED_MODEL_FIELDS[k])}
    about: dict[str, Any] = {"model": described, "gpus": cluster.num_gpus,
                             "per_node": cluster.gpus_per_node, "gpu": cluster.gpu.name,
                             "space": {k: list(v) for k, v in space.candidates.items()},
                             "backend": backend}
    if variant:
        about["variant"] = variant
    key = json.dumps(about, sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    # A model name is free text (its YAML file's `name:`): only its safe characters are kept.
    tail = f"-{cluster.num_gpus}gpu-{cluster.gpu.name}-{backend}-{digest}"
    name = _name_part(model.name, STUDY_NAME_MAX - len(tail)) + tail
    return check_study_name(name)


def storage_url(results_dir: Path, study_name: str, storage: str | None) -> str:
    """The storage URL: `storage` as given, else SQLite at results/<study>/study.db. The study
    name must be safe (check_study_name): its folder is results/<study>/ either way."""
    check_study_name(study_name)
    if storage:
        return storage
    folder = results_dir / study_name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the study folder {folder} "
                          f"({exc.strerror or exc}); check --results-dir") from None
    return f"sqlite:///{(folder / 'study.db').resolve()}"


# SQLAlchemy's URL: dialect+driver://user[:password]@host[:port]/database[?key=value&...]. Its
# parser takes the user as [^:/]* and the password as [^@]*, so a password may hold '/', '?',
# ':' or '#', and a raw '@' in it ends the password early (the rest reads as the host).
_USER = re.compile(r"[^:/]*:")
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|key|auth|cred|sig", re.I)
_SECRET_SETTING = re.compile(r"(pass|pwd|secret|token)\w*\s*=", re.I)


def _redact_query(query: str) -> str:
    parts = []
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        # A value may carry a setting of its own (libpq's options=-c password=...).
        secret = eq and (_SECRET_KEY.search(unquote_plus(key))
                         or _SECRET_SETTING.search(unquote_plus(value)))
        parts.append(f"{key}=***" if secret else item)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """The URL with its password and secret query values (password=, sslpassword=, token=,
    ...; percent-encoded keys too) replaced by ***, for logs, messages and reports.

    Everything between `user:` and the last '@' is the password: a raw '@' in a password
    (which SQLAlchemy would misread) is hidden whole. Errs toward hiding more.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    user = _USER.match(rest)
    head = ""
    if user is not None and "@" in rest[user.end():]:
        head = rest[:user.end()] + "***@"
        rest = rest[rest.rindex("@") + 1:]
    address, question, query = rest.partition("?")
    if question:
        rest = f"{address}?{_redact_query(query)}"
    return f"{scheme}://{head}{rest}"


def check_storage_url(url: str) -> str:
    """`url` if SQLAlchemy can read it as a database URL, else ConfigError in one line that
    shows it redacted. A raw '@' in the password is refused: SQLAlchemy would take what
    follows it for the host and name it in its connection errors."""
    from sqlalchemy.engine import make_url

    if not url.isprintable():
        raise ConfigError(f"--storage {_shown(redact_url(url))} holds a control character")
    try:
        parsed = make_url(url)
    except Exception:  # SQLAlchemy raises ArgumentError, ValueError, ... for a malformed URL
        raise ConfigError(f"--storage {redact_url(url)} is not a database URL "
                          "(dialect+driver://user:password@host/database)") from None
    if "@" in (parsed.host or ""):
        raise ConfigError(f"--storage {redact_url(url)}: a user name or password with '@' "
                          "must be percent-encoded (%40)")
    return url


def open_storage(url: str, heartbeat: Heartbeat | None = None) -> optuna.storages.RDBStorage:
    """The RDB storage at `url` (ConfigError in one line when it cannot be opened); with
    `heartbeat`, the trials of its studies beat (see `heartbeat()`)."""
    kwargs: dict[str, object] = {}
    if heartbeat is not None:
        # A trial whose process dies stops beating; after the grace period it is marked FAIL
        # by the next searcher or resume (optuna.storages.fail_stale_trials).
        kwargs = {"heartbeat_interval": heartbeat.interval_s, "grace_period": heartbeat.grace_s}
    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, **kwargs)  # type: ignore[arg-type]
        except Exception as exc:  # SQLAlchemy raises many types for a bad URL or server
            if _lost_schema_race(exc) and attempt + 1 < SCHEMA_RACE_ATTEMPTS:
                # Shared workers started together on an empty database each create Optuna's
                # tables (metadata.create_all checks, then creates: not atomic); the losers'
                # CREATE fails on the winner's table. Opening again finds the tables made.
                log.info("storage %s: another worker created the schema; opening again",
                         redact_url(url))
                time.sleep(0.2 * (attempt + 1))
                continue
            raise ConfigError(f"cannot open storage {redact_url(url)}: "
                              f"{str(exc).splitlines()[0]}") from exc
    raise AssertionError("unreachable: the last attempt returns or raises")


# Opening attempts when another worker is creating the schema at the same moment; each
# loser waits 0.2 s more than the last (0.2 + 0.4 + 0.6 + 0.8 s), far longer than a create.
SCHEMA_RACE_ATTEMPTS = 5


def _lost_schema_race(exc: BaseException) -> bool:
    """Whether `exc` is a schema object that another connection created first: PostgreSQL
    reports a table or its row type made concurrently as a unique violation on pg_type
    (IntegrityError) or as DuplicateTable; MySQL and SQLite as 'already exists'."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    if not isinstance(exc, IntegrityError | ProgrammingError | OperationalError):
        return False
    text = str(exc)
    return "already exists" in text or "pg_type_typname_nsp_index" in text


def open_study(name: str, url: str, sampler: optuna.samplers.BaseSampler, *,
               resume: bool | None, heartbeat: Heartbeat | None,
               storage: optuna.storages.RDBStorage | None = None) -> optuna.Study:
    """Create the study, or load it with `resume`; resume=None loads it if it exists, else
    creates it. An existing study is never overwritten. With `heartbeat`, running trials beat
    (see `heartbeat()`) and stale ones are failed now. `storage`: `url`'s storage, opened by
    the caller (open_storage) where it needs it again (Optuna's Study does not hand it out)."""
    if storage is None:
        storage = open_storage(url, heartbeat)
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


def _hint(text: str, *, reading: bool) -> str:
    """What to do about a storage failure whose root message is `text`."""
    if "full" in text or "No space left" in text:
        return ("free disk space, then try again" if reading
                else "free disk space, then --resume continues the study")
    if reading:
        if "locked" in text or "busy" in text:
            return "another process is writing it: try again once that has finished"
        if "malformed" in text or "not a database" in text:
            return "the database file is damaged: restore it from a copy"
        return "check that the database can be reached, then try again"
    return "--resume continues the study once it can be written again"


@contextmanager
def storage_errors(url: str, *, reading: bool = False) -> Iterator[None]:
    """Optuna's StorageInternalError and SQLAlchemy's errors (`database or disk is full`,
    `database is locked`, a damaged file, a server that went away) as one StorageError line
    that names the storage and says what to do; `reading`: the block only reads the study
    (report, export), so nothing of it is left to resume."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except (optuna.exceptions.StorageInternalError, SQLAlchemyError) as exc:
        cause: BaseException = exc
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
        text = " ".join(str(getattr(cause, "orig", None) or cause).split())[:200]
        what = "read" if reading else "written"
        raise StorageError(f"the study's storage {redact_url(url)} could not be {what} "
                           f"({for_terminal(text)}); {_hint(text, reading=reading)}") from exc


def fail_orphans(study: optuna.Study, *, everything: bool, grace_s: float) -> list[int]:
    """Mark FAIL the RUNNING trials no process will finish, and return their numbers.

    A process killed while the sampler ran (before the trial's first heartbeat) leaves a
    RUNNING trial that fail_stale never sees: Optuna fails only trials that have beaten.
    With `everything` (an SQLite study this process alone holds: autotune.search.lock) every
    RUNNING trial is such a one; in a shared study, one still without parameters that started
    more than `grace_s` ago (a live searcher's sampler sets them within seconds)."""
    from optuna.trial import TrialState

    now = datetime.datetime.now()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        started = trial.datetime_start
        old = started is None or (now - started).total_seconds() > grace_s
        if everything or (old and not trial.params):
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
            failed.append(trial.number)
    if failed:
        log.info("autotune: failed trial(s) %s, left RUNNING by a process that ended "
                 "without finishing them", ", ".join(map(str, failed)))
    return failed


class PlanningStudies(NamedTuple):
    """What a planning search works on (open_planning_study)."""

    memory: optuna.Study
    """In memory: the stored study's finished trials, then the plan's."""
    stored: optuna.Study
    persisted: int
    """How many trials of `memory` the stored study has."""
    storage: optuna.storages.RDBStorage
    """The stored study's storage, where the plan's trials are written in one pass
    (autotune.search.bulk)."""


def open_planning_study(name: str, url: str, sampler: optuna.samplers.BaseSampler, *,
                        resume: bool) -> PlanningStudies:
    """For predictions: an in-memory study holding the stored study's finished trials, the
    stored study, how many trials the stored one has of the in-memory one, and its storage."""
    # Predictions cost microseconds; a storage round trip per trial would dominate. The
    # study runs in memory and its trials are written in one pass at the end.
    # Predictions are deterministic: running the same planning job again continues (and
    # so shows) the stored study instead of refusing; --resume stays strict.
    storage = open_storage(url)
    persistent = open_study(name, url, sampler, resume=resume or None, heartbeat=None,
                            storage=storage)
    study = optuna.create_study(directions=list(DIRECTIONS), sampler=sampler)
    finished = [t for t in persistent.get_trials(deepcopy=False) if t.state.is_finished()]
    study.add_trials(finished)
    return PlanningStudies(study, persistent, len(finished), storage)


def as_stored(value: Any) -> Any:
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
    about = {"model": as_stored(asdict(model)), "backend": backend,
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
    # The trial's storage id, through the storage's public lookups (Trial keeps it private).
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(trial.study.study_name), trial.number)
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
