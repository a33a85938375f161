"""The relay's metrics: commit->Kafka-ack latency from the pgoutput commit timestamp to the ack.

Runs OutboxRelay's loop with the fakes of ``test_relay_loop`` and a fake wall
clock; the latency must be exactly (clock at the transaction's last ack) minus
(the commit timestamp in its Begin message).
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from prometheus_client import REGISTRY, generate_latest

from connectors.cdc.metrics import COMMIT_TO_ACK_BUCKETS, LatencyWindow
from connectors.cdc.replication_messages import XLogData
from tests.unit.connectors.cdc.test_relay_loop import (
    COMMIT_TS,
    DEADLINE_S,
    OUTBOX,
    SLOT_CONFIRMED,
    Harness,
    Txn,
    encode_insert,
    relation_message,
    settle,
    until,
)

COMMIT_S = COMMIT_TS.timestamp()


class FakeClock:
    def __init__(self) -> None:
        self.now = COMMIT_S

    def __call__(self) -> float:
        return self.now


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def _bucket(le: float) -> float:
    return _sample("zapstream_relay_commit_to_ack_seconds_bucket", {"le": str(float(le))})


async def test_latency_runs_from_commit_timestamp_to_the_last_ack_of_the_transaction() -> None:
    clock = FakeClock()
    h = Harness(clock=clock)
    t1, t2 = Txn(1, rows=2), Txn(2)
    count_before = _sample("zapstream_relay_commit_to_ack_seconds_count")
    le_5ms, le_7_5ms, le_15ms = _bucket(0.005), _bucket(0.0075), _bucket(0.015)
    rows_before = _sample("zapstream_relay_rows_total")
    clock.now = COMMIT_S + 0.001  # when the relay reads the Begins
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages(), *t2.messages())
        await until(lambda: len(h.producer.sent) == 3, "three sends")
        clock.now = COMMIT_S + 0.004
        h.producer.ack(t1.job_ids[0])
        await settle()
        assert h.relay.commit_to_ack.count == 0  # t1 still has a record outstanding
        clock.now = COMMIT_S + 0.007
        h.producer.ack(t1.job_ids[1])
        await settle()  # the ack callbacks run (and read the clock) here
        clock.now = COMMIT_S + 0.012
        h.producer.ack(*t2.job_ids)
        await until(lambda: h.relay.confirmed == t2.end_lsn, "t2 confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    window = h.relay.commit_to_ack
    assert window.count == 2
    found = window.quantiles(0.0, 1.0)
    assert found is not None
    assert abs(found[0] - 0.007) < 1e-6 and abs(found[1] - 0.012) < 1e-6
    assert _sample("zapstream_relay_commit_to_ack_seconds_count") == count_before + 2
    assert _bucket(0.005) == le_5ms  # neither is under 5 ms
    assert _bucket(0.0075) == le_7_5ms + 1  # 7 ms
    assert _bucket(0.015) == le_15ms + 2  # and 12 ms
    assert _sample("zapstream_relay_rows_total") == rows_before + 3
    assert _sample("zapstream_relay_confirmed_lsn") == t2.end_lsn.value
    assert window.summary().startswith("commit->ack p50 7.00 ms p99 12.00 ms max 12.00 ms")
    # PostgreSQL's share: from the commit timestamp to the relay reading the Begin.
    assert h.relay.commit_to_read.count == 2
    assert h.relay.commit_to_read.quantiles(1.0) == pytest.approx([0.001], abs=1e-6)


async def test_rejected_rows_are_counted_by_reason_and_still_timed() -> None:
    clock = FakeClock()
    h = Harness(clock=clock)
    rule = {"reason": "rule"}
    before = _sample("zapstream_relay_invalid_rows_total", rule)
    t1 = Txn(1)
    bad_row = ["101", "inst-1", "key-101", orjson.dumps([1, 2]).decode(), "operational", None]
    bad = XLogData.of(t1.commit_lsn, t1.commit_lsn, COMMIT_TS, encode_insert(OUTBOX.oid, bad_row))
    async with h.running() as task:
        h.source.push(relation_message(), *t1.begin(), bad, *t1.commit())
        await until(lambda: len(h.producer.sent) == 1, "the rejection")
        clock.now = COMMIT_S + 0.25
        h.producer.ack(101)
        await until(lambda: h.relay.confirmed == t1.end_lsn, "t1 confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert _sample("zapstream_relay_invalid_rows_total", rule) == before + 1
    assert h.relay.commit_to_ack.quantiles(0.5) == pytest.approx([0.25], abs=1e-6)


async def test_transactions_without_published_rows_are_not_timed() -> None:
    h = Harness(clock=FakeClock())
    t1 = Txn(1, rows=0)
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: h.relay.confirmed == t1.end_lsn, "t1 confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.relay.commit_to_ack.count == 0
    assert h.relay.confirmed > SLOT_CONFIRMED


def test_metrics_are_exported_with_the_fine_low_buckets() -> None:
    text = generate_latest(REGISTRY).decode()
    for name in (
        "zapstream_relay_commit_to_ack_seconds_bucket",
        "zapstream_relay_rows_total",
        "zapstream_relay_confirmed_lsn",
    ):
        assert name in text
    assert COMMIT_TO_ACK_BUCKETS[:6] == (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01)
    assert 'zapstream_relay_commit_to_ack_seconds_bucket{le="0.0075"}' in text


def test_latency_window_keeps_the_last_samples_exactly() -> None:
    window = LatencyWindow(size=100)
    for i in range(1, 201):
        window.observe(i / 1000)
    assert window.count == 200
    # Nearest rank over the last 100 (0.101 .. 0.200 s).
    assert window.quantiles(0.5, 0.99) == [0.150, 0.199]
    assert window.summary() == (
        "commit->ack p50 150.00 ms p99 199.00 ms max 200.00 ms "
        "over the last 100 of 200 transactions"
    )
    assert LatencyWindow().quantiles(0.5) is None
