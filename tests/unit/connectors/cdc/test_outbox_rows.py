"""Rows as pgoutput delivers them (text columns) become intents or rejections."""

import orjson
import pytest

from connectors.cdc.outbox_rows import INTENT_COLUMNS, CapturedIntent, row_to_intent, row_to_record
from streams.kernel.contract import IntentCaptured, IntentRejected


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


# --- the relay's fast form: byte for byte the record's encoding -------------------------


def _explicit_intent(**fields: object) -> IntentCaptured:
    """The intent built field by field, as row_to_record built it before CapturedIntent."""
    base: dict[str, object] = {
        "job_id": 42,
        "instance_id": "shop-1",
        "conversation_key": "5511987654321",
        "idempotency_key": "order-1",
        "message_type": "text",
        "to": "5511987654321",
        "text": "hi",
        "priority": "operational",
        "purpose": None,
        "expires_at": "2026-11-29T15:52:57.123000+00:00",
        "max_attempts": 5,
        "created_at": "2026-11-29T15:50:00+00:00",
        "committed_at": "2026-11-29T15:50:01+00:00",
        "lsn": "0/16",
    }
    base.update(fields)
    return IntentCaptured(**base)  # type: ignore[arg-type]


_UNICODE = 'Olá "mundo" \\ 🎉 <b>&amp;</b>\n\t\u2028'


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, {}),
        (
            {
                "conversation_key": "vip-7",
                "priority": "bulk",
                "purpose": "promo",
                "max_attempts": "9",
                "expires_at": None,
                "created_at": None,
            },
            {
                "conversation_key": "vip-7",
                "priority": "bulk",
                "purpose": "promo",
                "max_attempts": 9,
                "expires_at": None,
                "created_at": None,
            },
        ),
        (
            {
                "payload": orjson.dumps(
                    {"type": "text", "to": "120363012345678901@g.us", "text": _UNICODE}
                ).decode(),
                "priority": None,
                "max_attempts": None,
            },
            {
                "to": "120363012345678901@g.us",
                "conversation_key": "120363012345678901@g.us",
                "text": _UNICODE,
            },
        ),
    ],
)
def test_captured_intent_encodes_exactly_as_the_record(
    overrides: dict[str, str | None], expected: dict[str, object]
) -> None:
    intent = row_to_intent(_row(**overrides), lsn="0/16", committed_at="2026-11-29T15:50:01+00:00")
    assert isinstance(intent, CapturedIntent)
    reference = _explicit_intent(**expected)
    value = intent.dumps()
    # The contract's own encodings of the same intent, and its dict form (asdict + schema).
    assert value == reference.dumps()
    assert value == orjson.dumps(reference.to_dict())
    assert intent.record() == reference
    assert IntentCaptured.loads(value) == reference
    assert intent.partition_key == reference.partition_key
    assert (intent.job_id, intent.lsn, intent.committed_at) == (42, "0/16", reference.committed_at)


def test_row_to_intent_rejects_like_row_to_record() -> None:
    row = _row(payload="[1, 2]")
    fast = row_to_intent(row, lsn="0/1", committed_at=None)
    assert isinstance(fast, IntentRejected)
    assert fast == row_to_record(row, lsn="0/1", committed_at=None)


class _Recording(dict[str, str | None]):
    """A row that remembers which columns were read."""

    def __init__(self, row: dict[str, str | None]) -> None:
        super().__init__(row)
        self.read: set[str] = set()

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str | None:
        self.read.add(key)
        return super().__getitem__(key)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"conversation_key": "vip", "purpose": "x", "priority": None, "max_attempts": None},
        {"payload": "[1, 2]"},
        {"priority": "urgent"},
        {"id": None},
    ],
)
def test_row_to_intent_reads_only_the_intent_columns(overrides: dict[str, str | None]) -> None:
    # Every outbox_jobs column present, as pgoutput sends them.
    extra = {"status": "PENDING", "attempts": "0", "last_error": None, "sent_at": None}
    row = _Recording(_row(**overrides) | extra)
    row_to_intent(row, lsn="0/1", committed_at=None)
    assert row.read <= INTENT_COLUMNS
    # So the intent made from the intent columns alone is the same.
    partial = {k: v for k, v in row.items() if k in INTENT_COLUMNS}
    fast = row_to_intent(partial, lsn="0/1", committed_at=None)
    whole = row_to_intent(dict(row), lsn="0/1", committed_at=None)
    if isinstance(whole, IntentRejected):
        assert isinstance(fast, IntentRejected) and fast.reason == whole.reason
    else:
        assert isinstance(fast, CapturedIntent) and fast.dumps() == whole.dumps()
