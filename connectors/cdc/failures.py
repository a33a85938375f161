"""The relay's PostgreSQL and Kafka failures, classified once, and how it waits them out.

Every error the relay meets at its edges (provisioning over an ordinary
connection, the replication connection, the Kafka producer) goes through
:func:`classify_postgres` or is a Kafka error with aiokafka's ``retriable``:

- **transient**: the server is away or busy (SQLSTATE classes 08 connection
  exception, 53 insufficient resources, 57 operator intervention such as
  57P01 admin shutdown and 57P03 cannot connect now, 40 and 58; connection
  refused, host unreachable, server closed the connection, timeouts). The
  relay reconnects with :class:`Backoff` for as long as it lasts and logs the
  outage once when it starts and once when it ends (:class:`OutageLog`).
- **permanent**: a retry fails the same way (class 28 authentication, 3D000
  database does not exist, 42501 no replication privilege, ``wal_level`` not
  ``logical``, a slot with another plugin, the outbox schema missing). The
  relay raises :class:`RelayConfigError`; ``zapstream relay`` prints its one
  line, naming the setting or command to fix, and exits 2.

Connection failures from libpq carry no SQLSTATE, only the server's message,
so :func:`classify_postgres` also reads the message for the few permanent cases.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import time

DATABASE_SETTING = "ZAPSTREAM_DATABASE_URL"

TRANSIENT_SQLSTATE_CLASSES = frozenset(("08", "40", "53", "57", "58"))
"""Connection exception, transaction rollback, insufficient resources, operator intervention,
system error: a later attempt may succeed."""

# SQLSTATE -> what the operator must do. Classes (two characters) or full codes.
_PERMANENT_SQLSTATES: dict[str, str] = {
    "28": f"authentication failed: check the user and password in {DATABASE_SETTING}",
    "3D000": f"the database does not exist: check the database name in {DATABASE_SETTING}",
    "42501": (
        f"the user in {DATABASE_SETTING} may not replicate: "
        "ALTER ROLE ... WITH REPLICATION (and grant it the outbox tables)"
    ),
    "55000": (
        "logical decoding is not available: set wal_level=logical in postgresql.conf "
        "and restart PostgreSQL"
    ),
    "42P01": "the outbox tables do not exist: run `zapstream db migrate`",
}

# libpq's connection failures: message only (no SQLSTATE). Checked in order.
_PERMANENT_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"password authentication failed|authentication failed", re.I), "28"),
    (re.compile(r"no pg_hba\.conf entry", re.I), "28"),
    (re.compile(r"role \S+ does not exist", re.I), "28"),
    (re.compile(r"password is required|no password supplied", re.I), "28"),
    (re.compile(r'database "[^"]*" does not exist', re.I), "3D000"),
    (re.compile(r"must be superuser or replication role|permission denied", re.I), "42501"),
    (re.compile(r"wal_level", re.I), "55000"),
    (re.compile(r"invalid (dsn|connection option|integer value)|invalid URI", re.I), "DSN"),
)

_DSN_HINT = f"the connection string is invalid: check {DATABASE_SETTING}"


@dataclasses.dataclass(frozen=True, slots=True)
class Classified:
    """The verdict on one failure."""

    retriable: bool
    problem: str
    """One line for the operator: what is wrong and which setting or command fixes it."""
    sqlstate: str | None = None


def classify_postgres(sqlstate: str | None, message: str) -> Classified:
    """Transient or permanent, from the server's SQLSTATE and (without one) its message."""
    detail = " ".join(message.split())
    code = sqlstate
    if code is None:
        for pattern, found in _PERMANENT_MESSAGES:
            if pattern.search(detail):
                code = found
                break
    if code == "DSN":
        return Classified(False, f"{_DSN_HINT} ({detail})")
    if code is not None:
        hint = _PERMANENT_SQLSTATES.get(code) or _PERMANENT_SQLSTATES.get(code[:2])
        if hint is not None:
            return Classified(False, f"{hint} ({detail})", code)
        if code[:2] in TRANSIENT_SQLSTATE_CLASSES:
            return Classified(True, detail, code)
        # Any other server error (syntax, constraint, ...) will recur: a bug or a schema problem.
        return Classified(False, f"PostgreSQL refused the relay's request: {detail}", code)
    # No SQLSTATE and no known permanent message: the connection failed (refused,
    # unreachable, closed, timed out, name not resolved) - the server may come back.
    return Classified(True, detail)


def classify_exception(exc: BaseException) -> Classified:
    """:func:`classify_postgres` for a psycopg error, a ReplicationError or an OSError."""
    sqlstate = getattr(exc, "sqlstate", None)
    return classify_postgres(sqlstate if isinstance(sqlstate, str) else None, str(exc))


class RelayConfigError(RuntimeError):
    """A failure no retry will fix: the relay stops and names what to change. Exit status 2."""

    retriable = False


@dataclasses.dataclass(slots=True)
class Backoff:
    """Capped exponential backoff with full jitter: ``initial_s`` doubling up to ``max_s``."""

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


class OutageLog:
    """Logs an outage once when it starts (WARNING) and once when it ends (INFO).

    ``failed()`` on every failed attempt, ``recovered()`` after a success; the
    attempts in between are counted, not logged.
    """

    def __init__(self, what: str, logger: logging.Logger) -> None:
        self.what = what
        self._log = logger
        self._since: float | None = None
        self.attempts = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, reason: str) -> None:
        self.attempts += 1
        if self._since is None:
            self._since = time.monotonic()
            self._log.warning("%s unavailable, retrying with backoff: %s", self.what, reason)

    def recovered(self) -> None:
        if self._since is None:
            return
        took = time.monotonic() - self._since
        self._log.info(
            "%s available again after %.1fs and %d failed attempts", self.what, took, self.attempts
        )
        self._since = None
        self.attempts = 0
