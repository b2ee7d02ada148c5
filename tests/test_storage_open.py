"""Opening a study storage: workers that start together on an empty database race to create
Optuna's tables; the losers open again instead of failing (autotune.search.storage)."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from autotune.errors import ConfigError
from autotune.search import storage

PG_RACE = IntegrityError(
    "CREATE TABLE alembic_version", {},
    Exception('duplicate key value violates unique constraint "pg_type_typname_nsp_index"'))
PG_DUPLICATE = ProgrammingError("CREATE TABLE studies", {},
                                Exception('relation "studies" already exists'))
SQLITE_DUPLICATE = OperationalError("CREATE TABLE studies", {},
                                    Exception("table studies already exists"))
REFUSED = OperationalError("connect", {}, Exception("connection refused"))
OTHER_INTEGRITY = IntegrityError("INSERT", {}, Exception('duplicate key "studies_pkey"'))


class _Flaky:
    """Stands in for optuna.storages.RDBStorage: raises `errors` in turn, then opens."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self, url: str, **_: object) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return f"opened {url}"


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage.time, "sleep", lambda _s: None)


@pytest.mark.parametrize(("errors", "calls"), [
    ([], 1),
    ([PG_RACE], 2),
    ([PG_DUPLICATE, PG_RACE], 3),
    ([SQLITE_DUPLICATE], 2),
])
def test_a_lost_schema_race_opens_again(monkeypatch: pytest.MonkeyPatch, no_sleep: None,
                                        errors: list[Exception], calls: int) -> None:
    flaky = _Flaky(errors)
    monkeypatch.setattr(storage.optuna.storages, "RDBStorage", flaky)
    assert storage.open_storage("postgresql+psycopg://u:pw@h/db") == \
        "opened postgresql+psycopg://u:pw@h/db"
    assert flaky.calls == calls


@pytest.mark.parametrize(("errors", "calls"), [
    ([REFUSED], 1),                                        # not a race: fails at once
    ([OTHER_INTEGRITY], 1),                                # a unique violation of a row
    ([PG_RACE] * storage.SCHEMA_RACE_ATTEMPTS, storage.SCHEMA_RACE_ATTEMPTS),  # gives up
])
def test_other_failures_are_one_line_and_not_retried(monkeypatch: pytest.MonkeyPatch,
                                                     no_sleep: None, errors: list[Exception],
                                                     calls: int) -> None:
    flaky = _Flaky(errors)
    monkeypatch.setattr(storage.optuna.storages, "RDBStorage", flaky)
    with pytest.raises(ConfigError) as err:
        storage.open_storage("postgresql+psycopg://u:secret@h/db")
    assert flaky.calls == calls
    assert "\n" not in str(err.value) and "secret" not in str(err.value)
    assert str(err.value).startswith("cannot open storage postgresql+psycopg://u:***@h/db: ")
