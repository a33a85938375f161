"""``outbox_optouts`` rows become OptOutChanged on zapstream.controls, or rejections."""

from __future__ import annotations

import pytest

from connectors.cdc.outbox_rows import optout_row_to_record, row_to_intent
from connectors.cdc.provisioning import OPTOUTS_TABLE, PUBLISHED_TABLES
from connectors.cdc.shaping import CONVERTERS, route_logical
from streams.kernel.contract import (
    CONTROLS,
    ContractError,
    IntentCaptured,
    IntentRejected,
    OptOutChanged,
    control_key,
    decode_topic_record,
)


def _row(**overrides: str | None) -> dict[str, str | None]:
    row: dict[str, str | None] = {
        "id": "31",
        "instance_id": "shop-1",
        "recipient": "5511987654321",
        "action": "out",
        "source": "app",
        "reason": "replied STOP",
        "job_id": None,
        "created_at": "2026-12-01 13:00:00.25+00",
    }
    row.update(overrides)
    return row


def test_an_opt_out_row_becomes_a_record_keyed_per_instance_and_person() -> None:
    record = optout_row_to_record(_row(), lsn="0/2A", committed_at=None)
    assert record == OptOutChanged(
        instance_id="shop-1",
        person="5511987654321",
        action="out",
        source="app",
        reason="replied STOP",
        at="2026-12-01T13:00:00.250000+00:00",
        optout_id=31,
        lsn="0/2A",
    )
    assert record.partition_key == b"optout:shop-1\x1f5511987654321"
    assert record.partition_key != control_key("instance", "shop-1")
    assert decode_topic_record(record.dumps()) == record
    assert route_logical(record) == (CONTROLS, record.partition_key)
    assert OPTOUTS_TABLE in PUBLISHED_TABLES and CONVERTERS[OPTOUTS_TABLE] is optout_row_to_record


def test_an_opt_in_from_meta_and_a_group() -> None:
    record = optout_row_to_record(
        _row(action="in", source="meta", recipient="120363025-1234@g.us"),
        lsn="0/1",
        committed_at=None,
    )
    assert isinstance(record, OptOutChanged)
    assert (record.action, record.source, record.person) == ("in", "meta", "120363025-1234@g.us")


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"action": "stop"}, "unknown opt-out action 'stop'"),
        ({"source": "crm"}, "unknown opt-out source 'crm'"),
        ({"recipient": "+55 11 98765-4321"}, "recipient is not a person"),
        ({"recipient": "5511987654321@s.whatsapp.net"}, "recipient is not a person"),
        ({"recipient": None}, "recipient"),
        ({"instance_id": "../x"}, "instance_id"),
        ({"id": None}, "id is missing"),
    ],
)
def test_a_row_that_breaks_the_contract_is_rejected(
    overrides: dict[str, str | None], reason: str
) -> None:
    row = _row(**overrides)
    record = optout_row_to_record(row, lsn="0/3", committed_at=None)
    assert isinstance(record, IntentRejected)
    assert reason in record.reason and record.job_id is None and record.row == row
    assert "98765" not in record.reason  # the number is never quoted


def test_a_record_from_another_producer_is_checked_on_decode() -> None:
    good = optout_row_to_record(_row(), lsn="0/1", committed_at=None)
    assert isinstance(good, OptOutChanged)
    for field, value in (("action", "maybe"), ("person", "+5511987654321"), ("instance_id", "")):
        data = good.to_dict() | {field: value}
        with pytest.raises(ContractError):
            OptOutChanged.from_dict(data)


def _job_row(payload: str) -> dict[str, str | None]:
    return {
        "id": "5",
        "instance_id": "shop-1",
        "idempotency_key": "k",
        "payload": payload,
        "priority": "bulk",
        "max_attempts": "3",
        "conversation_key": None,
        "purpose": None,
        "expires_at": None,
        "created_at": None,
    }


def test_the_payloads_respect_opt_out_reaches_the_intent() -> None:
    base = '{"to": "5511987654321", "text": "hi"'
    for extra, expected in (("", None), (', "respect_opt_out": true', True),
                            (', "respect_opt_out": false', False)):  # fmt: skip
        captured = row_to_intent(_job_row(base + extra + "}"), lsn="0/1", committed_at=None)
        assert not isinstance(captured, IntentRejected)
        intent = captured.record()
        assert isinstance(intent, IntentCaptured) and intent.respect_opt_out is expected
        assert captured.dumps() == intent.dumps()
    rejected = row_to_intent(_job_row(base + ', "respect_opt_out": "yes"}'), lsn="0/1",
                             committed_at=None)  # fmt: skip
    assert isinstance(rejected, IntentRejected) and "respect_opt_out" in rejected.reason
