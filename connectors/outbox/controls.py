"""Pause and resume a WhatsApp instance or a campaign; read the backlog before enqueueing more.

Operators (``zapstream instances|campaigns pause|resume``) and applications write
a control into ``outbox_controls``, in the caller's transaction::

    with psycopg.connect(dsn) as conn, conn.transaction():
        pause_instance(conn, "shop-1", reason="number flagged by Meta", actor="alice")

A control travels the same CDC path as an intent: the relay streams the row to
``zapstream.controls`` as a :class:`~streams.kernel.contract.ControlChanged`, and the
worker holds the instance's (or the campaign's: the jobs' ``purpose``) messages
until a resume. The table is the history, with who and why; :func:`controls`
reads the latest action per target (the ``zapstream_controls`` view).

Backpressure: :func:`backlog` (``zapstream_backlog``) says how many jobs wait,
per instance, purpose and priority, and how old the oldest is; :func:`should_hold`
(``zapstream_should_hold``) is true when an instance's oldest waiting
operational message is older than the business limit, the moment a bulk
producer should stop enqueueing until it drains.

Like :mod:`connectors.outbox.commands`, these functions run on the caller's
connection and never commit. Invalid input raises :class:`InvalidControl`
before anything is written, so the caller's transaction stays usable.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

import psycopg

from connectors.outbox.returning import insert_returning_id, insert_returning_id_async
from streams.kernel.contract import ControlAction, ControlKind

__all__ = [
    "Backlog",
    "Control",
    "InvalidControl",
    "backlog",
    "backlog_async",
    "controls",
    "pause_campaign",
    "pause_campaign_async",
    "pause_instance",
    "pause_instance_async",
    "resume_campaign",
    "resume_campaign_async",
    "resume_instance",
    "resume_instance_async",
    "should_hold",
    "should_hold_async",
]


class InvalidControl(ValueError):
    """The control cannot be written as given; nothing was written."""


@dataclasses.dataclass(frozen=True, slots=True)
class Control:
    """The latest control of a target (a row of ``zapstream_controls``)."""

    kind: str
    target: str
    action: str
    reason: str
    actor: str
    at: dt.datetime
    control_id: int

    @property
    def paused(self) -> bool:
        return self.action == ControlAction.PAUSE


@dataclasses.dataclass(frozen=True, slots=True)
class Backlog:
    """Jobs not settled yet (PENDING, RETRY_WAIT, ATTEMPTING) of one instance, purpose, priority."""

    instance_id: str
    purpose: str | None
    priority: str
    waiting: int
    oldest_waiting_age_s: float


_INSERT = """
    INSERT INTO outbox_controls (kind, target, action, reason, actor)
    VALUES (%s, %s, %s, %s, %s)
    RETURNING id
"""
_CONTROLS = """
    SELECT kind, target, action, reason, actor, at, control_id
    FROM zapstream_controls ORDER BY kind, target
"""
_BACKLOG = """
    SELECT instance_id, purpose, priority, waiting, oldest_waiting_age_s
    FROM zapstream_backlog(%s, %s)
"""
_SHOULD_HOLD = "SELECT zapstream_should_hold(%s, %s)"


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidControl(f"{what} is required")
    return value.strip()


def _params(
    kind: ControlKind, action: ControlAction, target: str, reason: str, actor: str
) -> tuple[str, str, str, str, str]:
    name = "instance" if kind == ControlKind.INSTANCE else "campaign (purpose)"
    return (
        kind.value,
        _text(target, name),
        action.value,
        _text(reason, "reason"),
        _text(actor, "actor"),
    )


def _write(conn: psycopg.Connection[Any], params: tuple[str, ...]) -> int:
    return insert_returning_id(conn, _INSERT, params)


async def _write_async(conn: psycopg.AsyncConnection[Any], params: tuple[str, ...]) -> int:
    return await insert_returning_id_async(conn, _INSERT, params)


def pause_instance(conn: psycopg.Connection[Any], instance: str, *, reason: str, actor: str) -> int:
    """Pause WhatsApp instance ``instance``; return the control id."""
    return _write(conn, _params(ControlKind.INSTANCE, ControlAction.PAUSE, instance, reason, actor))


def resume_instance(
    conn: psycopg.Connection[Any], instance: str, *, reason: str, actor: str
) -> int:
    """Resume WhatsApp instance ``instance``; return the control id."""
    params = _params(ControlKind.INSTANCE, ControlAction.RESUME, instance, reason, actor)
    return _write(conn, params)


def pause_campaign(conn: psycopg.Connection[Any], purpose: str, *, reason: str, actor: str) -> int:
    """Pause the campaign whose jobs carry ``purpose``; return the control id."""
    return _write(conn, _params(ControlKind.CAMPAIGN, ControlAction.PAUSE, purpose, reason, actor))


def resume_campaign(conn: psycopg.Connection[Any], purpose: str, *, reason: str, actor: str) -> int:
    """Resume the campaign whose jobs carry ``purpose``; return the control id."""
    params = _params(ControlKind.CAMPAIGN, ControlAction.RESUME, purpose, reason, actor)
    return _write(conn, params)


async def pause_instance_async(
    conn: psycopg.AsyncConnection[Any], instance: str, *, reason: str, actor: str
) -> int:
    """The async flavour of :func:`pause_instance`."""
    params = _params(ControlKind.INSTANCE, ControlAction.PAUSE, instance, reason, actor)
    return await _write_async(conn, params)


async def resume_instance_async(
    conn: psycopg.AsyncConnection[Any], instance: str, *, reason: str, actor: str
) -> int:
    """The async flavour of :func:`resume_instance`."""
    params = _params(ControlKind.INSTANCE, ControlAction.RESUME, instance, reason, actor)
    return await _write_async(conn, params)


async def pause_campaign_async(
    conn: psycopg.AsyncConnection[Any], purpose: str, *, reason: str, actor: str
) -> int:
    """The async flavour of :func:`pause_campaign`."""
    params = _params(ControlKind.CAMPAIGN, ControlAction.PAUSE, purpose, reason, actor)
    return await _write_async(conn, params)


async def resume_campaign_async(
    conn: psycopg.AsyncConnection[Any], purpose: str, *, reason: str, actor: str
) -> int:
    """The async flavour of :func:`resume_campaign`."""
    params = _params(ControlKind.CAMPAIGN, ControlAction.RESUME, purpose, reason, actor)
    return await _write_async(conn, params)


def controls(conn: psycopg.Connection[Any]) -> list[Control]:
    """The latest control of every instance and campaign ever paused or resumed."""
    with conn.cursor() as cur:
        cur.execute(_CONTROLS, prepare=False)
        return [
            Control(str(k), str(t), str(a), str(r), str(who), at, int(cid))
            for k, t, a, r, who, at, cid in cur.fetchall()
        ]


def _optional(value: object, what: str) -> str | None:
    return None if value is None else _text(value, what)


def _backlog_row(row: tuple[Any, ...]) -> Backlog:
    instance_id, purpose, priority, waiting, age_s = row
    return Backlog(str(instance_id), purpose, str(priority), int(waiting), float(age_s))


def backlog(
    conn: psycopg.Connection[Any], instance: str | None = None, purpose: str | None = None
) -> list[Backlog]:
    """What waits (PENDING, RETRY_WAIT, ATTEMPTING), per instance, purpose and priority."""
    params = (_optional(instance, "instance"), _optional(purpose, "purpose"))
    with conn.cursor() as cur:
        cur.execute(_BACKLOG, params, prepare=False)
        return [_backlog_row(tuple(row)) for row in cur.fetchall()]


async def backlog_async(
    conn: psycopg.AsyncConnection[Any], instance: str | None = None, purpose: str | None = None
) -> list[Backlog]:
    """The async flavour of :func:`backlog`."""
    params = (_optional(instance, "instance"), _optional(purpose, "purpose"))
    async with conn.cursor() as cur:
        await cur.execute(_BACKLOG, params, prepare=False)
        return [_backlog_row(tuple(row)) for row in await cur.fetchall()]


def _hold_params(instance: str, max_age_s: float) -> tuple[str, float]:
    if isinstance(max_age_s, bool) or not isinstance(max_age_s, int | float):
        raise InvalidControl(f"max_age_s must be a number of seconds, not {max_age_s!r}")
    if not math.isfinite(max_age_s) or max_age_s < 0:
        raise InvalidControl(f"max_age_s must be a number of seconds >= 0, not {max_age_s!r}")
    return _text(instance, "instance"), float(max_age_s)


def should_hold(conn: psycopg.Connection[Any], instance: str, max_age_s: float) -> bool:
    """True when ``instance``'s oldest waiting operational message is older than ``max_age_s``.

    The seed's "suspend producers when the oldest waiting message is older than
    the business limit": a bulk producer asks before enqueueing more.
    """
    params = _hold_params(instance, max_age_s)
    with conn.cursor() as cur:
        cur.execute(_SHOULD_HOLD, params, prepare=False)
        row = cur.fetchone()
    return bool(row and row[0])


async def should_hold_async(
    conn: psycopg.AsyncConnection[Any], instance: str, max_age_s: float
) -> bool:
    """The async flavour of :func:`should_hold`."""
    params = _hold_params(instance, max_age_s)
    async with conn.cursor() as cur:
        await cur.execute(_SHOULD_HOLD, params, prepare=False)
        row = await cur.fetchone()
    return bool(row and row[0])
