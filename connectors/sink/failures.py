"""The state sink's PostgreSQL and Kafka failures, classified once, and how it waits them out.

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
import random
import re
import time

import psycopg
from aiokafka import errors as kafka_errors

from connectors.ops.config_errors import StartupRefused
from connectors.sink import metrics

DATABASE_SETTING = "ZAPSTREAM_DATABASE_URL"
KAFKA_SETTING = "ZAPSTREAM_KAFKA_BROKERS"
MIGRATE = "run `zapstream db migrate`"

TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})

_PERMANENT_SQLSTATES: dict[str, str] = {
    "28": f"PostgreSQL refused the credentials: check the user and password in {DATABASE_SETTING}",
    "3D000": f"the database does not exist: check the database name in {DATABASE_SETTING}",
    "42P01": f"the outbox tables do not exist in this database: {MIGRATE}",
    "42703": f"the outbox schema is older than this sink: {MIGRATE}",
    "42501": (
        f"the user in {DATABASE_SETTING} may not write outbox_jobs/outbox_job_events: "
        "GRANT SELECT, UPDATE ON outbox_jobs and INSERT ON outbox_job_events to it"
    ),
}

# libpq's connection failures carry only the server's message.
_PERMANENT_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"password authentication failed|authentication failed", re.I), "28"),
    (re.compile(r"no pg_hba\.conf entry", re.I), "28"),
    (re.compile(r'role "[^"]*" does not exist', re.I), "28"),
    (re.compile(r"password is required|no password supplied", re.I), "28"),
    (re.compile(r'database "[^"]*" does not exist', re.I), "3D000"),
)

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


def _one_line(text: str) -> str:
    return " ".join(text.split())


def classify_postgres(sqlstate: str | None, message: str) -> Failure:
    """Transient or permanent, from the SQLSTATE and (without one) libpq's message."""
    detail = _one_line(message)
    code = sqlstate
    if code is None:
        for pattern, found in _PERMANENT_MESSAGES:
            if pattern.search(detail):
                code = found
                break
    if code is None:
        # No SQLSTATE, no known permanent message: the connection failed (refused,
        # closed by the server, timed out, name not resolved); it may come back.
        return Failure(Verdict.TRANSIENT, "postgres", detail)
    hint = _PERMANENT_SQLSTATES.get(code) or _PERMANENT_SQLSTATES.get(code[:2])
    if hint is not None:
        return Failure(Verdict.PERMANENT, "postgres", f"{hint} ({detail})")
    if code[:2] in TRANSIENT_SQLSTATE_CLASSES:
        return Failure(Verdict.TRANSIENT, "postgres", f"{detail} (SQLSTATE {code})")
    return Failure(
        Verdict.PERMANENT, "postgres", f"PostgreSQL refused the sink's write: {detail} ({code})"
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
        return Failure(Verdict.REBALANCED, "kafka", _one_line(str(exc)) or type(exc).__name__)
    if isinstance(exc, kafka_errors.KafkaError):
        detail = _one_line(str(exc)) or type(exc).__name__
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
        return Failure(Verdict.TRANSIENT, "kafka", _one_line(str(exc)) or type(exc).__name__)
    return None


@dataclasses.dataclass(slots=True)
class Backoff:
    """Capped exponential backoff with jitter: ``initial_s`` doubling up to ``max_s``."""

    initial_s: float = 0.5
    max_s: float = 10.0
    rng: random.Random = dataclasses.field(default_factory=random.Random)
    _next_s: float = 0.0

    def __post_init__(self) -> None:
        self._next_s = self.initial_s

    def next_delay_s(self) -> float:
        """The wait before the next attempt: uniform in [cap/2, cap], then the cap doubles."""
        cap = self._next_s
        self._next_s = min(self.max_s, self._next_s * 2)
        return self.rng.uniform(cap / 2, cap)

    def reset(self) -> None:
        self._next_s = self.initial_s


class Outage:
    """One dependency's outage: a WARNING when it starts, an INFO when it ends, metrics between.

    Call :meth:`failed` on every failed attempt and :meth:`recovered` after every
    success; only the first failure and the recovery are logged.
    """

    def __init__(self, dependency: str, logger: logging.Logger) -> None:
        self.dependency = dependency
        self._log = logger
        self._since: float | None = None
        self.attempts = 0
        self.outages = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, problem: str, delay_s: float) -> None:
        metrics.RETRIES.labels(self.dependency).inc()
        self.attempts += 1
        if self._since is None:
            self._since = time.monotonic()
            self.outages += 1
            metrics.OUTAGE.labels(self.dependency).set(1)
            self._log.warning(
                "%s unavailable, retrying the same batch with backoff (offsets not committed; "
                "next try in %.1fs): %s",
                self.dependency,
                delay_s,
                problem,
            )

    def recovered(self) -> None:
        if self._since is None:
            return
        duration = time.monotonic() - self._since
        metrics.OUTAGE.labels(self.dependency).set(0)
        metrics.OUTAGE_SECONDS.labels(self.dependency).inc(duration)
        self._log.info(
            "%s back after %.1fs and %d failed attempts; the sink goes on",
            self.dependency,
            duration,
            self.attempts,
        )
        self._since = None
        self.attempts = 0
