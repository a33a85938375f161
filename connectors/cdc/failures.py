"""The relay's PostgreSQL and Kafka failures, classified once (rules: kernel.failures).

Every error the relay meets at its edges (provisioning over an ordinary
connection, the replication connection, the Kafka producer) goes through
:func:`classify_postgres` or is a Kafka error with aiokafka's ``retriable``:

- **transient** (see :mod:`streams.kernel.failures`): the relay reconnects with
  :class:`~streams.kernel.runtime.backoff.Backoff` for as long as it lasts and logs the
  outage once when it starts and once when it ends
  (:class:`~streams.kernel.runtime.outage.OutageLog`).
- **permanent**: besides the shared cases (authentication, no database, no
  outbox tables), the relay's own: 42501 no replication privilege, ``wal_level``
  not ``logical`` (55000), a slot with another plugin. The relay raises
  :class:`RelayConfigError`; ``zapstream relay`` prints its one line, naming the
  setting or command to fix, and exits 2.
"""

from __future__ import annotations

import dataclasses
import re

from streams.kernel.failures import (
    DATABASE_SETTING,
    PERMANENT_MESSAGES,
    PERMANENT_SQLSTATES,
    TRANSIENT_SQLSTATE_CLASSES,
)
from streams.kernel.failures import classify_postgres as _classify
from streams.kernel.runtime.backoff import Backoff
from streams.kernel.runtime.outage import OutageLog

__all__ = [
    "TRANSIENT_SQLSTATE_CLASSES",
    "Backoff",
    "Classified",
    "OutageLog",
    "RelayConfigError",
    "RelayError",
    "classify_exception",
    "classify_postgres",
]

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
}
_RELAY_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    *PERMANENT_MESSAGES,
    (re.compile(r"must be superuser or replication role|permission denied", re.I), "42501"),
    (re.compile(r"wal_level", re.I), "55000"),
)


_SLOT_INVALIDATED = re.compile(
    r"can no longer get changes from replication slot|cannot read from logical replication slot"
    r"|slot .* has been invalidated",
    re.I,
)
_SLOT_INVALIDATED_HINT = (
    "the replication slot was invalidated (PostgreSQL removed WAL it still needed, e.g. "
    "max_slot_wal_keep_size): rows committed since its last confirmed position can no longer "
    "be streamed. Drop it (SELECT pg_drop_replication_slot('<ZAPSTREAM_RELAY_SLOT>')), start "
    "the relay (it creates a new slot) and run `zapstream outbox restream --older-than <age>`"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Classified:
    """The verdict on one failure."""

    retriable: bool
    problem: str
    """One line for the operator: what is wrong and which setting or command fixes it."""
    sqlstate: str | None = None


def classify_postgres(sqlstate: str | None, message: str) -> Classified:
    """Transient or permanent, from the server's SQLSTATE and (without one) its message."""
    message = " ".join(message.split())  # the server's DETAIL comes on a line of its own
    if _SLOT_INVALIDATED.search(message):
        # SQLSTATE 55000 too, but not a wal_level problem: the slot itself is unusable.
        return Classified(False, f"{_SLOT_INVALIDATED_HINT} ({message})", sqlstate)
    verdict = _classify(sqlstate, message, hints=_RELAY_SQLSTATES, messages=_RELAY_MESSAGES)
    code = verdict.code if verdict.code != "DSN" else None
    if verdict.hint is not None:
        return Classified(False, f"{verdict.hint} ({verdict.problem})", code)
    if verdict.retriable or code is None:
        return Classified(verdict.retriable, verdict.problem, code)
    # Any other server error (syntax, constraint, ...) will recur: a bug or a schema problem.
    return Classified(False, f"PostgreSQL refused the relay's request: {verdict.problem}", code)


def classify_exception(exc: BaseException) -> Classified:
    """:func:`classify_postgres` for a psycopg error, a ReplicationError or an OSError."""
    sqlstate = getattr(exc, "sqlstate", None)
    return classify_postgres(sqlstate if isinstance(sqlstate, str) else None, str(exc))


class RelayConfigError(RuntimeError):
    """A failure no retry will fix: the relay stops and names what to change. Exit status 2."""

    retriable = False


class RelayError(RuntimeError):
    """The relay cannot go on safely (Kafka refused or cancelled a record)."""
