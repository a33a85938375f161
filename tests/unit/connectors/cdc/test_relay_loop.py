"""OutboxRelay's loop against a fake replication source and a fake Kafka producer.

The source yields XLogData whose payloads are real pgoutput bytes (built by the
small encoder below, checked against captured payloads) and records every
confirmation the relay sends; the producer's send futures are resolved,
failed or cancelled by the test. Every assertion is on the exact LSNs confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from connectors.cdc.lsn import Lsn
from connectors.cdc.pgoutput import Begin, Column, Commit, Insert, PgOutputDecoder, Relation
from connectors.cdc.primary import STANDBY_HINT, StandbyServer
from connectors.cdc.relay import OutboxRelay, RelayError
from connectors.cdc.replication_messages import PrimaryKeepalive, XLogData, to_pg_timestamp
from connectors.cdc.replication_stream import ReplicationStreamClosed, SlotInUse, SystemIdentity
from connectors.cdc.settings import RelaySettings
from connectors.cdc.slot_gap import GapOutcome
from streams.kernel.contract import HEADER_JOB_ID, HEADER_LSN, INTENTS, IntentCaptured
from tests.unit.connectors.cdc.data.pgoutput_capture import PAYLOADS

DEADLINE_S = 3.0
COMMIT_TS = datetime(2026, 11, 29, 16, 2, 0, 880564, tzinfo=UTC)
SLOT_CONFIRMED = Lsn.parse("0/1000000")
"""What the (fake) provisioning reports as the slot's confirmed position."""

# --- a small pgoutput encoder (layouts as documented in connectors/cdc/pgoutput.py) ------


def _cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


def encode_relation(relation: Relation) -> bytes:
    # 'R' | Int32 oid | String namespace | String name | Int8 replica identity
    #     | Int16 ncolumns | ncolumns x (Int8 flags | String name | Int32 type oid | Int32 typmod)
    out = bytearray(b"R" + struct.pack(">I", relation.oid))
    out += _cstring(relation.namespace) + _cstring(relation.name)
    out += struct.pack(">Bh", ord(relation.replica_identity), len(relation.columns))
    for column in relation.columns:
        out += struct.pack(">B", column.flags) + _cstring(column.name)
        out += struct.pack(">Ii", column.type_oid, column.type_modifier)
    return bytes(out)


def encode_begin(final_lsn: Lsn, commit_ts: datetime, xid: int) -> bytes:
    # 'B' | Int64 final_lsn | Int64 commit_ts | Int32 xid
    return struct.pack(">cQqI", b"B", final_lsn.value, to_pg_timestamp(commit_ts), xid)


def encode_insert(oid: int, values: Iterable[str | None]) -> bytes:
    # 'I' | Int32 oid | Byte1 'N' | TupleData (Int16 n, then 'n' or 't' Int32 len Byte[len])
    cells = list(values)
    out = bytearray(struct.pack(">cIch", b"I", oid, b"N", len(cells)))
    for value in cells:
        if value is None:
            out += b"n"
        else:
            data = value.encode()
            out += b"t" + struct.pack(">i", len(data)) + data
    return bytes(out)


def encode_commit(commit_lsn: Lsn, end_lsn: Lsn, commit_ts: datetime) -> bytes:
    # 'C' | Int8 flags | Int64 commit_lsn | Int64 end_lsn | Int64 commit_ts
    return struct.pack(
        ">cBQQq", b"C", 0, commit_lsn.value, end_lsn.value, to_pg_timestamp(commit_ts)
    )


def test_encoder_reproduces_captured_payloads() -> None:
    decoder = PgOutputDecoder()
    begin, _, relation, insert, commit = (decoder.decode(p) for p in PAYLOADS[:5])
    assert isinstance(begin, Begin) and isinstance(relation, Relation)
    assert isinstance(insert, Insert) and isinstance(commit, Commit)
    assert encode_begin(begin.final_lsn, begin.commit_ts, begin.xid) == PAYLOADS[0]
    assert encode_relation(relation) == PAYLOADS[2]
    values = [insert.new[c.name] for c in relation.columns]
    assert encode_insert(relation.oid, values) == PAYLOADS[3]
    assert encode_commit(commit.commit_lsn, commit.end_lsn, commit.commit_ts) == PAYLOADS[4]


# --- scripted WAL ---------------------------------------------------------------------


def _outbox_relation() -> Relation:
    names_types = [
        ("id", 20),
        ("instance_id", 25),
        ("idempotency_key", 25),
        ("payload", 3802),
        ("priority", 25),
        ("created_at", 1184),
    ]
    return Relation(
        oid=16390,
        namespace="public",
        name="outbox_jobs",
        replica_identity="d",
        columns=tuple(
            Column(flags=1 if name == "id" else 0, name=name, type_oid=oid, type_modifier=-1)
            for name, oid in names_types
        ),
    )


OUTBOX = _outbox_relation()


def _xlog(payload: bytes, at: Lsn) -> XLogData:
    return XLogData.of(at, at, COMMIT_TS, payload)


def keepalive(wal_end: Lsn, *, reply_requested: bool = True) -> PrimaryKeepalive:
    return PrimaryKeepalive(wal_end=wal_end, send_time=COMMIT_TS, reply_requested=reply_requested)


def relation_message() -> XLogData:
    return _xlog(encode_relation(OUTBOX), SLOT_CONFIRMED)


@dataclasses.dataclass(frozen=True)
class Txn:
    """One scripted outbox transaction: ``rows`` inserts between Begin and Commit."""

    number: int
    rows: int = 1

    @property
    def commit_lsn(self) -> Lsn:
        return SLOT_CONFIRMED + 0x1000 * self.number

    @property
    def end_lsn(self) -> Lsn:
        return self.commit_lsn + 0x30

    @property
    def job_ids(self) -> list[int]:
        return [self.number * 100 + i for i in range(self.rows)]

    def begin(self) -> list[XLogData]:
        return [_xlog(encode_begin(self.commit_lsn, COMMIT_TS, 700 + self.number), self.commit_lsn)]

    def inserts(self) -> list[XLogData]:
        return [
            _xlog(encode_insert(OUTBOX.oid, _row(job)), self.commit_lsn) for job in self.job_ids
        ]

    def commit(self) -> list[XLogData]:
        payload = encode_commit(self.commit_lsn, self.end_lsn, COMMIT_TS)
        return [_xlog(payload, self.end_lsn)]

    def messages(self) -> list[XLogData]:
        return self.begin() + self.inserts() + self.commit()


def _row(job_id: int) -> list[str | None]:
    payload = {"type": "text", "to": "5511987654321", "text": f"hi {job_id}"}
    return [
        str(job_id),
        "inst-1",
        f"key-{job_id}",
        orjson.dumps(payload).decode(),
        "operational",
        "2026-11-29 16:01:59.5+00",
    ]


# --- fakes -----------------------------------------------------------------------------

Event = tuple[str, Any]


class FakeSource:
    """A ReplicationSource fed by the test; records every confirmation."""

    def __init__(self, events: list[Event], *, slot_in_use: bool = False) -> None:
        self.events = events
        self.inbox: asyncio.Queue[XLogData | PrimaryKeepalive | Exception] = asyncio.Queue()
        self.flushes: list[Lsn] = []
        self.started_from: Lsn | None = None
        self.slot_in_use = slot_in_use
        self.reads = 0
        self.closed = False
        self.identity: SystemIdentity | None = None
        """What IDENTIFY_SYSTEM answered (a test sets it; None: not asked)."""

    def push(self, *messages: XLogData | PrimaryKeepalive | Exception) -> None:
        for message in messages:
            self.inbox.put_nowait(message)

    async def start(self, start_lsn: Lsn) -> None:
        if self.slot_in_use:
            raise SlotInUse("replication slot is active for another PID")
        self.started_from = start_lsn

    async def read(self, timeout_s: float) -> XLogData | PrimaryKeepalive | None:
        self.reads += 1
        try:
            async with asyncio.timeout(timeout_s):
                item = await self.inbox.get()
        except TimeoutError:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    def read_nowait(self) -> XLogData | PrimaryKeepalive | None:
        self.reads += 1
        try:
            item = self.inbox.get_nowait()
        except asyncio.QueueEmpty:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    async def send_status(self, *, flush: Lsn, reply_requested: bool = False) -> None:
        # Like ReplicationStream: confirming less than before is a bug.
        if self.flushes and flush < self.flushes[-1]:
            raise ValueError(f"confirmed LSN going backwards: {flush} after {self.flushes[-1]}")
        self.flushes.append(flush)
        self.events.append(("status", flush))

    async def close(self) -> None:
        self.closed = True


@dataclasses.dataclass
class Sent:
    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    future: asyncio.Future[None]

    @property
    def job_id(self) -> int:
        return int(dict(self.headers)[HEADER_JOB_ID])


class FakeProducer:
    """Kafka producer whose send futures the test resolves, fails or cancels.

    ``flush()`` acknowledges every pending send except the ``held`` ones (by job
    id), and like aiokafka's does not return before every send was answered.
    """

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.sent: list[Sent] = []
        self.held: set[int] = set()
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent.append(Sent(topic, value, key, list(headers or []), future))
        return future

    async def flush(self) -> None:
        self.events.append(("flush", sum(not s.future.done() for s in self.sent)))
        await asyncio.sleep(0)  # a real flush waits for the broker
        for sent in self.sent:
            if not sent.future.done() and sent.job_id not in self.held:
                sent.future.set_result(None)
        pending = [s.future for s in self.sent if not s.future.done()]
        if pending:
            await asyncio.wait(pending)

    def of(self, job_id: int) -> asyncio.Future[None]:
        (sent,) = [s for s in self.sent if s.job_id == job_id and not s.future.done()]
        return sent.future

    def ack(self, *job_ids: int) -> None:
        for job_id in job_ids:
            self.of(job_id).set_result(None)


class Harness:
    """One relay wired to fakes; ``sources`` are handed out one per connection attempt."""

    def __init__(
        self,
        *,
        sources: int = 1,
        clock: Callable[[], float] | None = None,
        producer: Callable[[list[Event]], FakeProducer] = FakeProducer,
        provision: Callable[[], Awaitable[Lsn]] | None = None,
        resolve_gap: Callable[[str | None], Awaitable[GapOutcome]] | None = None,
        **settings: Any,
    ) -> None:
        self.events: list[Event] = []
        self.producer = producer(self.events)
        self.sources = [FakeSource(self.events) for _ in range(sources)]
        self._handed_out = 0
        options: dict[str, Any] = {
            "status_interval_s": 0.01,
            "standby_retry_s": 0.01,
            "drain_timeout_s": DEADLINE_S,
        }
        options.update(settings)
        self.relay = OutboxRelay(
            RelaySettings(**options),
            self.producer,
            source_factory=self._next_source,
            provision=provision or self._provision,
            resolve_gap=resolve_gap,
            **({} if clock is None else {"clock": clock}),
        )

    @property
    def source(self) -> FakeSource:
        return self.sources[0]

    def _next_source(self) -> FakeSource:
        source = self.sources[self._handed_out]
        self._handed_out += 1
        return source

    async def _provision(self) -> Lsn:
        return SLOT_CONFIRMED

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[None]]:
        async with self.relay:
            task = asyncio.create_task(self.relay.run())
            try:
                yield task
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll with a deadline (never a fixed sleep)."""
    try:
        async with asyncio.timeout(DEADLINE_S):
            while True:
                if predicate():
                    return
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def settle() -> None:
    """Let every ready callback and task run (no wall-clock wait)."""
    for _ in range(20):
        await asyncio.sleep(0)


# --- tests -------------------------------------------------------------------------------


async def test_rows_become_intents_with_their_transaction_lsn() -> None:
    h = Harness()
    t1 = Txn(1, rows=2)
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(h.producer.sent) == 2, "two sends")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.source.started_from == Lsn(0)
    assert [s.topic for s in h.producer.sent] == [INTENTS, INTENTS]
    assert [s.job_id for s in h.producer.sent] == t1.job_ids
    for sent in h.producer.sent:
        assert dict(sent.headers)[HEADER_LSN] == str(t1.commit_lsn).encode()
        intent = IntentCaptured.loads(sent.value)
        assert intent.to == "5511987654321" and intent.lsn == str(t1.commit_lsn)
    assert h.source.flushes == [t1.end_lsn]
    assert h.source.closed and h.producer.stopped


async def test_drain_waits_for_flush_then_confirms_last_fully_acknowledged_transaction() -> None:
    h = Harness()
    t1, t2, t3, t4 = Txn(1), Txn(2, rows=2), Txn(3), Txn(4)
    async with h.running() as task:
        # t4 is still open (no Commit yet) when the stop comes.
        h.source.push(relation_message(), *t1.messages(), *t2.messages(), *t3.messages())
        h.source.push(*t4.begin(), *t4.inserts())
        await until(lambda: len(h.producer.sent) == 5, "five sends")
        # A later transaction acknowledged first confirms nothing while t1 is outstanding.
        h.producer.ack(*t2.job_ids, *t3.job_ids)
        reads = h.source.reads
        await until(lambda: h.source.reads >= reads + 5, "several status intervals")
        assert h.source.flushes == []
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert all(s.future.done() for s in h.producer.sent)
    # The confirmation comes after the flush, and only up to the last committed transaction.
    assert h.events == [("flush", 2), ("status", t3.end_lsn)]
    assert h.relay.confirmed == t3.end_lsn


async def test_acknowledged_burst_is_confirmed_once_the_source_goes_quiet() -> None:
    # Well before the status interval: the confirmation comes from the quiet source.
    h = Harness(status_interval_s=2.0)
    t1, t2 = Txn(1, rows=2), Txn(2)
    loop = asyncio.get_running_loop()
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages(), *t2.messages())
        await until(lambda: len(h.producer.sent) == 3, "three sends")
        started = loop.time()
        h.producer.ack(*t1.job_ids)
        await until(lambda: h.source.flushes == [t1.end_lsn], "t1 confirmed")
        h.producer.ack(*t2.job_ids)
        await until(lambda: h.source.flushes == [t1.end_lsn, t2.end_lsn], "t2 confirmed")
        assert loop.time() - started < 1.0
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.relay.confirmed == t2.end_lsn


async def test_drain_is_bounded_and_confirms_only_up_to_an_unacknowledged_record() -> None:
    h = Harness(drain_timeout_s=0.1)
    t1, t2, t3 = Txn(1), Txn(2), Txn(3)
    h.producer.held = set(t2.job_ids)
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages(), *t2.messages(), *t3.messages())
        await until(lambda: len(h.producer.sent) == 3, "three sends")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.source.flushes == [t1.end_lsn]
    assert not h.producer.of(t2.job_ids[0]).done()


async def test_kafka_nack_stops_without_confirming_past_the_failed_record() -> None:
    h = Harness()
    t1, t2, t3 = Txn(1), Txn(2), Txn(3)
    # Not transient (a transient one is waited out, see test_relay_faults.py).
    error = TopicAuthorizationFailedError("not allowed")
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages(), *t2.messages(), *t3.messages())
        await until(lambda: len(h.producer.sent) == 3, "three sends")
        h.producer.ack(*t1.job_ids)
        await until(lambda: h.source.flushes == [t1.end_lsn], "t1 confirmed")
        h.producer.of(t2.job_ids[0]).set_exception(error)
        h.producer.ack(*t3.job_ids)
        with pytest.raises(RelayError) as raised:
            await asyncio.wait_for(task, DEADLINE_S)
    assert raised.value.__cause__ is error
    assert h.source.flushes == [t1.end_lsn]
    assert h.relay.confirmed == t1.end_lsn
    assert h.source.closed


async def test_cancelled_send_stops_without_an_error_inside_the_callback() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        h = Harness()
        t1, t2, t3 = Txn(1), Txn(2), Txn(3)
        async with h.running() as task:
            h.source.push(relation_message(), *t1.messages(), *t2.messages(), *t3.messages())
            await until(lambda: len(h.producer.sent) == 3, "three sends")
            h.producer.ack(*t1.job_ids)
            await until(lambda: h.source.flushes == [t1.end_lsn], "t1 confirmed")
            h.producer.of(t2.job_ids[0]).cancel()
            h.producer.ack(*t3.job_ids)
            with pytest.raises(RelayError) as raised:
                await asyncio.wait_for(task, DEADLINE_S)
    finally:
        loop.set_exception_handler(previous)
    assert errors == []
    assert isinstance(raised.value.__cause__, RelayError)
    assert h.source.flushes == [t1.end_lsn]


async def _blocked_on_backpressure(h: Harness, t1: Txn, t2: Txn) -> None:
    """t1 sent and unacknowledged; t2's first insert waits for room (max_in_flight=1)."""
    script = [relation_message(), *t1.messages(), *t2.begin(), *t2.inserts()]
    h.source.push(*script)
    await until(lambda: h.source.inbox.empty() and h.source.reads == len(script), "all read")
    await settle()
    # Blocked: t2's row is not sent and the relay does not read on.
    assert [s.job_id for s in h.producer.sent] == t1.job_ids
    assert h.source.reads == len(script)


async def test_backpressure_wait_ends_on_request_stop() -> None:
    h = Harness(max_in_flight=1)
    t1, t2 = Txn(1), Txn(2)
    async with h.running() as task:
        await _blocked_on_backpressure(h, t1, t2)
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    # The drain acknowledged t1; t2 was never sent, so it is not confirmed.
    assert [s.job_id for s in h.producer.sent] == t1.job_ids
    assert h.source.flushes == [t1.end_lsn]


async def test_backpressure_wait_ends_on_failed_ack() -> None:
    h = Harness(max_in_flight=1)
    t1, t2 = Txn(1), Txn(2)
    async with h.running() as task:
        await _blocked_on_backpressure(h, t1, t2)
        h.producer.of(t1.job_ids[0]).set_exception(TopicAuthorizationFailedError("no"))
        with pytest.raises(RelayError):
            await asyncio.wait_for(task, DEADLINE_S)
    assert [s.job_id for s in h.producer.sent] == t1.job_ids
    assert h.source.flushes == []


async def test_keepalive_confirms_wal_end_only_with_nothing_outstanding() -> None:
    h = Harness()
    t1, t2 = Txn(1), Txn(2)
    quiet = t1.end_lsn + 0x100  # the server's WAL end while other tables change
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(h.producer.sent) == 1, "t1 sent")
        h.producer.ack(*t1.job_ids)
        await until(lambda: h.source.flushes == [t1.end_lsn], "t1 confirmed")

        h.source.push(keepalive(quiet))
        await until(lambda: len(h.source.flushes) == 2, "reply to keepalive")
        # An older wal_end never lowers the confirmation; the reply repeats it.
        h.source.push(keepalive(t1.end_lsn))
        await until(lambda: len(h.source.flushes) == 3, "reply to old keepalive")
        # With t2 in flight a keepalive past it confirms nothing new.
        h.source.push(*t2.begin(), *t2.inserts(), keepalive(t2.end_lsn + 0x1000))
        await until(lambda: len(h.source.flushes) == 4, "reply while t2 in flight")
        h.source.push(*t2.commit())
        h.producer.ack(*t2.job_ids)
        await until(lambda: len(h.source.flushes) == 5, "t2 confirmed")
        # Without reply_requested the next periodic status carries it.
        later = t2.end_lsn + 0x200
        h.source.push(keepalive(later, reply_requested=False))
        await until(lambda: len(h.source.flushes) == 6, "periodic status")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.source.flushes == [t1.end_lsn, quiet, quiet, quiet, t2.end_lsn, later, later]


async def test_reconnect_replays_without_moving_confirmation_backwards() -> None:
    h = Harness(sources=2)
    first, second = h.sources
    t1, t2, t3 = Txn(1), Txn(2), Txn(3)
    async with h.running() as task:
        first.push(relation_message(), *t1.messages(), *t2.messages())
        await until(lambda: len(h.producer.sent) == 2, "two sends")
        h.producer.ack(*t1.job_ids)
        await until(lambda: first.flushes == [t1.end_lsn], "t1 confirmed")
        # The connection drops with t2 produced but unconfirmed: the slot replays it.
        first.push(ReplicationStreamClosed("server closed the connection"))
        second.push(relation_message(), *t2.messages(), *t3.messages())
        await until(lambda: len(h.producer.sent) == 4, "t2 again and t3 sent")
        assert [s.job_id for s in h.producer.sent] == [*t1.job_ids, *t2.job_ids, *t2.job_ids, 300]
        reads = second.reads
        await until(lambda: second.reads >= reads + 3, "several status intervals")
        assert second.flushes == []
        h.producer.ack(*t2.job_ids, *t3.job_ids)
        await until(lambda: second.flushes == [t3.end_lsn], "t3 confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert first.closed and second.started_from == Lsn(0)
    assert first.flushes == [t1.end_lsn]
    assert second.flushes == [t3.end_lsn, t3.end_lsn]


async def test_standby_retries_while_the_slot_is_in_use() -> None:
    h = Harness(sources=3)
    h.sources[0].slot_in_use = h.sources[1].slot_in_use = True
    t1 = Txn(1)
    async with h.running() as task:
        h.sources[2].push(relation_message(), *t1.messages())
        await until(lambda: len(h.producer.sent) == 1, "t1 sent by the third attempt")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.sources[0].closed and h.sources[1].closed
    assert h.sources[2].flushes == [t1.end_lsn]


async def test_after_a_promotion_positions_of_the_old_timeline_are_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without synchronized_standby_slots the relay may have confirmed WAL the standby never
    got; the promoted standby's new transactions may then end below that position. They must
    be confirmed as they are acknowledged, not held behind the old timeline's position."""
    h = Harness(sources=2)
    first, second = h.sources
    first.identity = SystemIdentity("sys-1", 1, SLOT_CONFIRMED, "app")
    second.identity = SystemIdentity("sys-1", 2, SLOT_CONFIRMED, "app")
    t1, t5, t3 = Txn(1), Txn(5), Txn(3)  # t3: the new primary's, below t5's end
    async with h.running() as task:
        first.push(relation_message(), *t1.messages(), *t5.messages())
        await until(lambda: len(h.producer.sent) == 2, "two sends")
        h.producer.ack(*t1.job_ids, *t5.job_ids)
        await until(lambda: first.flushes == [t5.end_lsn], "t5 confirmed")
        first.push(ReplicationStreamClosed("server closed the connection"))
        second.push(relation_message(), *t3.messages())
        await until(lambda: len(h.producer.sent) == 3, "t3 sent")
        h.producer.ack(*t3.job_ids)
        await until(lambda: second.flushes == [t3.end_lsn], "t3 confirmed on timeline 2")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert "PostgreSQL was promoted (timeline 1 -> 2)" in caplog.text


async def test_a_standby_is_waited_out_with_one_line_naming_target_session_attrs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A DSN reaching a standby (a failover under way, no target_session_attrs) is transient:
    retried until a primary answers, logged once, never a refusal."""
    refusals = [3]

    async def provision() -> Lsn:
        if refusals[0]:
            refusals[0] -= 1
            raise StandbyServer(f"PostgreSQL at db2:5432 {STANDBY_HINT}")
        return SLOT_CONFIRMED

    h = Harness(provision=provision, reconnect_initial_s=0.001, reconnect_max_s=0.001)
    t1 = Txn(1)
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(h.producer.sent) == 1, "t1 sent once a primary answered")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    lines = [r.getMessage() for r in caplog.records if "is a standby" in r.getMessage()]
    assert len(lines) == 1 and "target_session_attrs=read-write" in lines[0], lines
    assert refusals == [0]


async def test_a_connection_dropped_again_just_after_a_recovery_is_the_same_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A promoted server (or an HA manager's checks) may drop the new connection again within
    seconds: the operator reads one outage, not a pair of lines per drop."""
    h = Harness(sources=3, reconnect_initial_s=0.001, reconnect_max_s=0.001)
    first, second, third = h.sources
    t1, t2 = Txn(1), Txn(2)
    first.push(relation_message(), *t1.messages(), ReplicationStreamClosed("server closed"))
    second.push(ReplicationStreamClosed("the server ended the replication stream"))
    third.push(relation_message(), *t2.messages())
    with caplog.at_level(logging.INFO, logger="connectors.cdc.relay"):
        async with h.running() as task:
            await until(lambda: len(h.producer.sent) == 2, "t1 and t2 sent")
            h.relay.request_stop()
            await asyncio.wait_for(task, DEADLINE_S)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("PostgreSQL unavailable" in m for m in messages) == 1, messages
    assert sum("PostgreSQL available again" in m for m in messages) == 1, messages
