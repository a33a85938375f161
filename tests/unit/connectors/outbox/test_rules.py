"""The intent rules, and proof that the API and the relay both reject by them."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

from connectors.cdc.outbox_rows import row_to_record
from connectors.outbox import enqueue
from connectors.outbox.enqueue import InvalidIntent, _validate
from connectors.outbox.rules import (
    MAX_TEXT_CHARS,
    SUPPORTED_TYPES,
    RuleViolation,
    check_conversation_key,
    check_expires_at,
    check_max_attempts,
    check_message_type,
    check_priority,
    check_recipient,
    require_text,
    required,
)
from streams.kernel.contract import IntentCaptured, IntentRejected, Priority

AWARE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PRIORITIES = "use one of operational, bulk"
INSTANCE_RULE = "instance_id '{}' is not 1 to 64 of A-Z a-z 0-9 . _ ~ : @ + - (and not . or ..)"
NOT_A_PHONE = "is not an international phone number (8 to 15 digits with country code)"


def test_limits() -> None:
    assert MAX_TEXT_CHARS == 4096
    assert SUPPORTED_TYPES == {"text", "template"}
    assert enqueue.MAX_TEXT_CHARS == MAX_TEXT_CHARS  # still importable from the API
    assert issubclass(RuleViolation, ValueError)


@pytest.mark.parametrize("value", ["shop-1", " shop-1 ", "x"])
def test_required_returns_the_value_unchanged(value: str) -> None:
    assert required(value, "instance_id") == value


@pytest.mark.parametrize("value", [None, "", "   ", "\t\n", 42, b"shop-1"])
def test_required_rejects_absent_blank_and_non_strings(value: object) -> None:
    with pytest.raises(RuleViolation) as raised:
        required(value, "instance_id")
    assert str(raised.value) == "instance_id is required"
    with pytest.raises(RuleViolation) as raised:
        required(value, "instance_id", problem="is missing")
    assert str(raised.value) == "instance_id is missing"


@pytest.mark.parametrize("value", ["hi", " hi ", "x" * MAX_TEXT_CHARS, "😀" * MAX_TEXT_CHARS])
def test_text_within_the_limit_is_returned_unchanged(value: str) -> None:
    assert require_text(value) == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "text is empty"),
        ("", "text is empty"),
        ("  \n", "text is empty"),
        (["hi"], "text is empty"),
        ("x" * 4097, "text has 4097 characters; the limit is 4096"),
        # The limit counts characters (code points), not bytes.
        ("😀" * 5000, "text has 5000 characters; the limit is 4096"),
    ],
)
def test_text_rejections(value: object, reason: str) -> None:
    with pytest.raises(RuleViolation) as raised:
        require_text(value)
    assert str(raised.value) == reason


def test_text_absence_can_be_worded_by_the_caller() -> None:
    with pytest.raises(RuleViolation) as raised:
        require_text("", problem="is missing or empty")
    assert str(raised.value) == "text is missing or empty"
    with pytest.raises(RuleViolation) as raised:
        require_text("x" * 4097, problem="is missing or empty")
    assert str(raised.value) == "text has 4097 characters; the limit is 4096"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("+55 (11) 98765-4321", "5511987654321"),
        ("5511987654321@s.whatsapp.net", "5511987654321@s.whatsapp.net"),
        ("120363025246125888@g.us", "120363025246125888@g.us"),
    ],
)
def test_recipient_is_normalised(value: str, expected: str) -> None:
    assert check_recipient(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "recipient is missing"),
        ("  ", "recipient is missing"),
        ("12345", f"recipient '*****' {NOT_A_PHONE}"),
        ("someone@example.com", "recipient 'so***@example.com' is not a WhatsApp JID"),
    ],
)
def test_recipient_rejections_keep_the_masked_reason(value: object, reason: str) -> None:
    with pytest.raises(RuleViolation) as raised:
        check_recipient(value)
    assert str(raised.value) == reason


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("operational", Priority.OPERATIONAL),
        ("bulk", Priority.BULK),
        (Priority.BULK, Priority.BULK),
    ],
)
def test_priority_is_one_of_the_contract_values(value: str, expected: Priority) -> None:
    assert check_priority(value) is expected


@pytest.mark.parametrize("value", ["urgent", "BULK", "", None, 1])
def test_priority_rejections_name_the_allowed_values(value: object) -> None:
    with pytest.raises(RuleViolation) as raised:
        check_priority(value)
    assert str(raised.value) == f"unknown priority {value!r}; {PRIORITIES}"


@pytest.mark.parametrize("value", [1, 5, 100])
def test_max_attempts_positive_integer(value: int) -> None:
    assert check_max_attempts(value) == value


@pytest.mark.parametrize("value", [0, -1, "5", 1.5, None, 101, 10**9, True])
def test_max_attempts_rejections(value: object) -> None:
    with pytest.raises(RuleViolation) as raised:
        check_max_attempts(value)
    assert str(raised.value) == f"max_attempts must be an integer from 1 to 100, not {value!r}"


def test_message_type_text_is_supported() -> None:
    assert check_message_type("text") == "text"


@pytest.mark.parametrize("value", ["image", "TEXT", "", None, ["text"], {"type": "text"}])
def test_message_type_rejections(value: object) -> None:
    with pytest.raises(RuleViolation) as raised:
        check_message_type(value)
    assert str(raised.value) == f"unknown message type {value!r}"


@pytest.mark.parametrize("value", [None, AWARE])
def test_expires_at_absent_or_aware(value: dt.datetime | None) -> None:
    assert check_expires_at(value) is value


def test_expires_at_naive_is_rejected() -> None:
    with pytest.raises(RuleViolation) as raised:
        check_expires_at(dt.datetime(2030, 1, 1))
    assert str(raised.value) == "expires_at must be timezone-aware"


@pytest.mark.parametrize("value", [None, "5511987654321", "order-7"])
def test_conversation_key_absent_or_given(value: str | None) -> None:
    assert check_conversation_key(value) == value


@pytest.mark.parametrize("value", ["", "   "])
def test_conversation_key_given_empty_is_rejected(value: str) -> None:
    with pytest.raises(RuleViolation) as raised:
        check_conversation_key(value)
    assert str(raised.value) == "conversation_key, when given, must not be empty"


# Both ends of the outbox, fed the same intent.

INTENT: dict[str, object] = {
    "instance_id": "shop-1",
    "to": "+55 11 98765-4321",
    "text": "hi",
    "idempotency_key": "order-1",
    "conversation_key": None,
    "priority": "operational",
    "purpose": None,
    "expires_at": None,
    "max_attempts": 5,
}


def _through_enqueue(**overrides: object) -> str:
    with pytest.raises(InvalidIntent) as raised:
        _validate(**{**INTENT, **overrides})  # type: ignore[arg-type]
    return str(raised.value)


def _as_row(**overrides: object) -> dict[str, str | None]:
    """The intent as pgoutput delivers the row ``enqueue`` would have written."""
    intent = {**INTENT, **overrides}
    payload = {"type": "text", "to": intent["to"], "text": intent["text"]}
    return {
        "id": "42",
        "instance_id": None if intent["instance_id"] is None else str(intent["instance_id"]),
        "payload": orjson.dumps(payload).decode(),
        "idempotency_key": str(intent["idempotency_key"]),
        "conversation_key": None,
        "priority": str(intent["priority"]),
        "purpose": None,
        "expires_at": None,
        "max_attempts": str(intent["max_attempts"]),
        "created_at": "2026-11-29 15:50:00+00",
    }


def _through_relay(**overrides: object) -> str:
    record = row_to_record(_as_row(**overrides), lsn="0/1", committed_at=None)
    assert isinstance(record, IntentRejected), record
    return record.reason


def test_the_same_intent_is_valid_at_both_ends() -> None:
    _validate(**INTENT)  # type: ignore[arg-type]
    record = row_to_record(_as_row(), lsn="0/1", committed_at=None)
    assert isinstance(record, IntentCaptured)
    assert record.to == "5511987654321"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"text": "x" * 4097}, "text has 4097 characters; the limit is 4096"),
        ({"to": "12345"}, f"recipient '*****' {NOT_A_PHONE}"),
        ({"to": "someone@example.com"}, "recipient 'so***@example.com' is not a WhatsApp JID"),
        ({"to": ""}, "recipient is missing"),
        ({"priority": "urgent"}, f"unknown priority 'urgent'; {PRIORITIES}"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 100, not 0"),
        # The gateway's URL path would resolve '..' and call another endpoint.
        ({"instance_id": ".."}, INSTANCE_RULE.format("..")),
        ({"instance_id": "shop/1"}, INSTANCE_RULE.format("shop/1")),
        ({"instance_id": "shop\x1b[2J"}, INSTANCE_RULE.format("shop\\x1b[2J")),
        ({"instance_id": "i" * 65}, INSTANCE_RULE.format("i" * 20)),
    ],
)
def test_api_and_relay_reject_by_the_same_rule(overrides: dict[str, object], reason: str) -> None:
    assert _through_enqueue(**overrides) == reason
    assert _through_relay(**overrides) == reason


@pytest.mark.parametrize(
    ("overrides", "api_reason", "relay_reason"),
    [
        ({"text": ""}, "text is empty", "text is missing or empty"),
        ({"text": "   "}, "text is empty", "text is missing or empty"),
        ({"instance_id": ""}, "instance_id is required", "instance_id is missing"),
        ({"instance_id": None}, "instance_id is required", "instance_id is missing"),
    ],
)
def test_absence_is_the_same_rule_worded_for_each_end(
    overrides: dict[str, object], api_reason: str, relay_reason: str
) -> None:
    assert _through_enqueue(**overrides) == api_reason
    assert _through_relay(**overrides) == relay_reason


@pytest.mark.parametrize("kind", ["image", None, ["text"]])
def test_relay_rejects_unsupported_types_which_the_api_cannot_write(kind: object) -> None:
    row = _as_row()
    row["payload"] = orjson.dumps({"type": kind, "to": "5511987654321", "text": "hi"}).decode()
    record = row_to_record(row, lsn="0/1", committed_at=None)
    assert isinstance(record, IntentRejected)
    assert record.reason == f"unknown message type {kind!r}"


def test_send_at_and_timezone_rules() -> None:
    from connectors.outbox.rules import check_send_at, check_send_window, check_timezone

    aware = dt.datetime(2030, 1, 1, 9, tzinfo=dt.UTC)
    assert check_send_at(aware) is aware and check_send_at(None) is None
    with pytest.raises(RuleViolation, match="send_at must be timezone-aware"):
        check_send_at(dt.datetime(2030, 1, 1, 9))
    check_send_window(aware, aware + dt.timedelta(hours=1))
    check_send_window(aware, None)
    with pytest.raises(RuleViolation, match="before expires_at"):
        check_send_window(aware, aware)
    assert check_timezone(" America/Sao_Paulo ") == "America/Sao_Paulo"
    for bad in ("Mars/Olympus", "", "../etc/passwd", 3):
        with pytest.raises(RuleViolation, match="IANA timezone"):
            check_timezone(bad)


def test_the_relay_applies_the_timezone_rule_to_plain_sql_rows() -> None:
    payload = {"type": "text", "to": "5511987654321", "text": "hi"}
    row = {
        "id": "1",
        "instance_id": "i",
        "idempotency_key": "k",
        "payload": orjson.dumps({**payload, "timezone": "Europe/Lisbon"}).decode(),
    }
    record = row_to_record(row, lsn="0/1", committed_at=None)
    assert not isinstance(record, IntentRejected) and record.timezone == "Europe/Lisbon"
    row["payload"] = orjson.dumps({**payload, "timezone": "Nowhere/Land"}).decode()
    rejected = row_to_record(row, lsn="0/1", committed_at=None)
    assert isinstance(rejected, IntentRejected) and "IANA timezone" in rejected.reason


def test_respect_opt_out_is_one_rule_worded_for_each_end() -> None:
    assert _through_enqueue(respect_opt_out="yes") == "respect_opt_out must be True, False or None"
    row = {
        **_as_row(),
        "payload": orjson.dumps(
            {"type": "text", "to": "5511987654321", "text": "x", "respect_opt_out": "yes"}
        ).decode(),
    }
    record = row_to_record(row, lsn="0/1", committed_at=None)
    assert isinstance(record, IntentRejected)
    assert record.reason == "respect_opt_out must be true, false or absent"
