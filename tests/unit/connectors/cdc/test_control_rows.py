"""``outbox_controls`` rows become ControlChanged on zapstream.controls, or rejections.

First the row conversion (pgoutput's text values in, a record out), then the
relay's loop fed real pgoutput bytes (the encoder of ``test_relay_loop``): the
control is produced to ``zapstream.controls`` keyed by ``kind:target``, a
malformed one to ``zapstream.invalid``, and the WAL position is confirmed only
once Kafka acknowledged the record.
"""

from __future__ import annotations

import asyncio

import pytest

from connectors.cdc.outbox_rows import control_row_to_record
from connectors.cdc.pgoutput import Column, Relation
from connectors.cdc.provisioning import CONTROLS_TABLE, PUBLISHED_TABLES
from streams.kernel.contract import (
    CONTROLS,
    HEADER_SCHEMA,
    INVALID,
    ControlChanged,
    IntentRejected,
    decode_topic_record,
    topic_specs,
)
from tests.unit.connectors.cdc.test_relay_loop import (
    DEADLINE_S,
    SLOT_CONFIRMED,
    Harness,
    Txn,
    _xlog,
    encode_insert,
    encode_relation,
    settle,
    until,
)


def _row(**overrides: str | None) -> dict[str, str | None]:
    row: dict[str, str | None] = {
        "id": "12",
        "kind": "instance",
        "target": "shop-1",
        "action": "pause",
        "reason": "number flagged by Meta",
        "actor": "alice",
        "created_at": "2026-12-01 13:00:00.25+00",
    }
    row.update(overrides)
    return row


def test_a_pause_becomes_a_control_keyed_by_kind_and_target() -> None:
    record = control_row_to_record(_row(), lsn="0/2A", committed_at="2026-12-01T13:00:01+00:00")
    assert record == ControlChanged(
        kind="instance",
        target="shop-1",
        action="pause",
        reason="number flagged by Meta",
        actor="alice",
        at="2026-12-01T13:00:00.250000+00:00",
        control_id=12,
        lsn="0/2A",
    )
    assert record.partition_key == b"instance:shop-1"
    assert decode_topic_record(record.dumps()) == record


def test_a_campaign_resume_is_a_control_too() -> None:
    record = control_row_to_record(
        _row(kind="campaign", target="black-friday", action="resume"), lsn="0/1", committed_at=None
    )
    assert isinstance(record, ControlChanged)
    assert (record.kind, record.target, record.action) == ("campaign", "black-friday", "resume")
    assert record.partition_key == b"campaign:black-friday"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"kind": "tenant"}, "unknown control kind 'tenant'"),
        ({"kind": None}, "unknown control kind None"),
        ({"action": "stop"}, "unknown control action 'stop'"),
        ({"target": "  "}, "target"),
        ({"target": None}, "target"),
        ({"reason": " "}, "reason is missing or empty"),
        ({"reason": None}, "reason is missing or empty"),
        ({"actor": ""}, "actor is missing or empty"),
        ({"id": None}, "id is missing"),
        ({"created_at": "yesterday"}, "unreadable timestamp"),
    ],
)
def test_a_malformed_row_is_rejected_with_its_reason_and_the_whole_row(
    overrides: dict[str, str | None], reason: str
) -> None:
    row = _row(**overrides)
    record = control_row_to_record(row, lsn="0/3", committed_at="2026-12-01T13:00:01+00:00")
    assert isinstance(record, IntentRejected)
    assert reason in record.reason
    assert record.job_id is None  # the state sink marks no job INVALID for it
    assert record.row == row
    assert (record.lsn, record.committed_at) == ("0/3", "2026-12-01T13:00:01+00:00")


def test_controls_topic_is_one_compacted_partition_and_published() -> None:
    (spec,) = [s for s in topic_specs(8) if s.name == CONTROLS]
    assert spec.partitions == 1
    assert spec.configs["cleanup.policy"] == "compact"
    assert CONTROLS_TABLE == "outbox_controls" and CONTROLS_TABLE in PUBLISHED_TABLES


# --- through the relay's loop, from pgoutput bytes --------------------------------------

_COLUMNS = [
    ("id", 20),
    ("kind", 25),
    ("target", 25),
    ("action", 25),
    ("reason", 25),
    ("actor", 25),
    ("created_at", 1184),
]
CONTROLS_RELATION = Relation(
    oid=16420,
    namespace="public",
    name="outbox_controls",
    replica_identity="d",
    columns=tuple(
        Column(flags=1 if name == "id" else 0, name=name, type_oid=oid, type_modifier=-1)
        for name, oid in _COLUMNS
    ),
)


def _control_txn(txn: Txn, *rows: dict[str, str | None]) -> list[object]:
    inserts = [
        _xlog(
            encode_insert(CONTROLS_RELATION.oid, [row[name] for name, _ in _COLUMNS]),
            txn.commit_lsn,
        )
        for row in rows
    ]
    return [*txn.begin(), *inserts, *txn.commit()]


async def test_the_relay_produces_a_control_and_confirms_it_only_once_acknowledged() -> None:
    h = Harness()
    t1 = Txn(1)
    async with h.running() as task:
        h.source.push(
            _xlog(encode_relation(CONTROLS_RELATION), SLOT_CONFIRMED),
            *_control_txn(t1, _row()),  # type: ignore[arg-type]
        )
        await until(lambda: len(h.producer.sent) == 1, "the control's send")
        (sent,) = h.producer.sent
        assert sent.topic == CONTROLS
        assert sent.key == b"instance:shop-1"
        assert dict(sent.headers)[HEADER_SCHEMA] == ControlChanged.SCHEMA.encode()
        control = decode_topic_record(sent.value)
        assert isinstance(control, ControlChanged)
        assert (control.control_id, control.action, control.actor) == (12, "pause", "alice")
        assert control.lsn == str(t1.commit_lsn)
        # Not acknowledged yet: nothing past the slot's position is confirmed.
        await settle()
        assert all(flush < t1.end_lsn for flush in h.source.flushes)
        sent.future.set_result(None)
        await until(lambda: t1.end_lsn in h.source.flushes, "confirmation of the control")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.source.flushes[-1] == t1.end_lsn


async def test_the_relay_sends_a_malformed_control_to_invalid_and_goes_on() -> None:
    h = Harness()
    t1, t2 = Txn(1), Txn(2)
    async with h.running() as task:
        h.source.push(
            _xlog(encode_relation(CONTROLS_RELATION), SLOT_CONFIRMED),
            *_control_txn(t1, _row(id="13", kind="tenant")),  # type: ignore[arg-type]
            *_control_txn(t2, _row(id="14", action="resume")),  # type: ignore[arg-type]
        )
        await until(lambda: len(h.producer.sent) == 2, "both sends")
        for sent in h.producer.sent:
            sent.future.set_result(None)
        await until(lambda: t2.end_lsn in h.source.flushes, "confirmation of both")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    bad, good = h.producer.sent
    assert bad.topic == INVALID
    rejected = decode_topic_record(bad.value)
    assert isinstance(rejected, IntentRejected)
    assert "unknown control kind 'tenant'" in rejected.reason
    assert rejected.row["id"] == "13" and rejected.row["kind"] == "tenant"
    assert good.topic == CONTROLS and good.key == b"instance:shop-1"
    resumed = decode_topic_record(good.value)
    assert isinstance(resumed, ControlChanged)
    assert (resumed.control_id, resumed.action) == (14, "resume")
    assert h.relay.stats.rejected == 1
