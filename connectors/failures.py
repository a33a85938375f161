"""What every edge shares about a failing dependency: the PostgreSQL verdict, backoff, outage log.

The relay (:mod:`connectors.cdc.failures`) and the state sink
(:mod:`connectors.sink.failures`) classify their own failures once, at their
edge, with their own hints (what *their* operator must do); the rules they share
live here, so PostgreSQL means the same thing to both:

- **transient**: the server is away or busy: SQLSTATE classes 08 (connection
  exception), 40 (serialization failure, deadlock), 53 (insufficient
  resources), 57 (operator intervention: 57P01 admin shutdown, 57P03 cannot
  connect now) and 58; and libpq's connection failures, which carry no SQLSTATE
  (connection refused, host unreachable, server closed the connection, timeout).
  Waited out with :class:`Backoff` for as long as it lasts, logged once when it
  starts and once when it ends (:class:`OutageLog`).
- **permanent**: a retry fails the same way: class 28 (authentication), 3D000
  (no such database), 42P01 (no outbox tables), and whatever else the caller's
  hints name. One line for the operator, naming the setting or the command.

libpq reports a failed connection with a message and no SQLSTATE, so
:func:`classify_postgres` reads the message for the few permanent cases.

Kafka: aiokafka's retriable errors and a broker that cannot be reached are
transient. A TLS handshake the client refuses (the broker's certificate does not
verify) and a SASL login the broker refuses are **permanent**
(:func:`classify_kafka_security`): a retry fails the same way, so the deployable
stops with one line naming the ``ZAPSTREAM_KAFKA_SSL_*`` or ``ZAPSTREAM_KAFKA_SASL_*``
settings. aiokafka's bootstrap only logs those causes and raises "unable to
bootstrap", so :func:`connectors.ops.topics.kafka_security_problem` connects once
more to see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import psycopg

log = logging.getLogger(__name__)

DATABASE_SETTING = "ZAPSTREAM_DATABASE_URL"
MIGRATE = "run `zapstream db migrate`"

TRANSIENT_SQLSTATE_CLASSES = frozenset(("08", "40", "53", "57", "58"))
"""Connection exception, transaction rollback, insufficient resources, operator intervention,
system error: a later attempt may succeed."""

PERMANENT_SQLSTATES: Mapping[str, str] = {
    "28": f"authentication failed: check the user and password in {DATABASE_SETTING}",
    "3D000": f"the database does not exist: check the database name in {DATABASE_SETTING}",
    "42P01": f"the outbox tables do not exist: {MIGRATE}",
}
"""SQLSTATE (a class of two characters, or a full code) -> what the operator must do."""

# libpq's connection failures: a message, no SQLSTATE. Checked in order; "DSN" is ours.
PERMANENT_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"password authentication failed|authentication failed", re.I), "28"),
    (re.compile(r"no pg_hba\.conf entry", re.I), "28"),
    (re.compile(r"role \S+ does not exist", re.I), "28"),
    (re.compile(r"password is required|no password supplied", re.I), "28"),
    (re.compile(r'database "[^"]*" does not exist', re.I), "3D000"),
    (re.compile(r"invalid (dsn|connection option|integer value)|invalid URI", re.I), "DSN"),
)
_DSN_HINT = f"the connection string is invalid: check {DATABASE_SETTING}"


KAFKA_TLS_HINT = (
    "check ZAPSTREAM_KAFKA_SSL_CAFILE (the CA that signed the brokers' certificates; "
    "unset: the system's trust store) and ZAPSTREAM_KAFKA_BROKERS (a host name the "
    "certificate names)"
)
KAFKA_TLS_HANDSHAKE_HINT = (
    "check ZAPSTREAM_KAFKA_SECURITY_PROTOCOL (does this listener use TLS?) and "
    "ZAPSTREAM_KAFKA_SSL_CERTFILE/_KEYFILE (a client certificate the brokers accept)"
)
KAFKA_SASL_HINT = (
    "check ZAPSTREAM_KAFKA_SASL_USERNAME and ZAPSTREAM_KAFKA_SASL_PASSWORD "
    "(and ZAPSTREAM_KAFKA_SASL_MECHANISM)"
)
KAFKA_MECHANISM_HINT = (
    "set ZAPSTREAM_KAFKA_SASL_MECHANISM to one the brokers enable (PLAIN, SCRAM-SHA-256, "
    "SCRAM-SHA-512)"
)


def classify_kafka_security(exc: BaseException) -> str | None:
    """One line for a TLS or SASL failure no retry will fix; None for anything else.

    Permanent: the broker's certificate does not verify, the TLS handshake is refused
    (an alert, a listener that does not speak TLS), the broker refuses the SASL login
    or the mechanism. A connection closed mid-handshake (EOF, reset) is not: the
    broker may be restarting.
    """
    from aiokafka.errors import SaslAuthenticationFailed, UnsupportedSaslMechanismError

    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or "certificate verify failed"
        return f"Kafka's TLS certificate was not accepted ({reason}): {KAFKA_TLS_HINT}"
    if isinstance(exc, ssl.SSLError) and not isinstance(
        exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError
    ):
        reason = getattr(exc, "reason", None) or one_line(str(exc))
        return f"TLS handshake with Kafka failed ({reason}): {KAFKA_TLS_HANDSHAKE_HINT}"
    if isinstance(exc, SaslAuthenticationFailed):
        return f"Kafka refused the SASL login ({one_line(str(exc))}): {KAFKA_SASL_HINT}"
    if isinstance(exc, UnsupportedSaslMechanismError):
        return f"Kafka does not enable this SASL mechanism ({one_line(str(exc))}): " + (
            KAFKA_MECHANISM_HINT
        )
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class PostgresVerdict:
    """The verdict on one PostgreSQL failure."""

    retriable: bool
    detail: str
    """The server's message on one line."""
    code: str | None
    """The SQLSTATE, or the code its message implies; None for a failed connection."""
    hint: str | None
    """For a permanent failure with a known remedy: what to do, naming the setting or command."""


def one_line(text: str) -> str:
    return " ".join(text.split())


def classify_postgres(
    sqlstate: str | None,
    message: str,
    *,
    hints: Mapping[str, str] = PERMANENT_SQLSTATES,
    messages: tuple[tuple[re.Pattern[str], str], ...] = PERMANENT_MESSAGES,
) -> PostgresVerdict:
    """Transient or permanent, from the SQLSTATE and (without one) libpq's message.

    ``hints`` and ``messages`` let an edge name its own permanent cases (the relay
    adds replication privilege and ``wal_level``); any other server error (syntax,
    constraint, ...) is permanent with no hint: it will recur.
    """
    detail = one_line(message)
    code = sqlstate
    if code is None:
        for pattern, found in messages:
            if pattern.search(detail):
                code = found
                break
    if code == "DSN":
        return PostgresVerdict(False, detail, code, _DSN_HINT)
    if code is None:
        # No SQLSTATE and no known permanent message: the connection failed (refused,
        # unreachable, closed, timed out, name not resolved); the server may come back.
        return PostgresVerdict(True, detail, None, None)
    hint = hints.get(code) or hints.get(code[:2])
    if hint is not None:
        return PostgresVerdict(False, detail, code, hint)
    return PostgresVerdict(code[:2] in TRANSIENT_SQLSTATE_CLASSES, detail, code, None)


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


class OutageLog:
    """Logs an outage once when it starts (WARNING) and once when it ends (INFO).

    ``failed()`` on every failed attempt, ``recovered()`` after every success; the
    attempts in between are counted, not logged. ``retrying`` words what is retried
    (the relay reconnects, the sink retries its batch); ``on_start``/``on_end`` let
    the caller keep its metrics (``on_end`` gets the outage's length in seconds).
    """

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        *,
        retrying: str = "retrying with backoff",
        on_failed: Callable[[], None] | None = None,
        on_start: Callable[[], None] | None = None,
        on_end: Callable[[float], None] | None = None,
    ) -> None:
        self.what = what
        self._log = logger
        self._retrying = retrying
        self._on_failed = on_failed
        self._on_start = on_start
        self._on_end = on_end
        self._since: float | None = None
        self.attempts = 0
        self.outages = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, reason: str, delay_s: float | None = None) -> None:
        self.attempts += 1
        if self._on_failed is not None:
            self._on_failed()
        if self._since is not None:
            return
        self._since = time.monotonic()
        self.outages += 1
        if self._on_start is not None:
            self._on_start()
        when = "" if delay_s is None else f" (next try in {delay_s:.1f}s)"
        self._log.warning("%s unavailable, %s%s: %s", self.what, self._retrying, when, reason)

    def recovered(self) -> None:
        if self._since is None:
            return
        took = time.monotonic() - self._since
        if self._on_end is not None:
            self._on_end(took)
        self._log.info(
            "%s available again after %.1fs and %d failed attempts", self.what, took, self.attempts
        )
        self._since = None
        self.attempts = 0


class PostgresSilent(psycopg.OperationalError):
    """PostgreSQL did not answer within a client-side deadline: the connection is presumed hung.

    An ``OperationalError`` without a SQLSTATE, so every edge classifies it as a failed
    connection (transient): drop the connection, reconnect with backoff.
    """


_FALLBACK_S = 11.0
"""After the hang-up, how long :func:`postgres_deadline` still waits before cancelling: the
cancel path takes psycopg up to 10 s more (a cancel request, then a wait, 5 s each)."""


@contextlib.asynccontextmanager
async def postgres_deadline(
    timeout_s: float, what: str, conn: psycopg.AsyncConnection[Any] | None = None
) -> AsyncIterator[None]:
    """Bound ``what`` (a query, a write on ``conn``) by ``timeout_s``; past it raise
    :class:`PostgresSilent`.

    The server's ``statement_timeout`` bounds a query it received; this bounds one it
    never answers (a peer that went silent without closing: TCP keepalives and
    ``tcp_user_timeout`` may take longer, or never fire through a proxy that still
    acknowledges). With ``conn`` the deadline hangs up its socket (``shutdown``), so the
    query fails at once with libpq's "server closed the connection" and the connection
    is closed: a hang costs ``timeout_s``. Without it (or if the hang-up did not wake the
    query) the block is cancelled, and psycopg then tries a cancel request and waits for
    the query to end, 5 s each at most (psycopg 3.3, ``AsyncConnection.wait``), before
    closing the connection: ``timeout_s`` + 10 s.
    """
    loop = asyncio.get_running_loop()
    hung_up = False

    def hang_up() -> None:
        nonlocal hung_up
        hung_up = True
        if conn is None or conn.closed:
            return
        with contextlib.suppress(OSError, psycopg.Error):
            # The descriptor stays libpq's: shut the connection down, do not close the fd.
            sock = socket.socket(fileno=conn.pgconn.socket)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()

    timer = loop.call_later(timeout_s, hang_up) if conn is not None else None
    silent = PostgresSilent(
        f"no answer to {what} within {timeout_s:g}s (ZAPSTREAM_DATABASE_QUERY_TIMEOUT_S): "
        "the connection is presumed hung"
    )
    try:
        async with asyncio.timeout(timeout_s + (_FALLBACK_S if conn is not None else 0.0)):
            yield
    except TimeoutError as exc:
        raise silent from exc
    except psycopg.Error as exc:
        if hung_up:
            raise silent from exc
        raise
    finally:
        if timer is not None:
            timer.cancel()


class ReopeningConnection:
    """One PostgreSQL connection that is opened when needed and dropped after a failure.

    For the timers that read PostgreSQL on their own (slot metrics, pipeline gauges,
    late-redelivery lookups): :meth:`get` returns the open connection or opens a new one
    (``connect`` builds it, with the caller's options); :meth:`drop` closes it quietly,
    since after a failure the connection is usually broken already. The next
    :meth:`get` reconnects, so an outage needs no other bookkeeping.
    """

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]) -> None:
        self._connect = connect
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def get(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect()
        return self._conn

    async def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                await conn.close()
            except (psycopg.Error, OSError) as exc:  # broken already: nothing to close
                log.debug("closing a broken PostgreSQL connection: %s", exc)
