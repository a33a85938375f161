"""The dispatcher with a parked backlog: order, exactly-once, bounded records, gauges (no I/O).

The processor is a stand-in that fails a conversation's sends while told to
(as a gateway answering 503) and records what it sent; the parking lot is the
real one over Faust's in-memory store.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from faust.types import TP
from prometheus_client import REGISTRY

from streams.agents import Dispatcher
from streams.instance_pauses import InstancePauses
from streams.job_processor import Done, Outcome, Park
from streams.kernel.contract import INTENTS, IntentCaptured, StatusChanged
from streams.parking import ParkingLot
from tests.unit.streams.test_parking import Changelog, Table, intent, queue

PARTITION = 2


class Processor:
    """Sends unless the conversation is failing; a failed send parks, due at once."""

    def __init__(self, pauses: InstancePauses | None = None) -> None:
        self.pauses = pauses or InstancePauses()
        self.failing: set[str] = set()
        self.sent: list[int] = []
        self.attempts: list[int] = []
        self.gate: asyncio.Event | None = None
        self.store = types.SimpleNamespace(get=self._state)
        self.settled: set[int] = set()

    def _state(self, job_id: int) -> StatusChanged | None:
        return None  # every job is new (PENDING) to the dispatcher's check

    async def on_intent(
        self, intent: IntentCaptured, partition: int, *, reprocess: Any = None, probe: bool = False
    ) -> Outcome:
        if self.gate is not None:
            await self.gate.wait()
        self.attempts.append(intent.job_id)
        if intent.job_id in self.settled:
            return Done(None)  # a duplicate: the jobs table knows it
        if intent.conversation_key in self.failing:
            return Park(due=0.0, state=None)
        self.sent.append(intent.job_id)
        self.settled.add(intent.job_id)
        return Done(None)


class Event:
    def __init__(self, value: IntentCaptured, offset: int) -> None:
        self.value = value.dumps()
        self.message = types.SimpleNamespace(
            topic=INTENTS, partition=PARTITION, offset=offset, value=self.value
        )
        self.acked = False

    def ack(self) -> None:
        self.acked = True


class Stream:
    def __init__(self, events: list[Event]) -> None:
        self._events = events

    def noack(self) -> Stream:
        return self

    async def events(self) -> Any:
        for event in self._events:
            yield event


def dispatcher() -> tuple[Dispatcher, Processor, ParkingLot, Changelog]:
    changelog = Changelog()
    lot = ParkingLot(Table(), changelog)
    processor = Processor(InstancePauses(waiting=lot.waiting))
    app = types.SimpleNamespace(
        consumer=types.SimpleNamespace(assignment=lambda: {TP(INTENTS, PARTITION)}),
        _crash=lambda exc: (_ for _ in ()).throw(exc),
        rebalancing=False,
        in_recovery=False,
    )
    d = Dispatcher(app, None, processor, lot, max_in_flight=64)  # type: ignore[arg-type]
    return d, processor, lot, changelog


async def test_a_backlog_behind_a_failing_head_goes_out_in_order_exactly_once() -> None:
    d, processor, lot, changelog = dispatcher()
    processor.failing.add("alice")
    backlog = [intent(job_id) for job_id in range(300)]
    others = [intent(1_000 + n, "bob") for n in range(5)]
    events = [Event(i, n) for n, i in enumerate([*backlog[:1], *others, *backlog[1:]])]
    await d.consume(Stream(events))
    assert await d.lanes.join(5)
    assert all(e.acked for e in events)  # parked durably, so acknowledged
    assert processor.sent == [i.job_id for i in others]
    key = backlog[0].partition_key
    assert queue(lot, key) == list(range(300))
    assert processor.pauses.waiting("shop") == 300
    # No record grows with the backlog: one intent at most.
    assert max(len(v or b"") for _, v, _ in changelog.sent) <= max(len(i.dumps()) for i in backlog)

    await d.fire_due_retries()  # still failing: the head parks again, nothing else runs
    assert await d.lanes.join(5)
    assert processor.attempts.count(0) == 2 and queue(lot, key) == list(range(300))

    processor.failing.clear()
    await d.fire_due_retries()
    assert await d.lanes.join(5)
    assert processor.sent[len(others) :] == list(range(300))
    assert lot.get(key) is None and len(lot.store) == 0 and processor.pauses.waiting("shop") == 0


async def test_a_waiting_message_that_fails_becomes_the_head_and_keeps_its_followers() -> None:
    d, processor, lot, _ = dispatcher()
    processor.failing.add("alice")
    await d.consume(Stream([Event(intent(n), n) for n in range(5)]))
    assert await d.lanes.join(5)
    key = intent(0).partition_key
    processor.failing.clear()
    processor.settled.add(2)  # job 2 was settled elsewhere (a duplicate): skipped, not resent
    original = processor.on_intent

    async def fail_job_3(i: IntentCaptured, p: int, **kw: Any) -> Outcome:
        if i.job_id == 3 and processor.attempts.count(3) == 0:
            processor.attempts.append(3)
            return Park(due=0.0, state=None)
        return await original(i, p, **kw)

    processor.on_intent = fail_job_3  # type: ignore[method-assign]
    await d.fire_due_retries()
    assert await d.lanes.join(5)
    assert processor.sent == [0, 1] and queue(lot, key) == [3, 4]
    await d.fire_due_retries()
    assert await d.lanes.join(5)
    assert processor.sent == [0, 1, 3, 4] and lot.get(key) is None


async def test_a_redelivered_parked_intent_is_not_queued_twice() -> None:
    d, processor, lot, _ = dispatcher()
    processor.failing.add("alice")
    events = [Event(intent(n), n) for n in range(3)]
    await d.consume(Stream(events))
    await d.consume(Stream([Event(intent(n), n) for n in range(3)]))  # redelivered
    assert await d.lanes.join(5)
    assert queue(lot, intent(0).partition_key) == [0, 1, 2]


async def test_an_empty_conversation_left_by_a_crash_is_unparked_by_the_timer() -> None:
    d, processor, lot, changelog = dispatcher()
    processor.failing.add("alice")
    await d.consume(Stream([Event(intent(0), 0)]))
    assert await d.lanes.join(5)
    head = lot.head(intent(0).partition_key)
    assert head is not None
    # Replay all but the conversation's tombstone of its last pop into a new worker.
    await lot.pop(intent(0).partition_key, head.job_id)
    d2, processor2, lot2, _ = dispatcher()
    await lot2.table.recover(changelog.sent[:-1], {PARTITION})
    assert lot2.get(intent(0).partition_key) is not None and lot2.waiting("shop") == 0
    await d2.fire_due_retries()
    assert await d2.lanes.join(5)
    assert lot2.get(intent(0).partition_key) is None and processor2.attempts == []


async def test_nothing_is_retried_while_faust_recovers_tables() -> None:
    d, processor, lot, _ = dispatcher()
    processor.failing.add("alice")
    await d.consume(Stream([Event(intent(0), 0)]))
    assert await d.lanes.join(5)
    processor.failing.clear()
    d.app.in_recovery = True
    await d.fire_due_retries()
    assert await d.lanes.join(5)
    assert processor.sent == [] and lot.get(intent(0).partition_key) is not None
    d.app.in_recovery = False
    await d.fire_due_retries()
    assert await d.lanes.join(5)
    assert processor.sent == [0]


def _gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@pytest.mark.parametrize("failing", [False, True])
async def test_in_flight_gauge_counts_lane_work_and_reads_zero_when_idle(failing: bool) -> None:
    d, processor, lot, _ = dispatcher()
    if failing:
        processor.failing.add("c1")
    processor.gate = asyncio.Event()
    events = [Event(intent(n, f"c{n % 3}"), n) for n in range(7)]
    await d.consume(Stream(events))
    assert _gauge("zapstream_dispatch_in_flight", priority="operational") == 7
    processor.gate.set()
    assert await d.lanes.join(5)
    assert _gauge("zapstream_dispatch_in_flight", priority="operational") == 0
    assert _gauge("zapstream_parked_conversations") == (1 if failing else 0)
    await d.fire_due_retries()
    assert await d.lanes.join(5)
    assert _gauge("zapstream_dispatch_in_flight", priority="operational") == 0
