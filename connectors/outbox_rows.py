"""Turn an ``outbox_jobs`` row, as pgoutput delivers it, into a record for Kafka.

pgoutput gives every column as PostgreSQL's text output (``None`` for NULL).
A row that cannot become an intent (payload not an object, unknown type,
missing recipient, ...) becomes an :class:`~streams.contract.IntentRejected`
carrying the whole row and the reason: the relay publishes it to
``zapstream.invalid`` and moves on, so one bad row never stops the stream.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import orjson

from connectors.enqueue import MAX_TEXT_CHARS
from connectors.recipients import InvalidRecipient, conversation_key_for, normalize_recipient
from streams.contract import IntentCaptured, IntentRejected, Priority

SUPPORTED_TYPES = frozenset({"text"})


class _Reject(Exception):
    pass


def _timestamp(value: str | None) -> str | None:
    """PostgreSQL's timestamptz text (``2026-11-29 15:52:57.1+00``) as ISO 8601."""
    if value is None:
        return None
    text = value.strip()
    # Python wants "+00:00" where PostgreSQL may print "+00".
    if len(text) >= 3 and text[-3] in "+-" and text[-2:].isdigit():
        text += ":00"
    try:
        return dt.datetime.fromisoformat(text).isoformat()
    except ValueError as exc:
        raise _Reject(f"unreadable timestamp {value!r}") from exc


def _required(row: Mapping[str, str | None], column: str) -> str:
    value = row.get(column)
    if value is None or not value.strip():
        raise _Reject(f"{column} is missing")
    return value


def row_to_record(
    row: Mapping[str, str | None], *, lsn: str, committed_at: str | None
) -> IntentCaptured | IntentRejected:
    """Validate one inserted row; return the intent, or the rejection with its reason."""
    job_id_text = row.get("id")
    job_id = int(job_id_text) if job_id_text and job_id_text.isdigit() else None
    try:
        if job_id is None:
            raise _Reject("id is missing")
        instance_id = _required(row, "instance_id")
        idempotency_key = _required(row, "idempotency_key")
        try:
            payload = orjson.loads(_required(row, "payload"))
        except orjson.JSONDecodeError as exc:
            raise _Reject(f"payload is not JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise _Reject(f"payload is a JSON {type(payload).__name__}, not an object")
        kind = payload.get("type", "text")
        if kind not in SUPPORTED_TYPES:
            raise _Reject(f"unknown message type {kind!r}")
        try:
            recipient = normalize_recipient(payload.get("to"))
        except InvalidRecipient as exc:
            raise _Reject(str(exc)) from exc
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _Reject("text is missing or empty")
        if len(text) > MAX_TEXT_CHARS:
            raise _Reject(f"text has {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
        priority = row.get("priority") or Priority.OPERATIONAL.value
        if priority not in {p.value for p in Priority}:
            raise _Reject(f"unknown priority {priority!r}")
        max_attempts_text = row.get("max_attempts") or "5"
        if not max_attempts_text.isdigit() or int(max_attempts_text) < 1:
            raise _Reject(f"max_attempts {max_attempts_text!r} is not a positive integer")
        return IntentCaptured(
            job_id=job_id,
            instance_id=instance_id,
            conversation_key=row.get("conversation_key") or conversation_key_for(recipient),
            idempotency_key=idempotency_key,
            message_type=kind,
            to=recipient,
            text=text,
            priority=priority,
            purpose=row.get("purpose"),
            expires_at=_timestamp(row.get("expires_at")),
            max_attempts=int(max_attempts_text),
            created_at=_timestamp(row.get("created_at")),
            committed_at=committed_at,
            lsn=lsn,
        )
    except _Reject as reason:
        return IntentRejected(
            job_id=job_id, reason=str(reason), row=dict(row), lsn=lsn, committed_at=committed_at
        )
