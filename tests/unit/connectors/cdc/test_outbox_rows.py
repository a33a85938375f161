"""Rows as pgoutput delivers them (text columns) become intents or rejections."""

import orjson
import pytest

from connectors.cdc.outbox_rows import row_to_record
from streams.contract import IntentCaptured, IntentRejected


def _row(**overrides: str | None) -> dict[str, str | None]:
    row: dict[str, str | None] = {
        "id": "42",
        "instance_id": "shop-1",
        "payload": orjson.dumps({"type": "text", "to": "+55 11 98765-4321", "text": "hi"}).decode(),
        "idempotency_key": "order-1",
        "conversation_key": None,
        "priority": "operational",
        "purpose": None,
        "expires_at": "2026-11-29 15:52:57.123+00",
        "max_attempts": "5",
        "created_at": "2026-11-29 15:50:00+00",
    }
    row.update(overrides)
    return row


def test_valid_row_becomes_an_intent_with_normalized_recipient() -> None:
    record = row_to_record(_row(), lsn="0/16", committed_at="2026-11-29T15:50:01+00:00")
    assert isinstance(record, IntentCaptured)
    assert record.to == "5511987654321"
    assert record.conversation_key == "5511987654321"
    assert record.expires_at == "2026-11-29T15:52:57.123000+00:00"
    assert record.job_id == 42 and record.lsn == "0/16"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"payload": "[1, 2]"}, "not an object"),
        ({"payload": '"hello"'}, "not an object"),
        ({"payload": '{"type": "image", "to": "5511987654321"}'}, "unknown message type"),
        ({"payload": '{"type": "text", "text": "hi"}'}, "recipient is missing"),
        ({"payload": '{"type": "text", "to": "123", "text": "hi"}'}, "not an international"),
        ({"payload": '{"type": "text", "to": "5511987654321", "text": ""}'}, "text is missing"),
        ({"instance_id": None}, "instance_id is missing"),
        ({"priority": "urgent"}, "unknown priority"),
        ({"max_attempts": "0"}, "max_attempts"),
    ],
)
def test_malformed_rows_are_rejected_with_reason_and_whole_row(
    overrides: dict[str, str | None], reason: str
) -> None:
    record = row_to_record(_row(**overrides), lsn="0/1", committed_at=None)
    assert isinstance(record, IntentRejected)
    assert reason in record.reason
    assert record.job_id == 42
    assert record.row["idempotency_key"] == "order-1"
