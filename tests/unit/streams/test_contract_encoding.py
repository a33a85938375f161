"""Record encoding: ``Record.dumps`` is byte-compatible with the original ``asdict`` encoder.

The fast encoder serialises the dataclass natively with orjson and splices the
``schema`` member in; the reference below is the encoder it replaced. Records
written by either one decode the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from streams.kernel.contract import (
    AttemptFinished,
    CommandRequested,
    ContractError,
    IntentCaptured,
    IntentRejected,
    JobDead,
    ParkedConversation,
    Priority,
    ReceiptReceived,
    Record,
    StatusChanged,
    decode_topic_record,
)


def old_dumps(record: Record) -> bytes:
    """The encoder before issue 8: ``asdict`` (a deep copy), then ``schema``, then orjson."""
    data = dataclasses.asdict(record)
    data["schema"] = record.SCHEMA
    return orjson.dumps(data)


INTENT = IntentCaptured(
    job_id=42,
    instance_id="inst-01",
    conversation_key="5511987654321",
    idempotency_key="order-42",
    message_type="text",
    to="5511987654321",
    text='Olá "mundo" \\ \u2028 \U0001f600 \x00 <tag>',
    priority=Priority.BULK,
    purpose=None,
    expires_at="2026-12-01T10:00:00+00:00",
    max_attempts=3,
    created_at="2026-12-01T09:00:00.123456+00:00",
    committed_at="2026-12-01T09:00:00.200000+00:00",
    lsn="0/16B3748",
)

RECORDS: list[Record] = [
    INTENT,
    IntentCaptured(
        job_id=1,
        instance_id="i",
        conversation_key="c",
        idempotency_key="k",
        message_type="text",
        to="12345678",
        text="x",
    ),
    IntentRejected(job_id=None, reason="payload is not JSON", row={}),
    IntentRejected(
        job_id=7,
        reason="missing recipient",
        row={"id": "7", "payload": '{"a": 1}', "purpose": None, "ünï": "çødé"},
        lsn="1/0",
        committed_at="2026-12-01T09:00:00+00:00",
    ),
    AttemptFinished(
        job_id=42,
        idempotency_key="order-42",
        instance_id="inst-01",
        conversation_key="c",
        attempt=2,
        attempt_id="42-2",
        outcome="accepted",
        gateway="stackzap",
        gateway_job_id="gw-1",
        error=None,
    ),
    StatusChanged(
        job_id=42,
        idempotency_key="order-42",
        instance_id="inst-01",
        conversation_key="c",
        status="ACCEPTED",
        previous="ATTEMPTING",
        version=3,
        errors=["timeout", "503"],
        receipt_events=["e1"],
        outcome="cancelled",
        command_id=9,
    ),
    StatusChanged(
        job_id=1,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        status="PENDING",
        previous="",
        version=0,
    ),
    CommandRequested(
        command_id=3,
        command="reprocess",
        job_id=42,
        idempotency_key="order-42",
        instance_id="inst-01",
        conversation_key="c",
        reason="operator",
        actor="ops",
        intent=INTENT.to_dict(),
        lsn="0/10",
    ),
    ReceiptReceived(
        event_id="ev-1",
        job_id=42,
        idempotency_key="order-42",
        instance_id="inst-01",
        conversation_key="c",
        gateway="stackzap",
        gateway_job_id="gw-1",
        label="delivered",
        status="DELIVERED",
        reference="42-1",
    ),
    JobDead(
        job_id=None,
        idempotency_key=None,
        reason="poison",
        errors=[],
        record={"nested": {"list": [1, 2.5, None, True]}, "big": 2**62},
    ),
    ParkedConversation(3, 1764590400.5, "inst-01", 7, 12),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{type(r).__name__}")
def test_dumps_is_byte_identical_to_the_asdict_encoder(record: Record) -> None:
    assert record.dumps() == old_dumps(record)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{type(r).__name__}")
def test_records_written_by_either_encoder_decode_to_the_same_record(record: Record) -> None:
    for raw in (record.dumps(), old_dumps(record)):
        assert decode_topic_record(raw) == record
        assert type(record).loads(raw) == record


def test_schema_is_the_last_member_and_fields_keep_declaration_order() -> None:
    data: dict[str, Any] = orjson.loads(INTENT.dumps())
    names = [f.name for f in dataclasses.fields(IntentCaptured)]
    assert list(data) == [*names, "schema"]
    assert data["schema"] == IntentCaptured.SCHEMA
    assert data["priority"] == "bulk"


def test_a_record_without_fields_still_carries_its_schema() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Empty(Record):
        SCHEMA = "zapstream.test-empty.v1"

    assert Empty().dumps() == old_dumps(Empty()) == b'{"schema":"zapstream.test-empty.v1"}'


def test_a_parked_conversation_written_before_its_schema_decodes_as_v1() -> None:
    """The worker before issue 17 wrote the conversation record without a schema member."""
    legacy = b'{"partition":3,"due":1764590400.5,"instance":"shop","first":0,"next":2}'
    parked = ParkedConversation.loads(legacy)
    assert parked == ParkedConversation(3, 1764590400.5, "shop", 0, 2) and parked.messages == 2
    assert parked.dumps() == legacy[:-1] + b',"schema":"zapstream.parked.v1"}'


@pytest.mark.parametrize(
    "raw",
    [
        b'{"partition":3,"due":1.0,"instance":"shop","first":0,"next":2,"schema":"zapstream.parked.v2"}',
        b'{"partition":3,"due":1.0,"instance":"shop","first":0}',
        b'{"partition":"three","due":1.0,"instance":"shop","first":0,"next":2}',
        b"[1, 2]",
    ],
    ids=["other version", "missing field", "bad field", "not an object"],
)
def test_a_parked_conversation_that_is_not_one_is_a_contract_error(raw: bytes) -> None:
    with pytest.raises(ContractError):
        ParkedConversation.loads(raw)
