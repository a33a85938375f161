"""Cancel and reprocess jobs: write a command into ``outbox_commands``, in the caller's transaction.

Applications cancel by idempotency key::

    with psycopg.connect(dsn) as conn, conn.transaction():
        mark_order_cancelled(conn, order_id)
        cancel(conn, f"order-{order_id}", "customer cancelled the order")

Operators (``zapstream jobs cancel|reprocess``) name the job by its id with
:func:`request_cancel_by_id` and :func:`request_reprocess`, or many jobs at once
with :func:`request_reprocess_many`.

A command travels the same CDC path as an intent: the relay streams the row to
Kafka, the worker applies it and records the outcome, with who and why, in
``outbox_job_events``: the event whose ``command_id`` is the command's id, with
its ``outcome`` (``cancelled``, ``cancel_refused``, ``reprocessed``, ...).
Writing the command only *requests* the change: a message already handed to the
gateway cannot be cancelled, and the worker says so in the job's events.

Like :mod:`connectors.outbox.enqueue`, these functions run on the caller's connection
and never commit. Invalid input, or a job that does not exist, raises
:class:`InvalidCommand` before anything is written, and without an SQL error,
so the caller's transaction stays usable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from streams.kernel.contract import Command
from streams.kernel.state_machine import REPROCESSABLE

__all__ = [
    "InvalidCommand",
    "cancel",
    "cancel_async",
    "request_cancel_by_id",
    "request_reprocess",
    "request_reprocess_many",
]


class InvalidCommand(ValueError):
    """The command cannot be requested as given; nothing was written."""


# INSERT ... SELECT writes nothing, and raises nothing, when the job does not
# exist: the caller's transaction is not aborted by the trigger's exception.
# The trigger still fills in the copies of the job's columns.
_BY_KEY = """
    INSERT INTO outbox_commands (job_id, idempotency_key, command, reason, actor)
    SELECT id, idempotency_key, %s, %s, %s FROM outbox_jobs WHERE idempotency_key = %s
    RETURNING id
"""
# One statement for the lot: a job that is no longer reprocessable when it runs
# (the worker moved it meanwhile) is left out, not refused later by the worker.
_MANY = """
    INSERT INTO outbox_commands (job_id, idempotency_key, command, reason, actor)
    SELECT id, idempotency_key, %s, %s, %s FROM outbox_jobs
    WHERE id = ANY(%s) AND status = ANY(%s)
    ORDER BY id
    RETURNING id
"""
_BY_ID = """
    INSERT INTO outbox_commands (job_id, idempotency_key, command, reason, actor)
    SELECT id, idempotency_key, %s, %s, %s FROM outbox_jobs WHERE id = %s
    RETURNING id
"""


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidCommand(f"{what} is required")
    return value.strip()


def _job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidCommand(f"job id must be a positive integer, not {value!r}")
    return value


def _by_key_params(idempotency_key: str, reason: str, actor: str) -> tuple[str, str, str, str]:
    key = _text(idempotency_key, "idempotency_key")
    return (Command.CANCEL.value, _text(reason, "reason"), _text(actor, "actor"), key)


def _by_id_params(
    command: Command, job_id: int, reason: str, actor: str
) -> tuple[str, str, str, int]:
    return (command.value, _text(reason, "reason"), _text(actor, "actor"), _job_id(job_id))


def _insert(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...], job: str) -> int:
    with conn.cursor() as cur:
        cur.execute(query, params, prepare=False)
        found = cur.fetchone()
    if found is None:
        raise InvalidCommand(f"no outbox job with {job}")
    return int(found[0])


def cancel(
    conn: psycopg.Connection[Any], idempotency_key: str, reason: str, *, actor: str = "application"
) -> int:
    """Request the cancellation of the job with this idempotency key; return the command id."""
    params = _by_key_params(idempotency_key, reason, actor)
    return _insert(conn, _BY_KEY, params, f"idempotency_key {params[3]!r}")


async def cancel_async(
    conn: psycopg.AsyncConnection[Any],
    idempotency_key: str,
    reason: str,
    *,
    actor: str = "application",
) -> int:
    """The async flavour of :func:`cancel`."""
    params = _by_key_params(idempotency_key, reason, actor)
    async with conn.cursor() as cur:
        await cur.execute(_BY_KEY, params, prepare=False)
        found = await cur.fetchone()
    if found is None:
        raise InvalidCommand(f"no outbox job with idempotency_key {params[3]!r}")
    return int(found[0])


def request_cancel_by_id(
    conn: psycopg.Connection[Any], job_id: int, reason: str, actor: str
) -> int:
    """An operator's cancel of job ``job_id``; return the command id."""
    params = _by_id_params(Command.CANCEL, job_id, reason, actor)
    return _insert(conn, _BY_ID, params, f"id {job_id}")


def request_reprocess(conn: psycopg.Connection[Any], job_id: int, reason: str, actor: str) -> int:
    """An operator's request to send job ``job_id`` again; return the command id.

    Whether the job may be reprocessed (DEAD, UNCERTAIN, FAILED) is checked by
    ``zapstream jobs reprocess`` before and by the worker when it applies the
    command, since only the worker knows the job's latest state.
    """
    params = _by_id_params(Command.REPROCESS, job_id, reason, actor)
    return _insert(conn, _BY_ID, params, f"id {job_id}")


def request_reprocess_many(
    conn: psycopg.Connection[Any], job_ids: Sequence[int], reason: str, actor: str
) -> list[int]:
    """Request that each of ``job_ids`` be sent again, in one statement; return the command ids.

    Only jobs that are DEAD, UNCERTAIN or FAILED when the statement runs get a
    command; the others (and unknown ids) are left out. Runs in the caller's
    transaction, so the lot is requested or none of it.
    """
    ids = [_job_id(job_id) for job_id in job_ids]
    params = (
        Command.REPROCESS.value,
        _text(reason, "reason"),
        _text(actor, "actor"),
        ids,
        sorted(s.value for s in REPROCESSABLE),
    )
    if not ids:
        return []
    with conn.cursor() as cur:
        cur.execute(_MANY, params, prepare=False)
        return sorted(int(row[0]) for row in cur.fetchall())
