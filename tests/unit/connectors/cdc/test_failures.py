"""The relay's failure classification table, its backoff and its reduced rejections."""

from __future__ import annotations

import logging
import random

import aiokafka.errors
import orjson
import pytest

from connectors.cdc.failures import (
    PER_RECORD_ERRORS,
    Backoff,
    OutageLog,
    classify_postgres,
    kafka_transient,
)
from connectors.cdc.outbox_rows import (
    TRUNCATION_MARKER,
    minimal_rejection,
    reduced_rejection,
)
from streams.kernel.errors import Failure


@pytest.mark.parametrize(
    ("sqlstate", "message"),
    [
        ("08006", "connection failure"),
        ("08001", "could not connect"),
        ("57P01", "terminating connection due to administrator command"),
        ("57P03", "the database system is starting up"),
        ("53300", "too many connections"),
        ("40001", "could not serialize access"),
        (None, 'connection to server at "127.0.0.1", port 5 failed: Connection refused'),
        (None, "server closed the connection unexpectedly"),
        (None, "could not connect within 30.0s"),
        (None, "No route to host"),
        (None, 'could not translate host name "db" to address'),
    ],
)
def test_transient(sqlstate: str | None, message: str) -> None:
    assert classify_postgres(sqlstate, message).retriable


@pytest.mark.parametrize(
    ("sqlstate", "message", "hint"),
    [
        ("28P01", "password authentication failed", "ZAPSTREAM_DATABASE_URL"),
        ("28000", "no pg_hba.conf entry", "ZAPSTREAM_DATABASE_URL"),
        ("3D000", 'database "x" does not exist', "ZAPSTREAM_DATABASE_URL"),
        ("42501", "must be superuser or replication role", "REPLICATION"),
        ("55000", "logical decoding requires wal_level >= logical", "wal_level=logical"),
        (
            "55000",
            'can no longer get changes from replication slot "zapstream_outbox"',
            "restreams every PENDING row itself",
        ),
        ("42P01", 'relation "outbox_jobs" does not exist', "zapstream db migrate"),
        ("42601", "syntax error", "refused"),
        (None, 'FATAL:  password authentication failed for user "app"', "password"),
        (None, 'FATAL:  database "nope" does not exist', "database name"),
        (None, 'FATAL:  role "ghost" does not exist', "ZAPSTREAM_DATABASE_URL"),
        (None, 'invalid connection option "bogus"', "ZAPSTREAM_DATABASE_URL"),
        # PgBouncer 1.18 in front of PostgreSQL: the replication connection, and the
        # service connections' options (statement_timeout), are refused at startup.
        (None, "FATAL:  unsupported startup parameter: replication", "cannot go through a pooler"),
        (None, "FATAL:  unsupported startup parameter: options", "ZAPSTREAM_DATABASE_URL"),
    ],
)
def test_permanent_names_the_setting(sqlstate: str | None, message: str, hint: str) -> None:
    verdict = classify_postgres(sqlstate, message)
    assert not verdict.retriable
    assert hint in verdict.problem
    assert "\n" not in verdict.problem


def test_backoff_doubles_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(0.5, 10.0, random.Random(7))
    delays = [backoff.next_delay_s() for _ in range(8)]
    caps = [0.5, 1, 2, 4, 8, 10, 10, 10]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    backoff.reset()
    assert backoff.next_delay_s() <= 0.5


def test_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = OutageLog("PostgreSQL", logging.getLogger("test.outage"))
    with caplog.at_level(logging.INFO, logger="test.outage"):
        outage.recovered()  # nothing to report
        for _ in range(5):
            outage.failed("Connection refused")
        outage.recovered()
        outage.recovered()
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert "5 failed attempts" in caplog.records[1].getMessage()


def test_reduced_rejection_cuts_values_and_keeps_job_id_and_lsn() -> None:
    row = {"id": "7", "payload": "x" * 2_000_000, "instance_id": "i", "purpose": None}
    record = reduced_rejection(
        job_id=7,
        reason="payload is not JSON",
        row=row,
        lsn="0/16B3748",
        committed_at=None,
        max_record_bytes=64 * 1024,
        max_value_bytes=4096,
    )
    assert len(record.dumps()) <= 64 * 1024
    assert record.job_id == 7 and record.lsn == "0/16B3748"
    assert record.reason == "payload is not JSON"
    payload = record.row["payload"]
    assert payload is not None
    assert payload.startswith("x" * 4096)
    assert payload.endswith(TRUNCATION_MARKER.format(size=2_000_000))
    assert record.row["instance_id"] == "i" and record.row["purpose"] is None


def test_reduced_rejection_of_a_very_wide_row_falls_back_to_the_reference() -> None:
    row = {f"c{i}": "y" * 100 for i in range(2000)}
    record = reduced_rejection(
        job_id=9,
        reason="r" * 50_000,
        row=row,
        lsn="0/1",
        committed_at=None,
        max_record_bytes=4096,
        max_value_bytes=4096,
    )
    assert len(record.dumps()) <= 4096
    assert record.row == {"id": "9"}
    assert len(record.reason) < 1100


def test_minimal_rejection_is_small() -> None:
    record = minimal_rejection(job_id=3, reason="record too large", lsn="0/2")
    assert orjson.loads(record.dumps())["row"] == {"id": "3"}
    assert len(record.dumps()) < 512


def test_a_reduced_command_rejection_still_says_it_was_a_command() -> None:
    # The state sink leaves the job alone for a rejected command row: keep "command".
    row = {"id": "12", "job_id": "7", "command": "reprocess", "reason": "z" * 100_000}
    record = reduced_rejection(
        job_id=7,
        reason="r" * 50_000,
        row={**row, **{f"c{i}": "y" * 100 for i in range(2000)}},
        lsn="0/1",
        committed_at=None,
        max_record_bytes=4096,
        max_value_bytes=4096,
    )
    assert len(record.dumps()) <= 4096
    assert record.row == {"id": "12", "job_id": "7", "command": "reprocess"}


def test_a_classified_postgres_failure_is_the_kernels_failure() -> None:
    away = classify_postgres("57P01", "terminating connection due to administrator command")
    assert isinstance(away, Failure)
    assert (away.dependency, away.retriable, away.code) == ("postgres", True, "57P01")
    denied = classify_postgres("42501", "must be superuser or replication role")
    assert (denied.dependency, denied.retriable, denied.code) == ("postgres", False, "42501")


@pytest.mark.parametrize(
    ("error", "transient", "per_record"),
    [
        ("KafkaTimeoutError", True, False),
        ("KafkaConnectionError", True, False),
        ("NotLeaderForPartitionError", True, False),
        ("TopicAuthorizationFailedError", False, False),
        ("ProducerFenced", False, False),
        ("MessageSizeTooLargeError", False, True),
        ("RecordListTooLargeError", False, True),
        ("CorruptRecordException", False, True),
    ],
)
def test_kafka_errors_are_classified_once(error: str, transient: bool, per_record: bool) -> None:
    cls = getattr(aiokafka.errors, error)
    exc = cls() if error != "ProducerFenced" else cls("fenced")
    assert kafka_transient(exc) is transient
    assert isinstance(exc, PER_RECORD_ERRORS) is per_record
