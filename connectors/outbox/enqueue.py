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
before anything is written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from connectors.outbox.recipients import InvalidRecipient, conversation_key_for, normalize_recipient
from streams.contract import Priority

MAX_TEXT_CHARS = 4096
"""WhatsApp's limit for a text message body."""


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
        )


_INSERT = """
    INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, conversation_key,
                             priority, purpose, expires_at, max_attempts)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
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
) -> _Row:
    if not isinstance(instance_id, str) or not instance_id.strip():
        raise InvalidIntent("instance_id is required")
    if not isinstance(idempotency_key, str) or not idempotency_key.strip():
        raise InvalidIntent("idempotency_key is required")
    if not isinstance(text, str) or not text.strip():
        raise InvalidIntent("text is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidIntent(f"text has {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    try:
        recipient = normalize_recipient(to)
    except InvalidRecipient as exc:
        raise InvalidIntent(str(exc)) from exc
    try:
        chosen_priority = Priority(priority)
    except ValueError:
        allowed = ", ".join(p.value for p in Priority)
        raise InvalidIntent(f"unknown priority {priority!r}; use one of {allowed}") from None
    if expires_at is not None and expires_at.tzinfo is None:
        raise InvalidIntent("expires_at must be timezone-aware")
    if not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidIntent("max_attempts must be a positive integer")
    if conversation_key is not None and not conversation_key.strip():
        raise InvalidIntent("conversation_key, when given, must not be empty")
    return _Row(
        instance_id=instance_id.strip(),
        payload={"type": "text", "to": recipient, "text": text},
        idempotency_key=idempotency_key.strip(),
        conversation_key=conversation_key or conversation_key_for(recipient),
        priority=chosen_priority.value,
        purpose=purpose,
        expires_at=expires_at,
        max_attempts=max_attempts,
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
) -> int:
    """Write one text intent in the caller's transaction; return its job id."""
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
    )
    with conn.cursor() as cur:
        cur.execute(_INSERT, row.params())
        found = cur.fetchone()
        if found is None:
            cur.execute(_EXISTING, (row.idempotency_key,))
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
    )
    async with conn.cursor() as cur:
        await cur.execute(_INSERT, row.params())
        found = await cur.fetchone()
        if found is None:
            await cur.execute(_EXISTING, (row.idempotency_key,))
            found = await cur.fetchone()
    assert found is not None, "ON CONFLICT without a conflicting row"
    return int(found[0])
