"""SlotMonitor (slot lag gauges, WAL heartbeat) and the relay's readiness, with fakes.

The monitor's connection is a fake recording the SQL it is given; the relay
runs on the fakes of ``test_relay_loop``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from aiokafka.errors import KafkaTimeoutError
from prometheus_client import REGISTRY

from connectors.cdc.slot_monitor import HEARTBEAT_PREFIX, SlotMonitor, SlotPosition
from tests.unit.connectors.cdc.test_relay_loop import (
    DEADLINE_S,
    FakeSource,
    Harness,
    Txn,
    relation_message,
    until,
)

SLOT = "zapstream_test_slot"


def _sample(name: str) -> float | None:
    return REGISTRY.get_sample_value(name)


class FakeCursor:
    def __init__(self, row: tuple[Any, ...] | None) -> None:
        self._row = row

    async def fetchone(self) -> tuple[Any, ...] | None:
        return self._row


class FakeConnection:
    """Answers the slot query with ``row``; raises ``heartbeat_error`` on a heartbeat."""

    def __init__(
        self, row: tuple[Any, ...] | None, heartbeat_error: Exception | None = None
    ) -> None:
        self.row = row
        self.heartbeat_error = heartbeat_error
        self.queries: list[tuple[str, tuple[Any, ...]]] = []
        self.closed = False

    async def execute(self, query: str, params: tuple[Any, ...] = ()) -> FakeCursor:
        self.queries.append((query, params))
        if "pg_logical_emit_message" in query:
            if self.heartbeat_error is not None:
                raise self.heartbeat_error
            return FakeCursor(("0/1",))
        return FakeCursor(self.row)

    async def close(self) -> None:
        self.closed = True

    @property
    def heartbeats(self) -> int:
        return sum("pg_logical_emit_message" in q for q, _ in self.queries)


class Connector:
    """``connect`` for the monitor: fails with each of ``failures`` first, then hands out conns."""

    def __init__(self, conn: FakeConnection, failures: list[Exception] | None = None) -> None:
        self.conn = conn
        self.failures = list(failures or [])
        self.attempts = 0

    async def __call__(self) -> Any:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        self.conn.closed = False
        return self.conn


def _monitor(
    connector: Connector,
    *,
    interval_s: float = 60.0,
    heartbeat_s: float = 0.0,
    streaming: bool = True,
    clock: float = 1_700_000_000.0,
) -> SlotMonitor:
    return SlotMonitor(
        "postgresql://unused",
        SLOT,
        interval_s=interval_s,
        heartbeat_interval_s=heartbeat_s,
        streaming=lambda: streaming,
        clock=lambda: clock,
        connect=connector,
    )


async def test_a_read_sets_the_lag_and_retained_wal_gauges() -> None:
    conn = FakeConnection((1234, 56789, True))
    monitor = _monitor(Connector(conn), clock=1_700_000_123.0)
    position = await monitor.read_once()
    assert position == SlotPosition(lag_bytes=1234, retained_wal_bytes=56789, active=True)
    assert _sample("zapstream_relay_slot_lag_bytes") == 1234
    assert _sample("zapstream_relay_slot_retained_wal_bytes") == 56789
    assert _sample("zapstream_relay_slot_metrics_last_read_seconds") == 1_700_000_123.0
    assert conn.queries[0][1] == (SLOT,)
    conn.row = (99, 100, False)
    await monitor.read_once()
    assert _sample("zapstream_relay_slot_lag_bytes") == 99
    await monitor.stop()
    assert conn.closed


async def test_a_missing_slot_is_logged_once_and_leaves_the_gauges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = FakeConnection((7, 8, True))
    monitor = _monitor(Connector(conn))
    await monitor.read_once()
    conn.row = None
    with caplog.at_level(logging.WARNING, logger="connectors.cdc.slot_monitor"):
        assert await monitor.read_once() is None
        assert await monitor.read_once() is None
    assert len([r for r in caplog.records if "does not exist" in r.message]) == 1
    assert _sample("zapstream_relay_slot_lag_bytes") == 7
    await monitor.stop()


async def test_postgresql_away_is_logged_once_per_outage_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = psycopg.OperationalError("connection refused")
    connector = Connector(FakeConnection((5, 6, True)), failures=[refused, refused, refused])
    monitor = _monitor(connector)
    with caplog.at_level(logging.INFO, logger="connectors.cdc.slot_monitor"):
        for _ in range(3):
            assert await monitor.read_once() is None
        assert await monitor.read_once() == SlotPosition(5, 6, True)
    messages = [r.message for r in caplog.records]
    assert sum("unavailable" in m for m in messages) == 1, messages
    assert sum("available again" in m for m in messages) == 1, messages
    assert connector.attempts == 4
    await monitor.stop()


async def test_heartbeats_are_written_only_while_streaming() -> None:
    conn = FakeConnection((0, 0, True))
    streaming = False
    ticks = 0

    def is_streaming() -> bool:
        # Asked at each heartbeat tick: the count is the signal that ticks went by.
        nonlocal ticks
        ticks += 1
        return streaming

    monitor = SlotMonitor(
        "postgresql://unused",
        SLOT,
        interval_s=60.0,
        heartbeat_interval_s=0.01,
        streaming=is_streaming,
        clock=lambda: 1_700_000_456.0,
        connect=Connector(conn),
    )
    async with monitor:
        await until(lambda: len(conn.queries) >= 1, "the first slot read")
        # Several heartbeat intervals pass as a standby: nothing is written.
        await until(lambda: ticks >= 5, "five heartbeat ticks")
        assert conn.heartbeats == 0
        streaming = True
        await until(lambda: conn.heartbeats >= 3, "three heartbeats")
    heartbeat = next(q for q in conn.queries if "pg_logical_emit_message" in q[0])
    assert "pg_logical_emit_message(false," in heartbeat[0]  # non-transactional
    assert heartbeat[1] == (HEARTBEAT_PREFIX,)
    assert monitor.heartbeats == conn.heartbeats
    assert _sample("zapstream_relay_heartbeat_last_seconds") == 1_700_000_456.0


async def test_a_refused_heartbeat_switches_heartbeats_off_and_reads_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    denied = psycopg.errors.InsufficientPrivilege("permission denied for pg_logical_emit_message")
    conn = FakeConnection((3, 4, True), heartbeat_error=denied)
    monitor = _monitor(Connector(conn))
    with caplog.at_level(logging.WARNING, logger="connectors.cdc.slot_monitor"):
        assert await monitor.heartbeat_once() is False
        assert await monitor.heartbeat_once() is False
    assert conn.heartbeats == 1
    assert len([r for r in caplog.records if "heartbeat off" in r.message]) == 1
    assert await monitor.read_once() == SlotPosition(3, 4, True)
    await monitor.stop()


async def test_readiness_follows_standby_streaming_and_stop() -> None:
    # The first attempt finds the slot taken (standby), the retry 50 ms later streams.
    h = Harness(sources=2, standby_retry_s=0.05)
    h.sources[0] = FakeSource(h.events, slot_in_use=True)
    assert h.relay.readiness() == (False, "connecting")
    async with h.running() as task:
        await until(lambda: h.relay.readiness() == (False, "standby"), "standby")
        assert _sample("zapstream_relay_active") == 0
        assert not h.relay.is_streaming()
        await until(lambda: h.relay.readiness() == (True, "streaming"), "streaming")
        assert _sample("zapstream_relay_active") == 1
        assert h.relay.is_streaming()
        h.relay.request_stop()
        assert h.relay.readiness() == (False, "stopping")
        await asyncio.wait_for(task, DEADLINE_S)
    assert _sample("zapstream_relay_active") == 0


async def test_not_ready_from_a_kafka_failure_until_kafka_acknowledges_again() -> None:
    # Reconnects slow enough to see the relay streaming again before Kafka answers.
    h = Harness(sources=2, reconnect_initial_s=0.01, reconnect_max_s=0.02)
    first, second = h.sources
    t1, t2 = Txn(1), Txn(2)
    async with h.running() as task:
        first.push(relation_message(), *t1.messages(), *t2.messages())
        await until(lambda: len(h.producer.sent) == 2, "two sends")
        h.producer.ack(*t1.job_ids)
        await until(lambda: h.relay.readiness() == (True, "streaming"), "ready")
        h.producer.of(t2.job_ids[0]).set_exception(KafkaTimeoutError("batch expired"))
        await until(lambda: h.relay.readiness()[0] is False, "not ready after the failure")
        second.push(relation_message(), *t2.messages())
        # Streaming the slot again, but Kafka has not taken a record since the failure.
        await until(lambda: len(h.producer.sent) == 3, "t2 produced again")
        assert h.relay.readiness() == (False, "kafka unavailable")
        h.producer.ack(*t2.job_ids)
        await until(lambda: h.relay.readiness() == (True, "streaming"), "ready again")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
