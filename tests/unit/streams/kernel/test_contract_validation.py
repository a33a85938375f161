"""Every record read from Kafka is checked against its schema's types and rules.

Kafka is a command bus: whatever reaches ``zapstream.intents`` is sent with the
company's gateway credentials. A record of the wrong shape must fail to decode (the
worker dead-letters it with the reason), and the reason never quotes the value.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from streams.kernel.contract import (
    MAX_ATTEMPTS,
    AttemptFinished,
    CommandRequested,
    ContractError,
    ControlChanged,
    IntentCaptured,
    IntentRejected,
    JobDead,
    Priority,
    ReceiptReceived,
    Record,
    StatusChanged,
    decode_topic_record,
    instance_id_problem,
)

PHONE = "5511987654321"
SECRET_TEXT = "Your code is 482913"

INTENT = IntentCaptured(
    job_id=7,
    instance_id="shop-1",
    conversation_key=PHONE,
    idempotency_key="order-7",
    message_type="text",
    to=PHONE,
    text=SECRET_TEXT,
    priority=Priority.BULK,
)


def _forged(**changes: Any) -> bytes:
    return orjson.dumps({**orjson.loads(INTENT.dumps()), **changes})


def test_a_valid_intent_round_trips() -> None:
    assert decode_topic_record(INTENT.dumps()) == INTENT
    assert IntentCaptured.from_dict(INTENT.to_dict()) == INTENT  # enums are strings


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"job_id": "7"}, "job_id must be an integer, not a string"),
        ({"job_id": True}, "job_id must be an integer, not a boolean"),
        ({"job_id": 7.5}, "job_id must be an integer, not a number"),
        ({"to": int(PHONE)}, "to must be a string, not an integer"),
        ({"to": "+55 11 98765-4321"}, "to is not a normalised recipient"),
        ({"to": "5511987654321@evil.example"}, "to is not a normalised recipient"),
        ({"text": None}, "text must be a string, not null"),
        ({"text": ["a"]}, "text must be a string, not a list"),
        ({"text": ""}, "must not be empty"),
        ({"max_attempts": -1}, f"max_attempts must be from 1 to {MAX_ATTEMPTS}"),
        ({"max_attempts": 10**9}, f"max_attempts must be from 1 to {MAX_ATTEMPTS}"),
        ({"max_attempts": "5"}, "max_attempts must be an integer, not a string"),
        ({"priority": "urgent"}, "priority must be one of bulk, operational"),
        ({"instance_id": ".."}, "instance_id '..' is not"),
        ({"instance_id": "a/b"}, "instance_id 'a/b' is not"),
        ({"instance_id": "shop\n1"}, "is not 1 to 64"),
        ({"instance_id": "x" * 65}, "is not 1 to 64"),
        ({"expires_at": 1_700_000_000}, "expires_at must be a string or null, not an integer"),
    ],
)
def test_an_intent_of_the_wrong_shape_does_not_decode(changes: dict[str, Any], reason: str) -> None:
    with pytest.raises(ContractError) as caught:
        decode_topic_record(_forged(**changes))
    message = str(caught.value)
    assert reason in message, message
    assert PHONE not in message and SECRET_TEXT not in message


def test_an_instance_id_with_control_characters_is_never_echoed_raw() -> None:
    problem = instance_id_problem("shop\x1b]8;;http://evil\x07")
    assert problem is not None
    assert "\x1b" not in problem and "\x07" not in problem


@pytest.mark.parametrize(
    "instance_id",
    ["shop-1", "3EB0C5A1B2C3D4E5F6A7B8C9D0E1F2A3", "123456789012345", "a.b_c~d:e@f+g"],
)
def test_instance_ids_platforms_use_are_accepted(instance_id: str) -> None:
    assert instance_id_problem(instance_id) is None


@pytest.mark.parametrize("to", ["5511987654321", "5511987654321@s.whatsapp.net", "120363025@g.us"])
def test_every_normalised_recipient_form_is_accepted(to: str) -> None:
    assert IntentCaptured.loads(_forged(to=to, conversation_key=to)).to == to


def _valid_records() -> list[Record]:
    return [
        # A text with a fallback template: every field holds a value (an object is no
        # wrong value for a field that is None).
        dataclasses.replace(INTENT, template={"name": "t", "language": {"code": "pt_BR"}}),
        IntentRejected(job_id=None, reason="r", row={"id": "1", "payload": None}),
        AttemptFinished(
            job_id=1,
            idempotency_key="k",
            instance_id="i",
            conversation_key="c",
            attempt=1,
            attempt_id="a",
            outcome="accepted",
            gateway="stackzap",
        ),
        StatusChanged(
            job_id=1,
            idempotency_key="k",
            instance_id="i",
            conversation_key="c",
            status="ACCEPTED",
            previous="ATTEMPTING",
            version=2,
            attempts=1,
            actor="worker",
            at="2026-01-01T00:00:00+00:00",
            errors=["e"],
        ),
        CommandRequested(
            command_id=1,
            command="cancel",
            job_id=1,
            idempotency_key="k",
            instance_id="i",
            conversation_key="c",
            reason="r",
            actor="a",
            intent={"nested": {"any": [1, 2]}},
        ),
        ControlChanged(
            kind="instance",
            target="i",
            action="pause",
            reason="r",
            actor="a",
            at=None,
            control_id=1,
        ),
        JobDead(job_id=None, idempotency_key=None, reason="r", errors=["x"], record={"value": "v"}),
    ]


@pytest.mark.parametrize("record", _valid_records(), ids=lambda r: type(r).__name__)
def test_every_record_type_checks_its_fields(record: Record) -> None:
    raw = record.dumps()
    assert decode_topic_record(raw) == record
    data = orjson.loads(raw)
    for field in dataclasses.fields(record):
        wrong = {
            **data,
            field.name: {"not": "this"} if not isinstance(data[field.name], dict) else 3,
        }
        with pytest.raises(ContractError, match=rf"{field.name} must be"):
            decode_topic_record(orjson.dumps(wrong))


@pytest.mark.parametrize(
    ("field", "value"),
    [("errors", ["ok", 3]), ("row", {"id": 1}), ("errors", "one string")],
)
def test_lists_and_objects_check_their_items(field: str, value: object) -> None:
    records = {
        "errors": JobDead(job_id=1, idempotency_key="k", reason="r", errors=["e"]),
        "row": IntentRejected(job_id=1, reason="r", row={"id": "1"}),
    }
    data = orjson.loads(records[field].dumps())
    with pytest.raises(ContractError, match=rf"{field} must be"):
        decode_topic_record(orjson.dumps({**data, field: value}))


def test_receipts_are_checked_too() -> None:
    receipt = ReceiptReceived(
        event_id="e",
        job_id=1,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        gateway="stackzap",
        gateway_job_id="g",
        label="delivered",
        status="DELIVERED",
        received_at="2026-01-01T00:00:00+00:00",
    )
    data = orjson.loads(receipt.dumps())
    with pytest.raises(ContractError, match="job_id must be an integer"):
        decode_topic_record(orjson.dumps({**data, "job_id": "1"}))
