"""The application's API: write a send intent into the outbox, inside its own transaction.

::

    with psycopg.connect(dsn) as conn, conn.transaction():
        order_id = save_order(conn, ...)
        job_id = enqueue(conn, instance_id="shop-1", to="+55 11 98765-4321",
                         text="Your order #123 is confirmed", idempotency_key=f"order-{order_id}")

:func:`enqueue` and :func:`enqueue_async` run on the caller's connection and
never commit: the intent is published if and only if the caller's transaction
commits. The same idempotency key twice returns the existing job's id without
an error and without a second row. Invalid input raises :class:`InvalidIntent`
before anything is written; the rules are :mod:`connectors.outbox.rules`, which the
relay applies again to rows applications INSERT directly.

Every statement runs with ``prepare=False``: psycopg would prepare it on the server after its
5th run on a connection, and behind PgBouncer in transaction pooling mode the next transaction
may run on a server connection that lacks (or already has) that prepared statement. The other
application helpers of this package do the same (docs/guides/application.md, "Through PgBouncer").

Meta templates: :func:`enqueue_template` (and :func:`enqueue_template_async`) write a
``{"type": "template", "to", "template": {...}}`` intent, the Cloud API's template object;
``enqueue(..., fallback_template={...})`` a text sent as that template instead when Meta
answers that the customer-service window is closed (docs/guides/gateways/meta.md).

``send_at`` schedules the job (the column ``next_retry_at``, as the outbox article's
readers write it by hand): it waits SCHEDULED in PostgreSQL and is released when due
(:mod:`connectors.cdc.scheduled_release`); :mod:`connectors.outbox.schedule` moves it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from connectors.outbox.recipients import conversation_key_for
from connectors.outbox.rules import MAX_TEXT_CHARS as MAX_TEXT_CHARS  # re-exported for callers
from connectors.outbox.rules import (
    RuleViolation,
    check_conversation_key,
    check_expires_at,
    check_instance_id,
    check_max_attempts,
    check_priority,
    check_recipient,
    check_respect_opt_out,
    check_send_at,
    check_send_window,
    check_template,
    check_timezone,
    require_text,
    required,
)
from streams.kernel.contract import Priority
from streams.kernel.templates import TEMPLATE, template_summary


class InvalidIntent(ValueError):
    """The intent cannot be sent as given; nothing was written."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Row:
    instance_id: str
    payload: dict[str, Any]
    idempotency_key: str
    conversation_key: str
    priority: str
    purpose: str | None
    expires_at: dt.datetime | None
    max_attempts: int
    send_at: dt.datetime | None = None

    def params(self) -> tuple[Any, ...]:
        return (
            self.instance_id,
            Jsonb(self.payload),
            self.idempotency_key,
            self.conversation_key,
            self.priority,
            self.purpose,
            self.expires_at,
            self.max_attempts,
            self.send_at,
        )


_INSERT = """
    INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, conversation_key,
                             priority, purpose, expires_at, max_attempts, next_retry_at)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
"""
_EXISTING = "SELECT id FROM outbox_jobs WHERE idempotency_key = %s"


def _validate(
    *,
    instance_id: str,
    to: str,
    text: str,
    idempotency_key: str,
    conversation_key: str | None,
    priority: str,
    purpose: str | None,
    expires_at: dt.datetime | None,
    max_attempts: int,
    respect_opt_out: bool | None = None,
    send_at: dt.datetime | None = None,
    timezone: str | None = None,
) -> _Row:
    # The order decides which reason is reported when several rules are broken.
    try:
        instance_id = check_instance_id(required(instance_id, "instance_id").strip())
        idempotency_key = required(idempotency_key, "idempotency_key")
        text = require_text(text)
        recipient = check_recipient(to)
        chosen_priority = check_priority(priority)
        expires_at = check_expires_at(expires_at)
        max_attempts = check_max_attempts(max_attempts)
        conversation_key = check_conversation_key(conversation_key)
        send_at = check_send_at(send_at)
        check_send_window(send_at, expires_at)
        if timezone is not None:
            timezone = check_timezone(timezone)
        respect_opt_out = check_respect_opt_out(respect_opt_out, allowed="True, False or None")
    except RuleViolation as exc:
        raise InvalidIntent(str(exc)) from exc
    payload: dict[str, Any] = {"type": "text", "to": recipient, "text": text}
    if respect_opt_out is not None:
        payload["respect_opt_out"] = respect_opt_out
    if timezone is not None:
        payload["timezone"] = timezone
    return _Row(
        instance_id=instance_id.strip(),
        payload=payload,
        idempotency_key=idempotency_key.strip(),
        conversation_key=conversation_key or conversation_key_for(recipient),
        priority=chosen_priority.value,
        purpose=purpose,
        expires_at=expires_at,
        max_attempts=max_attempts,
        send_at=send_at,
    )


def enqueue(
    conn: psycopg.Connection[Any],
    *,
    instance_id: str,
    to: str,
    text: str,
    idempotency_key: str,
    conversation_key: str | None = None,
    priority: str = Priority.OPERATIONAL,
    purpose: str | None = None,
    expires_at: dt.datetime | None = None,
    max_attempts: int = 5,
    fallback_template: Mapping[str, Any] | None = None,
    respect_opt_out: bool | None = None,
    send_at: dt.datetime | None = None,
    timezone: str | None = None,
) -> int:
    """Write one text intent in the caller's transaction; return its job id.

    ``fallback_template``: a Cloud API template object sent instead of the text when Meta
    answers that the customer-service window is closed (131047); the job is sent once,
    as one or the other.

    ``respect_opt_out``: whether the recipient's opt-out (:mod:`connectors.outbox.optouts`)
    stops this message; None (the default) decides by priority: a bulk message is never
    sent to an opted-out recipient, an operational one is.

    ``send_at`` (timezone-aware): send no earlier than this; the job waits SCHEDULED in
    PostgreSQL until then (a time already past: sent at once). ``timezone`` (an IANA name):
    the recipient's, for quiet hours; default: derived from the number's country code."""
    row = _validate(
        instance_id=instance_id,
        to=to,
        text=text,
        idempotency_key=idempotency_key,
        conversation_key=conversation_key,
        priority=priority,
        purpose=purpose,
        expires_at=expires_at,
        max_attempts=max_attempts,
        respect_opt_out=respect_opt_out,
        send_at=send_at,
        timezone=timezone,
    )
    row = _with_fallback(row, fallback_template)
    return _insert(conn, row)


def _insert(conn: psycopg.Connection[Any], row: _Row) -> int:
    with conn.cursor() as cur:
        cur.execute(_INSERT, row.params(), prepare=False)
        found = cur.fetchone()
        if found is None:
            cur.execute(_EXISTING, (row.idempotency_key,), prepare=False)
            found = cur.fetchone()
    assert found is not None, "ON CONFLICT without a conflicting row"
    return int(found[0])


async def enqueue_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    instance_id: str,
    to: str,
    text: str,
    idempotency_key: str,
    conversation_key: str | None = None,
    priority: str = Priority.OPERATIONAL,
    purpose: str | None = None,
    expires_at: dt.datetime | None = None,
    max_attempts: int = 5,
    fallback_template: Mapping[str, Any] | None = None,
    respect_opt_out: bool | None = None,
    send_at: dt.datetime | None = None,
    timezone: str | None = None,
) -> int:
    """The async flavour of :func:`enqueue`."""
    row = _validate(
        instance_id=instance_id,
        to=to,
        text=text,
        idempotency_key=idempotency_key,
        conversation_key=conversation_key,
        priority=priority,
        purpose=purpose,
        expires_at=expires_at,
        max_attempts=max_attempts,
        respect_opt_out=respect_opt_out,
        send_at=send_at,
        timezone=timezone,
    )
    row = _with_fallback(row, fallback_template)
    return await _insert_async(conn, row)


async def _insert_async(conn: psycopg.AsyncConnection[Any], row: _Row) -> int:
    async with conn.cursor() as cur:
        await cur.execute(_INSERT, row.params(), prepare=False)
        found = await cur.fetchone()
        if found is None:
            await cur.execute(_EXISTING, (row.idempotency_key,), prepare=False)
            found = await cur.fetchone()
    assert found is not None, "ON CONFLICT without a conflicting row"
    return int(found[0])


# --- templates (Meta's Cloud API) ----------------------------------------------------------


def _checked_template(template: object, what: str) -> dict[str, Any]:
    try:
        return check_template(template, what=what)
    except RuleViolation as exc:
        raise InvalidIntent(str(exc)) from exc


def _with_fallback(row: _Row, fallback_template: Mapping[str, Any] | None) -> _Row:
    if fallback_template is None:
        return row
    fallback = _checked_template(fallback_template, "fallback_template")
    return dataclasses.replace(row, payload={**row.payload, "fallback_template": fallback})


def _template_row(
    *,
    instance_id: str,
    to: str,
    template: Mapping[str, Any],
    idempotency_key: str,
    conversation_key: str | None,
    priority: str,
    purpose: str | None,
    expires_at: dt.datetime | None,
    max_attempts: int,
) -> _Row:
    checked = _checked_template(template, "template")
    row = _validate(
        instance_id=instance_id,
        to=to,
        text=template_summary(checked),
        idempotency_key=idempotency_key,
        conversation_key=conversation_key,
        priority=priority,
        purpose=purpose,
        expires_at=expires_at,
        max_attempts=max_attempts,
    )
    to_value = row.payload["to"]
    return dataclasses.replace(row, payload={"type": TEMPLATE, "to": to_value, "template": checked})


def enqueue_template(
    conn: psycopg.Connection[Any],
    *,
    instance_id: str,
    to: str,
    template: Mapping[str, Any],
    idempotency_key: str,
    conversation_key: str | None = None,
    priority: str = Priority.OPERATIONAL,
    purpose: str | None = None,
    expires_at: dt.datetime | None = None,
    max_attempts: int = 5,
) -> int:
    """Write one template intent (Meta's Cloud API) in the caller's transaction; return its
    job id. ``template`` is the Cloud API's template object::

        enqueue_template(conn, instance_id="106540352242922", to="+55 11 98765-4321",
                         template={"name": "order_confirmation", "language": "pt_BR",
                                   "components": [{"type": "body", "parameters": [
                                       {"type": "text", "text": "Ana"}]}]},
                         idempotency_key=f"order-{order_id}")

    Only the ``meta`` gateway sends templates: on another one the job ends FAILED."""
    row = _template_row(
        instance_id=instance_id,
        to=to,
        template=template,
        idempotency_key=idempotency_key,
        conversation_key=conversation_key,
        priority=priority,
        purpose=purpose,
        expires_at=expires_at,
        max_attempts=max_attempts,
    )
    return _insert(conn, row)


async def enqueue_template_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    instance_id: str,
    to: str,
    template: Mapping[str, Any],
    idempotency_key: str,
    conversation_key: str | None = None,
    priority: str = Priority.OPERATIONAL,
    purpose: str | None = None,
    expires_at: dt.datetime | None = None,
    max_attempts: int = 5,
) -> int:
    """The async flavour of :func:`enqueue_template`."""
    row = _template_row(
        instance_id=instance_id,
        to=to,
        template=template,
        idempotency_key=idempotency_key,
        conversation_key=conversation_key,
        priority=priority,
        purpose=purpose,
        expires_at=expires_at,
        max_attempts=max_attempts,
    )
    return await _insert_async(conn, row)
