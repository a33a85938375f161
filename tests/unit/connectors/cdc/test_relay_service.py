"""OutboxRelay as a runtime Service: its lifecycle states, its refusal to start, its summary."""

from __future__ import annotations

import asyncio
import socket

import pytest

from connectors.cdc.supervisor import SlotState
from streams.kernel.failures import StartRefused
from streams.kernel.runtime.service import ServiceState
from tests.unit.connectors.cdc.test_relay_loop import (
    DEADLINE_S,
    Harness,
    Txn,
    relation_message,
    until,
)


async def test_the_relay_goes_through_the_service_states_once() -> None:
    h = Harness()
    assert h.relay.state is ServiceState.CREATED
    assert h.relay.slot_state is SlotState.CONNECTING
    async with h.running() as task:
        assert h.relay.state is ServiceState.RUNNING
        await h.relay.start()  # idempotent
        t1 = Txn(1, rows=2)
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: h.relay.slot_state is SlotState.STREAMING, "streaming")
        await until(lambda: len(h.producer.sent) == 2, "two sends")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.relay.state is ServiceState.STOPPED
    assert h.relay.slot_state is SlotState.STOPPED
    await h.relay.stop()  # idempotent
    assert h.producer.stopped
    summary = h.relay.summary()
    assert summary.startswith("1 transactions, 2 intents, 0 rejected (0 reduced), 0 batches")
    assert f"confirmed {t1.end_lsn}" in summary


async def test_a_metrics_port_in_use_refuses_the_start_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        h = Harness(metrics_port=port, metrics_bind_local=True)
        with pytest.raises(StartRefused) as refused:
            await h.relay.start()
    assert not refused.value.retriable
    assert "ZAPSTREAM_RELAY_METRICS_PORT" in str(refused.value)
    assert "\n" not in str(refused.value)
    # A failed start stops what it started: nothing is left running.
    assert h.relay.state is ServiceState.STOPPED
    assert not h.producer.started
