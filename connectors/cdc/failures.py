"""The relay's PostgreSQL and Kafka failures, classified once, in the kernel's vocabulary.

Every error the relay meets at its edges (provisioning over an ordinary
connection, the replication connection, the Kafka producer) is classified here
into a :class:`~streams.kernel.errors.Failure` (``dependency``, ``retriable``,
``problem``, ``code``) with the kernel's rules (:mod:`streams.kernel.failures`)
plus the relay's own hints:

- **transient** (``retriable``): the relay reconnects with
  :class:`~streams.kernel.runtime.backoff.Backoff` for as long as it lasts and logs the
  outage once when it starts and once when it ends
  (:class:`~streams.kernel.runtime.outage.OutageLog`).
- **permanent**: besides the shared cases (authentication, no database, no
  outbox tables), the relay's own: 42501 no replication privilege, ``wal_level``
  not ``logical`` (55000), a slot with another plugin, a slot PostgreSQL
  invalidated, a DSN that reaches a connection pooler (PgBouncer refuses the
  ``replication`` startup parameter: a replication connection cannot be pooled).
  The relay raises :class:`~streams.kernel.failures.StartRefused` with one line
  naming the setting or command to fix; ``zapstream relay`` prints it and exits 2.
- **Kafka**: aiokafka's ``retriable`` (and an expired batch) is transient
  (:func:`kafka_transient`); a record Kafka refuses however often it is sent
  (:data:`PER_RECORD_ERRORS`) is replaced by its minimal rejection; any other
  refusal stops the relay with :class:`RelayError` (the slot replays from the
  last confirmed position on restart).
"""

from __future__ import annotations

import re

from aiokafka.errors import (
    CorruptRecordException,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)

from streams.kernel.errors import Failure
from streams.kernel.failures import (
    DATABASE_SETTING,
    PERMANENT_MESSAGES,
    PERMANENT_SQLSTATES,
    TRANSIENT_SQLSTATE_CLASSES,
    StartRefused,
    one_line,
)
from streams.kernel.failures import classify_postgres as _classify
from streams.kernel.runtime.backoff import Backoff
from streams.kernel.runtime.outage import OutageLog

__all__ = [
    "PER_RECORD_ERRORS",
    "TRANSIENT_SQLSTATE_CLASSES",
    "Backoff",
    "Failure",
    "OutageLog",
    "RelayError",
    "StartRefused",
    "classify_exception",
    "classify_postgres",
    "kafka_transient",
    "refused",
]

_POOLER = "POOLER"
"""Not a SQLSTATE: PgBouncer (before 1.23) closes a connection whose startup packet carries a
parameter it does not pool (``replication``; ``options``, which the relay's DSN sets for its
timeouts) with a message and no SQLSTATE. Only a pooler says this; a reconnect meets it again."""

_RELAY_SQLSTATES: dict[str, str] = {
    **PERMANENT_SQLSTATES,
    "42501": (
        f"the user in {DATABASE_SETTING} may not replicate: "
        "ALTER ROLE ... WITH REPLICATION (and grant it the outbox tables)"
    ),
    "55000": (
        "logical decoding is not available: set wal_level=logical in postgresql.conf "
        "and restart PostgreSQL"
    ),
    _POOLER: (
        f"{DATABASE_SETTING} of the relay reaches a connection pooler (PgBouncer), and a "
        "replication connection cannot go through a pooler: point it at PostgreSQL itself"
    ),
}
_RELAY_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    *PERMANENT_MESSAGES,
    (re.compile(r"must be superuser or replication role|permission denied", re.I), "42501"),
    (re.compile(r"wal_level", re.I), "55000"),
    (re.compile(r"unsupported startup parameter", re.I), _POOLER),
)


_SLOT_INVALIDATED = re.compile(
    r"can no longer get changes from replication slot|cannot read from logical replication slot"
    r"|slot .* has been invalidated",
    re.I,
)
_SLOT_INVALIDATED_HINT = (
    "the replication slot was invalidated (PostgreSQL removed WAL it still needed, e.g. "
    "max_slot_wal_keep_size): rows committed since its last confirmed position can no longer "
    "be streamed. Drop it (SELECT pg_drop_replication_slot('<ZAPSTREAM_RELAY_SLOT>')) and "
    "start the relay again: it creates a new slot and restreams every PENDING row itself"
)


def classify_postgres(sqlstate: str | None, message: str) -> Failure:
    """Transient or permanent, from the server's SQLSTATE and (without one) its message.

    A permanent failure's ``problem`` is the operator's whole line: what to fix, then
    the server's words in parentheses.
    """
    message = one_line(message)  # the server's DETAIL comes on a line of its own
    if _SLOT_INVALIDATED.search(message):
        # SQLSTATE 55000 too, but not a wal_level problem: the slot itself is unusable.
        return _postgres(f"{_SLOT_INVALIDATED_HINT} ({message})", False, sqlstate)
    verdict = _classify(sqlstate, message, hints=_RELAY_SQLSTATES, messages=_RELAY_MESSAGES)
    code = verdict.code if verdict.code not in ("DSN", _POOLER) else None
    if verdict.hint is not None:
        return _postgres(f"{verdict.hint} ({verdict.problem})", False, code)
    if verdict.retriable or code is None:
        return _postgres(verdict.problem, verdict.retriable, code)
    # Any other server error (syntax, constraint, ...) will recur: a bug or a schema problem.
    return _postgres(f"PostgreSQL refused the relay's request: {verdict.problem}", False, code)


def classify_exception(exc: BaseException) -> Failure:
    """:func:`classify_postgres` for a psycopg error, a ReplicationError or an OSError."""
    sqlstate = getattr(exc, "sqlstate", None)
    return classify_postgres(sqlstate if isinstance(sqlstate, str) else None, str(exc))


def _postgres(problem: str, retriable: bool, code: str | None) -> Failure:
    return Failure(problem, dependency="postgres", retriable=retriable, code=code)


def refused(problem: str, *, dependency: str) -> StartRefused:
    """The relay cannot run as configured: one line naming the fix (exit status 2)."""
    return StartRefused(problem, dependency=dependency)


PER_RECORD_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
)
"""Kafka refuses this one record, however often it is sent: it becomes a minimal rejection."""


def kafka_transient(exc: BaseException) -> bool:
    """A Kafka failure a later attempt may not meet: brokers away, a batch that expired.

    A batch that expired (``KafkaTimeoutError``) may still have been written:
    replaying it from the slot makes a duplicate the worker drops by job id.
    """
    return isinstance(exc, KafkaTimeoutError) or (isinstance(exc, KafkaError) and exc.retriable)


class RelayError(RuntimeError):
    """The relay cannot go on safely (Kafka refused or cancelled a record): a crash, restart.

    Not a :class:`~streams.kernel.errors.Failure`: nothing to configure; the restarted
    relay replays from the slot's confirmed position.
    """
