"""``outbox_commands`` rows as pgoutput delivers them (text) become commands or rejections."""

import orjson
import pytest

from connectors.cdc.outbox_rows import command_row_to_record, row_to_record
from streams.kernel.contract import (
    CommandRequested,
    IntentCaptured,
    IntentRejected,
    decode_topic_record,
)


def _row(**overrides: str | None) -> dict[str, str | None]:
    row: dict[str, str | None] = {
        "id": "7",
        "job_id": "42",
        "idempotency_key": "order-1",
        "command": "cancel",
        "reason": "customer cancelled",
        "actor": "application",
        "created_at": "2026-11-29 16:00:00.5+00",
        "instance_id": "shop-1",
        "conversation_key": "5511987654321",
        "payload": orjson.dumps({"type": "text", "to": "+55 11 98765-4321", "text": "hi"}).decode(),
        "priority": "operational",
        "purpose": "order",
        "expires_at": "2026-11-29 18:00:00+00",
        "max_attempts": "5",
        "job_created_at": "2026-11-29 15:50:00+00",
    }
    row.update(overrides)
    return row


def test_cancel_becomes_a_command_keyed_by_the_jobs_conversation() -> None:
    record = command_row_to_record(_row(), lsn="0/2A", committed_at="2026-11-29T16:00:01+00:00")
    assert isinstance(record, CommandRequested)
    assert record.command == "cancel"
    assert (record.command_id, record.job_id) == (7, 42)
    assert record.idempotency_key == "order-1"
    assert record.reason == "customer cancelled" and record.actor == "application"
    assert record.requested_at == "2026-11-29T16:00:00.500000+00:00"
    assert record.intent is None
    assert record.lsn == "0/2A"
    # Same partition as the job's own intent, so the worker sees them in order.
    job = row_to_record(
        {
            "id": "42",
            "instance_id": "shop-1",
            "payload": _row()["payload"],
            "idempotency_key": "order-1",
            "conversation_key": "5511987654321",
        },
        lsn="0/1",
        committed_at=None,
    )
    assert isinstance(job, IntentCaptured)
    assert record.partition_key == job.partition_key


def test_cancel_derives_the_conversation_from_the_recipient_when_the_copy_has_none() -> None:
    record = command_row_to_record(_row(conversation_key=None), lsn="0/1", committed_at=None)
    assert isinstance(record, CommandRequested)
    assert record.conversation_key == "5511987654321"


def test_reprocess_carries_the_jobs_intent_built_from_the_copies() -> None:
    record = command_row_to_record(
        _row(command="reprocess", actor="alice", reason="gateway outage is over"),
        lsn="0/30",
        committed_at="2026-11-29T16:00:01+00:00",
    )
    assert isinstance(record, CommandRequested)
    assert record.command == "reprocess" and record.actor == "alice"
    assert record.intent is not None
    intent = IntentCaptured.from_dict(record.intent)
    assert intent.job_id == 42
    assert intent.idempotency_key == "order-1"
    assert intent.to == "5511987654321"
    assert intent.text == "hi"
    assert intent.purpose == "order"
    assert intent.created_at == "2026-11-29T15:50:00+00:00"
    assert intent.expires_at == "2026-11-29T18:00:00+00:00"
    assert intent.lsn == "0/30"
    # It survives the wire.
    assert decode_topic_record(record.dumps()) == record


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"payload": "[1, 2]"}, "not an object"),
        ({"payload": '{"type": "text", "to": "123", "text": "hi"}'}, "not an international"),
        ({"payload": '{"type": "text", "to": "5511987654321", "text": ""}'}, "text is missing"),
        ({"payload": None}, "payload is missing"),
        ({"priority": "urgent"}, "unknown priority"),
        ({"max_attempts": "0"}, "max_attempts"),
        ({"job_created_at": "yesterday"}, "unreadable timestamp"),
    ],
)
def test_reprocess_with_broken_copies_is_rejected_with_the_reason(
    overrides: dict[str, str | None], reason: str
) -> None:
    row = _row(command="reprocess", **overrides)
    record = command_row_to_record(row, lsn="0/1", committed_at=None)
    assert isinstance(record, IntentRejected)
    assert reason in record.reason
    assert "reprocess" in record.reason
    assert record.job_id == 42
    assert record.row == row


@pytest.mark.parametrize("command", ["delete", "CANCEL", "", None])
def test_unknown_command_is_rejected(command: str | None) -> None:
    record = command_row_to_record(_row(command=command), lsn="0/1", committed_at=None)
    assert isinstance(record, IntentRejected)
    assert "unknown command" in record.reason
    assert record.job_id == 42


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"id": None}, "id is missing"),
        ({"job_id": None}, "job_id is missing"),
        ({"instance_id": None}, "instance_id is missing"),
        ({"reason": " "}, "reason is missing"),
        ({"actor": None}, "actor is missing"),
        ({"created_at": "not a time"}, "unreadable timestamp"),
        ({"conversation_key": None, "payload": "[1]"}, "conversation_key is missing"),
    ],
)
def test_cancel_with_missing_columns_is_rejected(
    overrides: dict[str, str | None], reason: str
) -> None:
    record = command_row_to_record(_row(**overrides), lsn="0/1", committed_at=None)
    assert isinstance(record, IntentRejected)
    assert reason in record.reason


def test_cancel_does_not_need_a_sendable_payload() -> None:
    """A cancel only needs the conversation; the job's text may be anything."""
    payload = '{"type": "text", "to": "5511987654321", "text": ""}'
    record = command_row_to_record(_row(payload=payload), lsn="0/1", committed_at=None)
    assert isinstance(record, CommandRequested)
