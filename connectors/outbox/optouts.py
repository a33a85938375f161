"""Recipients who said stop: opt a person out of an instance's bulk messages, or back in.

An application records an opt-out when a customer replies STOP (and an opt-in when
they ask to hear from the business again), in its own transaction::

    with psycopg.connect(dsn) as conn, conn.transaction():
        opt_out(conn, "shop-1", "+55 11 98765-4321", reason="replied STOP")

The row goes into ``outbox_optouts`` (insert-only: the table is the history, with
who and why); the relay streams it to ``zapstream.controls`` as an
:class:`~streams.kernel.contract.OptOutChanged` and every worker keeps the opted-out
people of every instance. From then on a **bulk** job to the person ends OPTED_OUT,
never sent; an **operational** job (a one-time code, an order confirmation) is still
sent unless it was enqueued with ``respect_opt_out=True``. Meta's error 131050 (the
user stopped marketing messages from the business) records an opt-out by itself
(source ``meta``).

The recipient is normalised to the person it names (:func:`person`):
``+55 11 98765-4321``, ``5511987654321`` and ``5511987654321@s.whatsapp.net`` are one
person; the SQL trigger does the same for rows inserted by hand.

Like :mod:`connectors.outbox.controls`, these functions run on the caller's connection
and never commit. Invalid input raises :class:`InvalidOptOut` before anything is
written, so the caller's transaction stays usable.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import psycopg

from connectors.outbox.recipients import InvalidRecipient, conversation_key_for, normalize_recipient
from connectors.outbox.returning import insert_returning_id, insert_returning_id_async
from connectors.outbox.rules import RuleViolation, check_instance_id
from streams.kernel.contract import OptOutAction, OptOutSource, opt_out_person

__all__ = [
    "InvalidOptOut",
    "OptOut",
    "opt_in",
    "opt_in_async",
    "opt_out",
    "opt_out_async",
    "opted_out",
    "opted_out_async",
    "optouts",
    "person",
]

REASON_MAX_CHARS = 1_000


class InvalidOptOut(ValueError):
    """The opt-out or opt-in cannot be written as given; nothing was written."""


@dataclasses.dataclass(frozen=True, slots=True)
class OptOut:
    """A person opted out now (a row of ``zapstream_optouts``)."""

    instance_id: str
    recipient: str
    """The person: a phone number's digits, or a group's JID."""
    source: str
    reason: str
    job_id: int | None
    """The job whose gateway answer taught it (source ``meta``), else None."""
    at: dt.datetime
    optout_id: int


def person(to: str) -> str:
    """The person ``to`` names, as opt-outs are keyed: digits, or a group's JID."""
    try:
        return opt_out_person(conversation_key_for(normalize_recipient(to)))
    except InvalidRecipient as exc:
        raise InvalidOptOut(str(exc)) from exc


_INSERT = """
    INSERT INTO outbox_optouts (instance_id, recipient, action, source, reason)
    VALUES (%s, %s, %s, %s, %s)
    RETURNING id
"""
_OPTED_OUT = "SELECT zapstream_opted_out(%s, %s)"
_LIST = """
    SELECT instance_id, recipient, source, reason, job_id, at, optout_id
    FROM zapstream_optouts
    WHERE (%(instance)s::text IS NULL OR instance_id = %(instance)s)
    ORDER BY instance_id, optout_id DESC
    LIMIT %(limit)s
"""


def _params(
    action: OptOutAction, instance_id: str, to: str, reason: str, source: str
) -> tuple[str, str, str, str, str]:
    try:
        instance = check_instance_id(instance_id)
    except RuleViolation as exc:
        raise InvalidOptOut(str(exc)) from exc
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidOptOut("reason is required")
    if len(reason) > REASON_MAX_CHARS:
        raise InvalidOptOut(f"reason is longer than {REASON_MAX_CHARS} characters")
    if source not in {s.value for s in OptOutSource}:
        raise InvalidOptOut("source must be one of " + ", ".join(s.value for s in OptOutSource))
    return instance, person(to), action.value, source, reason.strip()


def _write(conn: psycopg.Connection[Any], params: tuple[str, ...]) -> int:
    return insert_returning_id(conn, _INSERT, params)


async def _write_async(conn: psycopg.AsyncConnection[Any], params: tuple[str, ...]) -> int:
    return await insert_returning_id_async(conn, _INSERT, params)


def opt_out(
    conn: psycopg.Connection[Any],
    instance_id: str,
    to: str,
    *,
    reason: str = "opted out",
    source: str = OptOutSource.APP,
) -> int:
    """Opt ``to`` out of ``instance_id``'s bulk messages; return the row's id."""
    return _write(conn, _params(OptOutAction.OUT, instance_id, to, reason, source))


def opt_in(
    conn: psycopg.Connection[Any],
    instance_id: str,
    to: str,
    *,
    reason: str = "opted in",
    source: str = OptOutSource.APP,
) -> int:
    """Opt ``to`` back in: bulk jobs enqueued from now on are sent again; return the row's id."""
    return _write(conn, _params(OptOutAction.IN, instance_id, to, reason, source))


async def opt_out_async(
    conn: psycopg.AsyncConnection[Any],
    instance_id: str,
    to: str,
    *,
    reason: str = "opted out",
    source: str = OptOutSource.APP,
) -> int:
    """The async flavour of :func:`opt_out`."""
    return await _write_async(conn, _params(OptOutAction.OUT, instance_id, to, reason, source))


async def opt_in_async(
    conn: psycopg.AsyncConnection[Any],
    instance_id: str,
    to: str,
    *,
    reason: str = "opted in",
    source: str = OptOutSource.APP,
) -> int:
    """The async flavour of :func:`opt_in`."""
    return await _write_async(conn, _params(OptOutAction.IN, instance_id, to, reason, source))


def opted_out(conn: psycopg.Connection[Any], instance_id: str, to: str) -> bool:
    """Whether ``to`` is opted out of ``instance_id`` now (as the database knows it)."""
    with conn.cursor() as cur:
        cur.execute(_OPTED_OUT, (instance_id, person(to)), prepare=False)
        row = cur.fetchone()
    return bool(row and row[0])


async def opted_out_async(conn: psycopg.AsyncConnection[Any], instance_id: str, to: str) -> bool:
    """The async flavour of :func:`opted_out`."""
    async with conn.cursor() as cur:
        await cur.execute(_OPTED_OUT, (instance_id, person(to)), prepare=False)
        row = await cur.fetchone()
    return bool(row and row[0])


def optouts(
    conn: psycopg.Connection[Any], instance_id: str | None = None, *, limit: int = 100
) -> list[OptOut]:
    """The people opted out now (of ``instance_id``, or of every instance), newest first."""
    with conn.cursor() as cur:
        cur.execute(_LIST, {"instance": instance_id, "limit": limit}, prepare=False)
        return [
            OptOut(str(i), str(r), str(s), str(why), None if j is None else int(j), at, int(oid))
            for i, r, s, why, j, at, oid in cur.fetchall()
        ]
