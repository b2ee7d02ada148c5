"""Storage URLs never show a secret (issue 14, item 6): redact_url hides the password in every
form SQLAlchemy accepts, and secret query values; a raw '@' in a password is refused in one line
rather than half printed."""

from __future__ import annotations

from urllib.parse import unquote_plus

import pytest
from sqlalchemy.engine import make_url

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.search.storage import check_storage_url, redact_url

# (URL, what redact_url makes of it)
CASES: list[tuple[str, str]] = [
    ("postgresql+psycopg://user:s3cret@host/db", "postgresql+psycopg://user:***@host/db"),
    ("postgresql://user:s3cret@host:5432/db?sslmode=require",
     "postgresql://user:***@host:5432/db?sslmode=require"),
    ("mysql+pymysql://u:s3cret@127.0.0.1/optuna", "mysql+pymysql://u:***@127.0.0.1/optuna"),
    ("postgresql://u:s3cret@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
    ("postgresql://:s3cret@host/db", "postgresql://:***@host/db"),
    ("postgresql://u:@host/db", "postgresql://u:***@host/db"),
    # A raw '@' (SQLAlchemy would end the password at the first one): hidden whole.
    ("postgresql://user:p@ss@host/db", "postgresql://user:***@host/db"),
    ("postgresql://user:a@b@c@host:5432/db", "postgresql://user:***@host:5432/db"),
    # Other characters SQLAlchemy keeps in a password: '/', '?', ':', '#', '&', '='.
    ("postgresql://user:pa/ss@host/db", "postgresql://user:***@host/db"),
    ("postgresql://user:pa?ss=1@host/db", "postgresql://user:***@host/db"),
    ("postgresql://user:pa:ss@host/db", "postgresql://user:***@host/db"),
    ("postgresql://user:pa#ss&x=y@host/db", "postgresql://user:***@host/db"),
    ("postgresql://user:pa://ss@host/db", "postgresql://user:***@host/db"),
    # Percent-encoded forms.
    ("postgresql://user:p%40ss%2Fw%3Ard@host/db", "postgresql://user:***@host/db"),
    ("postgresql://us%3Aer:s3cret@host/db", "postgresql://us%3Aer:***@host/db"),
    ("postgresql://u%40corp:s3cret@host/db", "postgresql://u%40corp:***@host/db"),
    ("postgresql://u@corp:s3cret@host/db", "postgresql://u@corp:***@host/db"),
    # Secrets in the query string, whatever the key's case or encoding.
    ("postgresql://user@host/db?password=s3cret", "postgresql://user@host/db?password=***"),
    ("postgresql://host/db?sslmode=require&password=s3cret&application_name=autotune",
     "postgresql://host/db?sslmode=require&password=***&application_name=autotune"),
    ("postgresql://host/db?PASSWORD=s3cret", "postgresql://host/db?PASSWORD=***"),
    ("postgresql://host/db?pass%77ord=s3cret", "postgresql://host/db?pass%77ord=***"),
    ("postgresql://host/db?sslpassword=s3cret", "postgresql://host/db?sslpassword=***"),
    ("mysql://host/db?passwd=s3cret", "mysql://host/db?passwd=***"),
    ("mssql+pyodbc://host/db?pwd=s3cret&driver=x", "mssql+pyodbc://host/db?pwd=***&driver=x"),
    ("postgresql://host/db?token=s3cret", "postgresql://host/db?token=***"),
    ("postgresql://host/db?access_token=s3cret", "postgresql://host/db?access_token=***"),
    ("postgresql://host/db?api_key=s3cret", "postgresql://host/db?api_key=***"),
    ("postgresql://host/db?client_secret=s3cret", "postgresql://host/db?client_secret=***"),
    ("postgresql://host/db?password=s3cret&password=s3cret2",
     "postgresql://host/db?password=***&password=***"),
    ("postgresql://host/db?options=-c%20password%3Ds3cret",
     "postgresql://host/db?options=***"),
    ("mssql+pyodbc:///?odbc_connect=DRIVER%3D%7BODBC%7D%3BSERVER%3Dh%3BPWD%3Ds3cret",
     "mssql+pyodbc:///?odbc_connect=***"),
    ("postgresql://u:s3cret@host/db?password=s3cret2",
     "postgresql://u:***@host/db?password=***"),
    # Nothing secret: unchanged.
    ("postgresql://user@host/db", "postgresql://user@host/db"),
    ("postgresql://user@host:5432/db?sslmode=require",
     "postgresql://user@host:5432/db?sslmode=require"),
    ("sqlite:///results/s/study.db", "sqlite:///results/s/study.db"),
    ("sqlite:////tmp/a@b/study.db", "sqlite:////tmp/a@b/study.db"),
    ("sqlite:////tmp/x:y/study.db", "sqlite:////tmp/x:y/study.db"),
    ("not a url", "not a url"),
]


@pytest.mark.parametrize(("url", "expected"), CASES)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize("url", [u for u, _ in CASES])
def test_nothing_sqlalchemy_reads_as_secret_survives(url: str) -> None:
    """Whatever SQLAlchemy itself takes for the password or a secret query value is gone."""
    redacted = redact_url(url)
    assert "s3cret" not in redacted and "p@ss" not in redacted
    try:
        parsed = make_url(url)
    except Exception:
        return
    if parsed.password is not None:
        assert ":***@" in redacted
    for key, value in parsed.query.items():
        if any(word in key.lower() for word in ("pass", "pwd", "token", "secret", "key")):
            assert f"{key}=***" in unquote_plus(redacted), value
    assert redact_url(redacted) == redacted  # idempotent: redacting twice changes nothing


@pytest.mark.parametrize("url", ["postgresql://user:p@ss@host/db",
                                 "postgresql+psycopg://u:a@b@c@localhost:5432/optuna"])
def test_a_raw_at_in_the_password_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match=r"percent-encoded \(%40\)") as info:
        check_storage_url(url)
    message = str(info.value)
    assert "ss@" not in message and "b@c" not in message and len(message.splitlines()) == 1


@pytest.mark.parametrize("url", ["postgresql://user:p%40ss@host/db",
                                 "sqlite:////tmp/a@b/study.db",
                                 "postgresql+psycopg://u@corp:pw@host/db"])
def test_well_formed_urls_pass(url: str) -> None:
    assert check_storage_url(url) == url


def test_connection_errors_show_no_secret(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psycopg")
    url = "postgresql+psycopg://u:s3cret@127.0.0.1:1/db?password=s3cret2&connect_timeout=2"
    code = main(["export", "--format", "json", "--storage", url])
    out, err = capsys.readouterr()
    assert code == 2
    assert "s3cret" not in out + err
    assert err.startswith("autotune: error: cannot open storage postgresql+psycopg://u:***@")
    assert len(err.splitlines()) == 1
