"""The state sink's PostgreSQL and Kafka failures, classified once (rules: kernel.failures).

Every error the sink meets at its edges goes through :func:`classify`:

- **transient**: the dependency is away or busy. PostgreSQL: SQLSTATE classes
  08 (connection exception), 40 (serialization failure, deadlock), 53
  (insufficient resources), 57 (operator intervention: admin shutdown, cannot
  connect now), 58; and libpq's connection failures, which carry no SQLSTATE
  (connection refused, server closed the connection unexpectedly, timeout).
  Kafka: aiokafka errors whose ``retriable`` is true, and request timeouts.
  The sink retries the *same* batch with :class:`Backoff` for as long as it
  lasts, commits no offset meanwhile, and logs the outage once when it starts
  and once when it ends (:class:`Outage`).
- **permanent**: a retry fails the same way: class 28 (authentication), 3D000
  (the database does not exist), 42P01/42703 (the schema is missing or older
  than this sink), 42501 (privilege), Kafka authorization. The sink raises
  :class:`SinkConfigError`, whose one line names the setting or the command
  that fixes it; ``zapstream sink`` prints it and exits 2.
- **rebalanced**: Kafka took the partitions away before the offsets were
  committed. The batch is already in PostgreSQL and its replay is harmless
  (version guard, unique events), so this is neither an outage nor fatal.

Anything else (a constraint violation, a syntax error) is a bug: it is raised
as it is, loudly, and the supervisor restarts the sink.
"""

from __future__ import annotations

import dataclasses
import enum
import logging

import psycopg
from aiokafka import errors as kafka_errors

from connectors.ops.config_errors import StartupRefused
from connectors.sink import metrics
from streams.kernel.failures import DATABASE_SETTING, MIGRATE, PERMANENT_SQLSTATES, one_line
from streams.kernel.failures import classify_postgres as _classify
from streams.kernel.runtime.backoff import Backoff
from streams.kernel.runtime.outage import OutageLog

__all__ = ["Backoff", "Failure", "Outage", "SinkConfigError", "Verdict", "classify"]

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


class Verdict(enum.Enum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    REBALANCED = "rebalanced"


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """The verdict on one error: what to do, and one line for the operator."""

    verdict: Verdict
    dependency: str
    """``postgres`` or ``kafka``."""
    problem: str

    @property
    def retriable(self) -> bool:
        return self.verdict is Verdict.TRANSIENT


class SinkConfigError(StartupRefused):
    """A failure no retry will fix; the message is one line naming the setting or command.

    A :class:`~connectors.ops.config_errors.StartupRefused`: ``zapstream`` prints
    it as one line on stderr and exits 2, at start or later (a password rotated
    under a running sink).
    """

    retriable = False

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def classify_postgres(sqlstate: str | None, message: str) -> Failure:
    """Transient or permanent, from the SQLSTATE and (without one) libpq's message."""
    verdict = _classify(sqlstate, message, hints=_SINK_SQLSTATES)
    if verdict.hint is not None:
        return Failure(Verdict.PERMANENT, "postgres", f"{verdict.hint} ({verdict.problem})")
    if verdict.retriable:
        where = f" (SQLSTATE {verdict.code})" if verdict.code else ""
        return Failure(Verdict.TRANSIENT, "postgres", verdict.problem + where)
    return Failure(
        Verdict.PERMANENT,
        "postgres",
        f"PostgreSQL refused the sink's write: {verdict.problem} ({verdict.code})",
    )


def classify(exc: BaseException) -> Failure | None:
    """The verdict on ``exc``, or None when it is not a PostgreSQL or Kafka failure (a bug)."""
    if isinstance(exc, psycopg.Error):
        sqlstate = exc.sqlstate
        if sqlstate is None and not isinstance(exc, psycopg.OperationalError):
            # InterfaceError and friends without a server answer: the client side is broken.
            return None
        return classify_postgres(sqlstate, str(exc))
    if isinstance(exc, _REBALANCED):
        return Failure(Verdict.REBALANCED, "kafka", one_line(str(exc)) or type(exc).__name__)
    if isinstance(exc, kafka_errors.KafkaError):
        detail = one_line(str(exc)) or type(exc).__name__
        if isinstance(exc, _KAFKA_PERMANENT):
            return Failure(
                Verdict.PERMANENT,
                "kafka",
                f"Kafka refused access: grant the sink's user its topics and group ({detail})",
            )
        if exc.retriable or isinstance(exc, kafka_errors.KafkaTimeoutError):
            return Failure(Verdict.TRANSIENT, "kafka", detail)
        return Failure(Verdict.PERMANENT, "kafka", f"Kafka error: {detail} (check {KAFKA_SETTING})")
    if isinstance(exc, ConnectionError | TimeoutError):
        return Failure(Verdict.TRANSIENT, "kafka", one_line(str(exc)) or type(exc).__name__)
    return None


class Outage(OutageLog):
    """One dependency's outage, logged once each way, with the sink's metrics kept between."""

    def __init__(self, dependency: str, logger: logging.Logger) -> None:
        super().__init__(
            dependency,
            logger,
            retrying="retrying the same batch with backoff (offsets not committed)",
            on_failed=metrics.RETRIES.labels(dependency).inc,
            on_start=lambda: metrics.OUTAGE.labels(dependency).set(1),
            on_end=lambda took: self._ended(took),
        )
        self.dependency = dependency
        # A series from the start (0), so dashboards and alerts see "no outage", not nothing.
        metrics.OUTAGE.labels(dependency).set(0)

    def _ended(self, took: float) -> None:
        metrics.OUTAGE.labels(self.dependency).set(0)
        metrics.OUTAGE_SECONDS.labels(self.dependency).inc(took)
