"""A database password never reaches a line a process writes: refusals, errors, logs."""

from __future__ import annotations

import logging
import sys

import psycopg
import pytest
from pydantic import SecretStr, ValidationError

from connectors import cli
from connectors.startup import MaskingFormatter, describe_connection_failure, mask_secrets
from streams.kernel.settings import PostgresSettings

SECRET = "hunter2-Secr3t"


@pytest.mark.parametrize(
    "text",
    [
        f"postgresql://app:{SECRET}@db:5432/app",
        f"postgres://app:{SECRET}@db/app",
        f"postgresql://app:p@{SECRET}@db/app",  # an "@" in the password
        f'missing "=" after "postgresql//app:{SECRET}@db/app" in connection info string',
        f"host=db password={SECRET} dbname=app",
        f"host=db password='{SECRET} x' dbname=app",
    ],
)
def test_mask_secrets_hides_every_form_of_the_password(text: str) -> None:
    masked = mask_secrets(text)
    assert SECRET not in masked and SECRET[:7] not in masked, masked
    assert "***" in masked


def test_a_url_without_a_password_is_left_as_it_is() -> None:
    url = "postgresql://postgres@127.0.0.1:5432/postgres"
    assert mask_secrets(url) == url


def test_a_malformed_url_is_refused_at_load_without_its_value() -> None:
    with pytest.raises(ValidationError) as caught:
        PostgresSettings(url=SecretStr(f"postgresql//app:{SECRET}@db/app"))
    assert SECRET not in str(caught.value)
    assert "postgresql://user:password@host:5432/database" in str(caught.value)


def test_the_cli_refuses_it_in_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ZAPSTREAM_DATABASE_URL", f"postgresql//app:{SECRET}@db/app")
    assert cli.main(["db", "migrate", "--no-slot"]) == 2
    err = capsys.readouterr().err
    assert SECRET not in err and "ZAPSTREAM_DATABASE_URL" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_any_psycopg_error_is_described_masked() -> None:
    exc = psycopg.ProgrammingError(f'missing "=" after "postgresql//app:{SECRET}@db/app"')
    line = describe_connection_failure(exc)
    assert line is not None and SECRET not in line and "ZAPSTREAM_DATABASE_URL" in line


def test_log_lines_and_tracebacks_are_masked() -> None:
    formatter = MaskingFormatter("%(levelname)s %(message)s")
    try:
        raise psycopg.OperationalError(f"cannot connect to postgresql://app:{SECRET}@db/app")
    except psycopg.OperationalError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "t", logging.ERROR, __file__, 1, "dsn %s", (f"postgres://a:{SECRET}@h/d",), exc_info
    )
    line = formatter.format(record)
    assert SECRET not in line and "OperationalError" in line, line


def test_every_log_record_is_masked_whatever_the_handler_s_formatter() -> None:
    """Faust installs handlers with formatters of its own: the record itself is masked."""
    import io
    import logging

    from connectors.startup import mask_every_log_record

    previous = logging.getLogRecordFactory()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))  # not ours
    logger = logging.getLogger("faust.test_masking")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logging.setLogRecordFactory(logging.LogRecord)  # whatever other tests installed
        mask_every_log_record()
        installed = logging.getLogRecordFactory()
        mask_every_log_record()  # idempotent: one wrapper
        assert logging.getLogRecordFactory() is installed is not logging.LogRecord
        logger.warning("connecting to %s", "postgresql://relay:s3cr%40t@db:5432/app")
        try:
            raise RuntimeError("cannot parse postgresql//relay:hunter2@db/app")
        except RuntimeError:
            logger.exception("startup failed")
        logger.warning("bad format %d", "x")  # logging's own error, not the caller's crash
    finally:
        logging.setLogRecordFactory(previous)
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "s3cr%40t" not in out and "hunter2" not in out, out
    assert "postgresql://relay:***@db:5432/app" in out
    assert "startup failed" in out and "Traceback" in out
