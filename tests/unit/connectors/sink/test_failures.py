"""The state sink's failure classification table, backoff and outage logging (no I/O)."""

from __future__ import annotations

import logging
import random

import psycopg
import pytest
from aiokafka import errors as kafka_errors
from psycopg import errors as pg_errors

from connectors.ops.config_errors import StartupRefused
from connectors.sink.failures import (
    Backoff,
    Outage,
    SinkConfigError,
    Verdict,
    classify,
    classify_postgres,
)

REFUSED = (
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
    "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?"
)
CLOSED = "consuming input failed: server closed the connection unexpectedly"


@pytest.mark.parametrize(
    ("exc", "verdict", "hint"),
    [
        (psycopg.OperationalError(REFUSED), Verdict.TRANSIENT, "Connection refused"),
        (psycopg.OperationalError(CLOSED), Verdict.TRANSIENT, "server closed"),
        (pg_errors.AdminShutdown("terminating connection"), Verdict.TRANSIENT, "57P01"),
        (pg_errors.CannotConnectNow("the database system is starting up"), Verdict.TRANSIENT, ""),
        (pg_errors.TooManyConnections("too many clients"), Verdict.TRANSIENT, "53300"),
        (pg_errors.ConnectionFailure("lost"), Verdict.TRANSIENT, "08006"),
        (pg_errors.SerializationFailure("retry"), Verdict.TRANSIENT, "40001"),
        (
            psycopg.OperationalError('failed: FATAL:  database "shop" does not exist'),
            Verdict.PERMANENT,
            "ZAPSTREAM_DATABASE_URL",
        ),
        (
            psycopg.OperationalError('FATAL:  password authentication failed for user "zs"'),
            Verdict.PERMANENT,
            "user and password in ZAPSTREAM_DATABASE_URL",
        ),
        (
            psycopg.OperationalError('FATAL:  role "ghost" does not exist'),
            Verdict.PERMANENT,
            "user and password",
        ),
        (pg_errors.InvalidPassword("bad"), Verdict.PERMANENT, "user and password"),
        (pg_errors.InvalidCatalogName("no db"), Verdict.PERMANENT, "database does not exist"),
        (
            pg_errors.UndefinedTable('relation "outbox_jobs" does not exist'),
            Verdict.PERMANENT,
            "run `zapstream db migrate`",
        ),
        (
            pg_errors.UndefinedColumn('column "outcome" does not exist'),
            Verdict.PERMANENT,
            "run `zapstream db migrate`",
        ),
        (pg_errors.InsufficientPrivilege("denied"), Verdict.PERMANENT, "GRANT"),
        (pg_errors.NotNullViolation("null"), Verdict.PERMANENT, "refused the sink's write"),
        (kafka_errors.KafkaConnectionError("no broker"), Verdict.TRANSIENT, "no broker"),
        (kafka_errors.NodeNotReadyError("node"), Verdict.TRANSIENT, ""),
        (kafka_errors.RequestTimedOutError(), Verdict.TRANSIENT, ""),
        (kafka_errors.KafkaTimeoutError(), Verdict.TRANSIENT, ""),
        (kafka_errors.CoordinatorNotAvailableError(), Verdict.TRANSIENT, ""),
        (kafka_errors.CommitFailedError("rebalanced"), Verdict.REBALANCED, ""),
        (kafka_errors.IllegalGenerationError(), Verdict.REBALANCED, ""),
        (kafka_errors.GroupAuthorizationFailedError(), Verdict.PERMANENT, "grant"),
        (kafka_errors.TopicAuthorizationFailedError(), Verdict.PERMANENT, "grant"),
        (kafka_errors.UnsupportedVersionError(), Verdict.PERMANENT, "ZAPSTREAM_KAFKA_BROKERS"),
        (ConnectionResetError("reset by peer"), Verdict.TRANSIENT, ""),
    ],
)
def test_classification_table(exc: BaseException, verdict: Verdict, hint: str) -> None:
    failure = classify(exc)
    assert failure is not None
    assert failure.verdict is verdict, failure
    assert hint in failure.problem
    assert "\n" not in failure.problem
    assert failure.retriable is (verdict is Verdict.TRANSIENT)


def test_dependency_is_named() -> None:
    assert classify(psycopg.OperationalError(REFUSED)).dependency == "postgres"  # type: ignore[union-attr]
    assert classify(kafka_errors.KafkaConnectionError()).dependency == "kafka"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "exc", [ValueError("bug"), KeyError("x"), psycopg.InterfaceError("the connection is closed")]
)
def test_anything_else_is_not_classified_and_stays_a_bug(exc: BaseException) -> None:
    assert classify(exc) is None


def test_sqlstate_wins_over_message_and_classes_are_read() -> None:
    assert classify_postgres("08001", "whatever").verdict is Verdict.TRANSIENT
    assert classify_postgres("57P03", "").verdict is Verdict.TRANSIENT
    assert classify_postgres("28000", "").verdict is Verdict.PERMANENT
    assert classify_postgres(None, "timeout expired").verdict is Verdict.TRANSIENT


def test_sink_config_error_is_a_one_line_startup_refusal() -> None:
    error = SinkConfigError("the outbox tables do not exist: run `zapstream db migrate`")
    assert isinstance(error, StartupRefused) and not error.retriable
    assert str(error) == "the outbox tables do not exist: run `zapstream db migrate`"


def test_backoff_is_capped_exponential_with_jitter() -> None:
    backoff = Backoff(initial_s=0.5, max_s=4.0, rng=random.Random(7))
    delays = [backoff.next_delay_s() for _ in range(8)]
    caps = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps, strict=True)), delays
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert backoff.next_delay_s() <= 0.5


def test_outage_logs_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test.sink.outage")
    outage = Outage("postgres", logger)
    with caplog.at_level(logging.INFO, logger="test.sink.outage"):
        outage.recovered()  # nothing to recover from: silent
        for _ in range(5):
            outage.failed("connection refused", 1.0)
        assert outage.ongoing and outage.attempts == 5
        outage.recovered()
        outage.recovered()
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in records] == ["WARNING", "INFO"], records
    assert "postgres unavailable" in records[0][1] and "connection refused" in records[0][1]
    assert "offsets not committed" in records[0][1]
    assert "available again after" in records[1][1] and "5 failed attempts" in records[1][1]
    assert not outage.ongoing and outage.outages == 1
