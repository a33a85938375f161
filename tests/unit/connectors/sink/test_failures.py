"""The state sink's failure classification table, backoff and outage logging (no I/O)."""

from __future__ import annotations

import logging
import random

import psycopg
import pytest
from aiokafka import errors as kafka_errors
from psycopg import errors as pg_errors

from connectors.sink.failures import (
    Rebalanced,
    SinkConfigError,
    classify,
    classify_postgres,
    sink_outage,
)
from streams.kernel.errors import Failure
from streams.kernel.failures import StartRefused
from streams.kernel.runtime.backoff import Backoff

TRANSIENT, PERMANENT, REBALANCED = "transient", "permanent", "rebalanced"


def _verdict(failure: Failure) -> str:
    """What the sink does with it: retry (transient), stop (permanent), or let it rejoin."""
    if isinstance(failure, Rebalanced):
        return REBALANCED
    return TRANSIENT if failure.retriable else PERMANENT


REFUSED = (
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
    "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?"
)
CLOSED = "consuming input failed: server closed the connection unexpectedly"


@pytest.mark.parametrize(
    ("exc", "verdict", "hint"),
    [
        (psycopg.OperationalError(REFUSED), TRANSIENT, "Connection refused"),
        (psycopg.OperationalError(CLOSED), TRANSIENT, "server closed"),
        (pg_errors.AdminShutdown("terminating connection"), TRANSIENT, "57P01"),
        (pg_errors.CannotConnectNow("the database system is starting up"), TRANSIENT, ""),
        (pg_errors.TooManyConnections("too many clients"), TRANSIENT, "53300"),
        (pg_errors.ConnectionFailure("lost"), TRANSIENT, "08006"),
        (pg_errors.SerializationFailure("retry"), TRANSIENT, "40001"),
        (
            psycopg.OperationalError('failed: FATAL:  database "shop" does not exist'),
            PERMANENT,
            "ZAPSTREAM_DATABASE_URL",
        ),
        (
            psycopg.OperationalError('FATAL:  password authentication failed for user "zs"'),
            PERMANENT,
            "user and password in ZAPSTREAM_DATABASE_URL",
        ),
        (
            psycopg.OperationalError('FATAL:  role "ghost" does not exist'),
            PERMANENT,
            "user and password",
        ),
        (pg_errors.InvalidPassword("bad"), PERMANENT, "user and password"),
        (pg_errors.InvalidCatalogName("no db"), PERMANENT, "database does not exist"),
        (
            pg_errors.UndefinedTable('relation "outbox_jobs" does not exist'),
            PERMANENT,
            "run `zapstream db migrate`",
        ),
        (
            pg_errors.UndefinedColumn('column "outcome" does not exist'),
            PERMANENT,
            "run `zapstream db migrate`",
        ),
        (pg_errors.InsufficientPrivilege("denied"), PERMANENT, "GRANT"),
        (pg_errors.NotNullViolation("null"), PERMANENT, "refused the sink's write"),
        (kafka_errors.KafkaConnectionError("no broker"), TRANSIENT, "no broker"),
        (kafka_errors.NodeNotReadyError("node"), TRANSIENT, ""),
        (kafka_errors.RequestTimedOutError(), TRANSIENT, ""),
        (kafka_errors.KafkaTimeoutError(), TRANSIENT, ""),
        (kafka_errors.CoordinatorNotAvailableError(), TRANSIENT, ""),
        (kafka_errors.CommitFailedError("rebalanced"), REBALANCED, ""),
        (kafka_errors.IllegalGenerationError(), REBALANCED, ""),
        (kafka_errors.GroupAuthorizationFailedError(), PERMANENT, "grant"),
        (kafka_errors.TopicAuthorizationFailedError(), PERMANENT, "grant"),
        (kafka_errors.UnsupportedVersionError(), PERMANENT, "ZAPSTREAM_KAFKA_BROKERS"),
        (ConnectionResetError("reset by peer"), TRANSIENT, ""),
    ],
)
def test_classification_table(exc: BaseException, verdict: str, hint: str) -> None:
    failure = classify(exc)
    assert failure is not None
    assert isinstance(failure, Failure)  # the kernel's one vocabulary
    assert _verdict(failure) == verdict, failure
    assert hint in failure.problem
    assert "\n" not in failure.problem
    assert failure.retriable is (verdict == TRANSIENT)


def test_dependency_is_named() -> None:
    assert classify(psycopg.OperationalError(REFUSED)).dependency == "postgres"  # type: ignore[union-attr]
    assert classify(kafka_errors.KafkaConnectionError()).dependency == "kafka"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "exc", [ValueError("bug"), KeyError("x"), psycopg.InterfaceError("the connection is closed")]
)
def test_anything_else_is_not_classified_and_stays_a_bug(exc: BaseException) -> None:
    assert classify(exc) is None


def test_sqlstate_wins_over_message_and_classes_are_read() -> None:
    assert _verdict(classify_postgres("08001", "whatever")) == TRANSIENT
    assert _verdict(classify_postgres("57P03", "")) == TRANSIENT
    assert _verdict(classify_postgres("28000", "")) == PERMANENT
    assert _verdict(classify_postgres(None, "timeout expired")) == TRANSIENT


def test_sink_config_error_is_a_one_line_startup_refusal() -> None:
    error = SinkConfigError("the outbox tables do not exist: run `zapstream db migrate`")
    assert isinstance(error, StartRefused) and not error.retriable
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
    outage = sink_outage("postgres", logger)
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
