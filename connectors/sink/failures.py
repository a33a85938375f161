"""The state sink's PostgreSQL and Kafka failures, classified once (rules: kernel.failures).

Every error the sink meets at its edges goes through :func:`classify`, into the kernel's
one vocabulary (:class:`~streams.kernel.errors.Failure`: ``dependency``, ``retriable``,
``problem``; the sink adds its own hints):

- **transient**: the dependency is away or busy. PostgreSQL: SQLSTATE classes
  08 (connection exception), 40 (serialization failure, deadlock), 53
  (insufficient resources), 57 (operator intervention: admin shutdown, cannot
  connect now), 58; and libpq's connection failures, which carry no SQLSTATE
  (connection refused, server closed the connection unexpectedly, timeout).
  Kafka: aiokafka errors whose ``retriable`` is true, and request timeouts.
  The sink retries the *same* batch with :class:`Backoff` for as long as it
  lasts, commits no offset meanwhile, and logs the outage once when it starts
  and once when it ends (:func:`sink_outage`).
- **permanent**: a retry fails the same way: class 28 (authentication), 3D000
  (the database does not exist), 42P01/42703 (the schema is missing or older
  than this sink), 42501 (privilege), Kafka authorization. The sink raises
  :class:`SinkConfigError` (a :class:`~streams.kernel.failures.StartRefused`), whose
  one line names the setting or the command that fixes it; ``zapstream sink`` prints
  it and exits 2.
- **rebalanced** (:class:`Rebalanced`): Kafka took the partitions away before the
  offsets were committed. The batch is already in PostgreSQL and its replay is
  harmless (version guard, unique events), so this is neither an outage nor fatal.

Anything else (a constraint violation, a syntax error) is a bug: it is raised
as it is, loudly, and the supervisor restarts the sink.
"""

from __future__ import annotations

import logging

import psycopg
from aiokafka import errors as kafka_errors

from connectors.sink import metrics
from streams.kernel.errors import Failure
from streams.kernel.failures import (
    DATABASE_SETTING,
    MIGRATE,
    PERMANENT_SQLSTATES,
    StartRefused,
    classify_kafka,
    one_line,
)
from streams.kernel.failures import classify_postgres as _classify
from streams.kernel.runtime.outage import OutageLog

__all__ = ["Rebalanced", "SinkConfigError", "classify", "classify_postgres", "sink_outage"]

KAFKA_SETTING = "ZAPSTREAM_KAFKA_BROKERS"

_SINK_SQLSTATES: dict[str, str] = {
    **PERMANENT_SQLSTATES,
    "42703": f"the outbox schema is older than this sink: {MIGRATE}",
    "42501": (
        f"the user in {DATABASE_SETTING} may not write outbox_jobs/outbox_job_events: "
        "GRANT SELECT, UPDATE ON outbox_jobs and INSERT ON outbox_job_events to it"
    ),
}

_REBALANCED = (
    kafka_errors.CommitFailedError,
    kafka_errors.RebalanceInProgressError,
    kafka_errors.IllegalGenerationError,
    kafka_errors.UnknownMemberIdError,
)
_KAFKA_PERMANENT = (
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.GroupAuthorizationFailedError,
)


class Rebalanced(Failure):
    """Kafka took the partitions away before the offsets were committed: the group rejoins
    by itself and the next owner replays the batch harmlessly; neither an outage nor fatal."""

    dependency = "kafka"
    retriable = False


class SinkConfigError(StartRefused):
    """A failure no retry will fix; the message is one line naming the setting or command.

    A :class:`~streams.kernel.failures.StartRefused`: ``zapstream`` prints it as one line
    on stderr and exits 2, at start or later (a password rotated under a running sink).
    """


def classify_postgres(sqlstate: str | None, message: str) -> Failure:
    """Transient or permanent, from the SQLSTATE and (without one) libpq's message."""
    found = _classify(sqlstate, message, hints=_SINK_SQLSTATES)
    if found.hint is not None:
        problem = f"{found.hint} ({found.problem})"
    elif found.retriable:
        problem = found.problem + (f" (SQLSTATE {found.code})" if found.code else "")
    else:
        problem = f"PostgreSQL refused the sink's write: {found.problem} ({found.code})"
    return Failure(problem, dependency="postgres", retriable=found.retriable, code=found.code)


def classify(exc: BaseException) -> Failure | None:
    """``exc`` classified, or None when it is not a PostgreSQL or Kafka failure (a bug).

    Kafka's errors are the kernel's (:func:`~streams.kernel.failures.classify_kafka`),
    with the sink's two cases on top: a rebalance, and an authorization the sink needs.
    """
    if isinstance(exc, psycopg.Error):
        sqlstate = exc.sqlstate
        if sqlstate is None and not isinstance(exc, psycopg.OperationalError):
            # InterfaceError and friends without a server answer: the client side is broken.
            return None
        return classify_postgres(sqlstate, str(exc))
    if isinstance(exc, _REBALANCED):
        return Rebalanced(one_line(str(exc)) or type(exc).__name__)
    if isinstance(exc, _KAFKA_PERMANENT):
        detail = one_line(str(exc)) or type(exc).__name__
        return Failure(
            f"Kafka refused access: grant the sink's user its topics and group ({detail})",
            dependency="kafka",
            retriable=False,
        )
    if isinstance(exc, kafka_errors.KafkaError | ConnectionError | TimeoutError):
        failure = classify_kafka(exc)
        if failure.retriable and _retriable_kafka(exc):
            return failure
        return Failure(
            f"Kafka error: {failure.problem} (check {KAFKA_SETTING})",
            dependency="kafka",
            retriable=False,
        )
    return None


def _retriable_kafka(exc: BaseException) -> bool:
    """aiokafka says which of its errors a retry may cure (``retriable``); a timeout and a
    dropped connection are that too. Others (an unsupported version) are permanent."""
    if isinstance(exc, kafka_errors.KafkaError):
        return bool(exc.retriable) or isinstance(exc, kafka_errors.KafkaTimeoutError)
    return True


def sink_outage(dependency: str, logger: logging.Logger) -> OutageLog:
    """One dependency's outage, logged once each way, with the sink's metrics kept between."""

    def ended(took: float) -> None:
        metrics.OUTAGE.labels(dependency).set(0)
        metrics.OUTAGE_SECONDS.labels(dependency).inc(took)

    # A series from the start (0), so dashboards and alerts see "no outage", not nothing.
    metrics.OUTAGE.labels(dependency).set(0)
    return OutageLog(
        dependency,
        logger,
        retrying="retrying the same batch with backoff (offsets not committed)",
        on_failed=metrics.RETRIES.labels(dependency).inc,
        on_start=lambda: metrics.OUTAGE.labels(dependency).set(1),
        on_end=ended,
    )
