"""OutboxRelay's batched produce path (aiokafka's ``create_batch``/``send_batch``).

The relay appends records to one batch per topic partition and Kafka answers
for a whole batch. The guarantees stay the per-record ones: keys land where
aiokafka's murmur2 partitioner puts them, WAL order is kept per partition,
a transaction is confirmed only once every record of it (in whatever batches)
is acknowledged, contiguously, and a failed batch confirms nothing past it.
Same fakes as ``test_relay_loop.py`` plus a batch-capable producer.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest
from aiokafka.errors import MessageSizeTooLargeError, TopicAuthorizationFailedError
from aiokafka.partitioner import DefaultPartitioner

from connectors.cdc.lsn import Lsn
from connectors.cdc.pgoutput import Column
from connectors.cdc.relay import KeyHashPartitioner, RelayError
from streams.kernel.contract import (
    BULK_INTENTS,
    HEADER_JOB_ID,
    HEADER_LSN,
    HEADER_SCHEMA,
    INTENTS,
    INVALID,
    IntentCaptured,
    IntentRejected,
    conversation_partition_key,
)
from tests.unit.connectors.cdc.test_relay_loop import (
    COMMIT_TS,
    DEADLINE_S,
    OUTBOX,
    SLOT_CONFIRMED,
    Event,
    FakeProducer,
    Harness,
    _xlog,
    encode_begin,
    encode_commit,
    encode_insert,
    encode_relation,
    keepalive,
    relation_message,
    settle,
    until,
)

PARTITIONS = list(range(4))


def partition_of(key: bytes) -> int:
    return int(DefaultPartitioner()(key, PARTITIONS, PARTITIONS))


def phone(conversation: int) -> str:
    return f"55119{conversation:08d}"


def conversations_on_distinct_partitions(count: int) -> list[int]:
    """Conversation numbers whose keys hash to ``count`` different partitions."""
    found: dict[int, int] = {}
    for conversation in range(1000):
        partition = partition_of(conversation_partition_key("inst-1", phone(conversation)))
        found.setdefault(partition, conversation)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("not enough partitions reachable")


def row(job_id: int, conversation: int, priority: str = "operational") -> list[str | None]:
    payload = {"type": "text", "to": phone(conversation), "text": f"hi {job_id}"}
    return [
        str(job_id),
        "inst-1",
        f"key-{job_id}",
        orjson.dumps(payload).decode(),
        priority,
        "2026-11-29 16:01:59.5+00",
    ]


@dataclasses.dataclass
class Txn:
    number: int
    rows: list[tuple[int, int]]
    """(job id, conversation) per insert."""
    bulk: frozenset[int] = frozenset()
    """Job ids inserted with priority ``bulk``."""

    @property
    def commit_lsn(self) -> Lsn:
        return SLOT_CONFIRMED + 0x1000 * self.number

    @property
    def end_lsn(self) -> Lsn:
        return self.commit_lsn + 0x30

    def messages(self) -> list[Any]:
        out = [_xlog(encode_begin(self.commit_lsn, COMMIT_TS, 700 + self.number), self.commit_lsn)]
        out += [
            _xlog(
                encode_insert(
                    OUTBOX.oid, row(job, conv, "bulk" if job in self.bulk else "operational")
                ),
                self.commit_lsn,
            )
            for job, conv in self.rows
        ]
        out.append(_xlog(encode_commit(self.commit_lsn, self.end_lsn, COMMIT_TS), self.end_lsn))
        return out


class FakeBatch:
    """Like aiokafka's BatchBuilder: append returns None once full or closed."""

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self.records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []
        self.closed = False

    def append(
        self, *, timestamp: float | None, key: bytes, value: bytes, headers: list[tuple[str, bytes]]
    ) -> object | None:
        if self.closed or len(self.records) >= self.max_records:
            return None
        self.records.append((key, value, list(headers)))
        return object()

    def close(self) -> None:
        self.closed = True

    @property
    def job_ids(self) -> list[int]:
        return [int(dict(headers)[HEADER_JOB_ID]) for _, _, headers in self.records]


@dataclasses.dataclass
class SentBatch:
    topic: str
    partition: int
    batch: FakeBatch
    future: asyncio.Future[None]


class FakeBatchProducer(FakeProducer):
    """A FakeProducer that also takes batches; the test answers each batch's future."""

    def __init__(self, events: list[Event], *, max_records: int = 100) -> None:
        super().__init__(events)
        self.max_records = max_records
        self.batches: list[SentBatch] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return set(PARTITIONS)

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.max_records)

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> Any:
        assert batch.closed, "a batch is closed before it is handed over"
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.batches.append(SentBatch(topic, partition, batch, future))
        return future

    async def flush(self) -> None:
        await super().flush()
        for sent in self.batches:
            if not sent.future.done() and not set(sent.batch.job_ids) & self.held:
                sent.future.set_result(None)
        pending = [s.future for s in self.batches if not s.future.done()]
        if pending:
            await asyncio.wait(pending)

    def batch_of(self, job_id: int) -> SentBatch:
        (sent,) = [s for s in self.batches if job_id in s.batch.job_ids]
        return sent

    @property
    def batched_job_ids(self) -> list[int]:
        return [job for s in self.batches for job in s.batch.job_ids]


def batch_harness(**settings: Any) -> tuple[Harness, FakeBatchProducer]:
    max_records = settings.pop("max_records", 100)
    h = Harness(
        producer=lambda events: FakeBatchProducer(events, max_records=max_records), **settings
    )
    assert isinstance(h.producer, FakeBatchProducer)
    return h, h.producer


def test_key_hash_partitioner_is_aiokafkas_default_partitioner() -> None:
    partitioner = KeyHashPartitioner(max_keys=50)
    for partitions in ([0], [0, 1, 2], list(range(8)), list(range(1000))):
        for i in range(300):  # past max_keys: the cache starts over and stays right
            key = conversation_partition_key(f"inst-{i % 7}", phone(i))
            expected = DefaultPartitioner()(key, partitions, partitions)
            assert partitioner(key, partitions, partitions) == expected
            assert partitioner(key, partitions, partitions) == expected  # cached


async def test_records_go_in_partition_batches_keyed_like_aiokafka_in_wal_order() -> None:
    h, producer = batch_harness()
    t1 = Txn(1, [(100 + i, i % 6) for i in range(12)])
    t2 = Txn(2, [(200 + i, i % 6) for i in range(6)])
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages(), *t2.messages())
        await until(lambda: len(producer.batched_job_ids) == 18, "every record batched")
        for sent in producer.batches:
            sent.future.set_result(None)
        await until(lambda: t2.end_lsn in h.source.flushes, "both confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert producer.sent == []  # nothing went alone
    job_order = [job for job, _ in t1.rows + t2.rows]
    for sent in producer.batches:
        assert sent.topic == INTENTS
        for key, value, headers in sent.batch.records:
            intent = IntentCaptured.loads(value)
            assert key == conversation_partition_key(intent.instance_id, intent.conversation_key)
            assert sent.partition == partition_of(key)
            assert dict(headers)[HEADER_SCHEMA] == IntentCaptured.SCHEMA.encode()
            assert dict(headers)[HEADER_LSN] == intent.lsn.encode()
    for partition in PARTITIONS:
        jobs = [j for s in producer.batches if s.partition == partition for j in s.batch.job_ids]
        assert jobs == [j for j in job_order if j in jobs], "WAL order within a partition"
    assert sorted(producer.batched_job_ids) == sorted(job_order)
    assert h.source.flushes[-1] == t2.end_lsn


async def test_a_later_batch_acknowledged_first_confirms_nothing_until_the_earlier_one() -> None:
    h, producer = batch_harness()
    a, b = conversations_on_distinct_partitions(2)
    t1 = Txn(1, [(101, a), (102, a)])
    t2 = Txn(2, [(201, b)])
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages(), *t2.messages())
        await until(lambda: len(producer.batched_job_ids) == 3, "every record batched")
        producer.batch_of(201).future.set_result(None)
        reads = h.source.reads
        await until(lambda: h.source.reads >= reads + 3, "several status intervals")
        assert h.source.flushes == []
        producer.batch_of(101).future.set_result(None)
        await until(lambda: h.source.flushes == [t2.end_lsn], "both confirmed at once")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert producer.batch_of(101) is producer.batch_of(102)
    assert h.relay.confirmed == t2.end_lsn


async def test_a_transaction_split_over_batches_waits_for_all_of_them() -> None:
    h, producer = batch_harness(max_records=2)
    a = conversations_on_distinct_partitions(1)[0]
    t1 = Txn(1, [(100 + i, a) for i in range(5)])
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(producer.batched_job_ids) == 5, "every record batched")
        assert [s.batch.job_ids for s in producer.batches] == [[100, 101], [102, 103], [104]]
        for sent in producer.batches[:2]:
            sent.future.set_result(None)
        await settle()
        assert h.source.flushes == []
        producer.batches[2].future.set_result(None)
        await until(lambda: h.source.flushes == [t1.end_lsn], "confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)


async def test_a_failed_batch_stops_without_confirming_past_it() -> None:
    h, producer = batch_harness()
    a, b = conversations_on_distinct_partitions(2)
    t1, t2, t3 = Txn(1, [(101, a)]), Txn(2, [(201, b)]), Txn(3, [(301, a)])
    error = TopicAuthorizationFailedError("not allowed")
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(producer.batches) == 1, "t1's batch")
        producer.batch_of(101).future.set_result(None)
        await until(lambda: h.source.flushes == [t1.end_lsn], "t1 confirmed")
        h.source.push(*t2.messages(), *t3.messages())
        await until(lambda: len(producer.batched_job_ids) == 3, "t2 and t3 batched")
        producer.batch_of(201).future.set_exception(error)
        producer.batch_of(301).future.set_result(None)
        with pytest.raises(RelayError) as raised:
            await asyncio.wait_for(task, DEADLINE_S)
    assert raised.value.__cause__ is error
    assert h.source.flushes == [t1.end_lsn]


async def test_backpressure_sends_open_batches_before_waiting_for_room() -> None:
    h, producer = batch_harness(max_in_flight=2)
    a = conversations_on_distinct_partitions(1)[0]
    t1 = Txn(1, [(100 + i, a) for i in range(5)])
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(producer.batches) == 1, "the first batch, sent to make room")
        assert producer.batches[0].batch.job_ids == [100, 101]
        while len(producer.batched_job_ids) < 5 or not all(
            s.future.done() for s in producer.batches
        ):
            for sent in producer.batches:
                if not sent.future.done():
                    sent.future.set_result(None)
            await asyncio.sleep(0.001)
        await until(lambda: h.source.flushes == [t1.end_lsn], "confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert producer.batched_job_ids == [100, 101, 102, 103, 104]
    assert all(len(s.batch.records) <= 2 for s in producer.batches)


async def test_a_record_no_batch_can_hold_is_produced_alone_after_its_partition() -> None:
    h, producer = batch_harness(max_records=0)
    t1 = Txn(1, [(101, 1), (102, 2)])
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(producer.sent) == 2, "two single sends")
        producer.ack(101, 102)
        await until(lambda: h.source.flushes == [t1.end_lsn], "confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert producer.batches == []


async def test_a_batch_kafka_refuses_is_sent_record_by_record_and_confirmed() -> None:
    """A refused batch says nothing about its records: each goes again on its own."""
    h, producer = batch_harness()
    a = conversations_on_distinct_partitions(1)[0]
    t1 = Txn(1, [(101, a), (102, a)])
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(producer.batches) == 1, "the batch")
        producer.batches[0].future.set_exception(MessageSizeTooLargeError("broker limit"))
        await until(lambda: len(producer.sent) == 2, "the records, one by one")
        await settle()
        assert h.source.flushes == []  # the transaction waits for them
        producer.ack(101, 102)
        await until(lambda: h.source.flushes == [t1.end_lsn], "confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert [s.topic for s in producer.sent] == [INTENTS, INTENTS]
    assert [s.job_id for s in producer.sent] == [101, 102]


async def test_a_record_refused_on_its_own_too_is_replaced_then_confirmed() -> None:
    h, producer = batch_harness()
    a = conversations_on_distinct_partitions(1)[0]
    t1 = Txn(1, [(101, a), (102, a)])
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: len(producer.batches) == 1, "the batch")
        producer.batches[0].future.set_exception(MessageSizeTooLargeError("broker limit"))
        await until(lambda: len(producer.sent) == 2, "the records, one by one")
        producer.of(102).set_exception(MessageSizeTooLargeError("broker limit"))
        producer.ack(101)
        await until(lambda: len(producer.sent) == 3, "the replacement of 102")
        await settle()
        assert h.source.flushes == []  # 102's replacement is not acknowledged yet
        producer.sent[2].future.set_result(None)
        await until(lambda: h.source.flushes == [t1.end_lsn], "confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert [s.topic for s in producer.sent] == [INTENTS, INTENTS, INVALID]
    assert "record too large" in orjson.loads(producer.sent[2].value)["reason"]


async def test_drain_sends_open_batches_and_confirms_them() -> None:
    h, producer = batch_harness()
    t1 = Txn(1, [(101, 1), (102, 2), (103, 3)])
    async with h.running() as task:
        # The stop comes while the rows wait in open batches (lingering for more WAL).
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: h.source.inbox.empty(), "every message read")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert sorted(producer.batched_job_ids) == [101, 102, 103]
    assert all(s.future.done() for s in producer.batches)
    assert h.source.flushes == [t1.end_lsn]


WIDE = dataclasses.replace(
    OUTBOX,
    columns=(
        *OUTBOX.columns,
        Column(flags=0, name="status", type_oid=25, type_modifier=-1),
        Column(flags=0, name="last_error", type_oid=25, type_modifier=-1),
    ),
)
"""outbox_jobs with columns no intent is made of (the real table has 18)."""


@pytest.mark.parametrize("batching", [True, False])
async def test_a_rejected_row_carries_every_column_though_intents_decode_only_theirs(
    batching: bool,
) -> None:
    h, producer = batch_harness() if batching else (Harness(), None)
    t1 = Txn(1, [])
    good = [*row(101, 1), "PENDING", "boom"]
    bad = [*row(102, 1), "PENDING", None]
    bad[3] = "[1, 2]"  # payload not an object
    messages = [
        _xlog(encode_relation(WIDE), SLOT_CONFIRMED),
        *t1.messages()[:1],
        _xlog(encode_insert(WIDE.oid, good), t1.commit_lsn),
        _xlog(encode_insert(WIDE.oid, bad), t1.commit_lsn),
        *t1.messages()[1:],
    ]
    async with h.running() as task:
        h.source.push(*messages)
        await until(lambda: h.relay.stats.rejected == 1 and h.relay.stats.intents == 1, "rows")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    if producer is not None:
        values = [value for s in producer.batches for _, value, _ in s.batch.records]
    else:
        values = [s.value for s in h.producer.sent]
    by_schema = {orjson.loads(value)["schema"]: value for value in values}
    assert len(values) == len(by_schema) == 2
    intent = IntentCaptured.loads(by_schema[IntentCaptured.SCHEMA])
    rejected = IntentRejected.loads(by_schema[IntentRejected.SCHEMA])
    assert intent.job_id == 101 and intent.text == "hi 101"
    assert rejected.job_id == 102 and "not an object" in rejected.reason
    names = [c.name for c in WIDE.columns]
    assert rejected.row == dict(zip(names, bad, strict=True))
    assert h.source.flushes[-1] == t1.end_lsn


async def test_trickling_wal_does_not_hold_a_batch_back() -> None:
    """The linger runs from the first moment the source ran dry, not from each message.

    Small transactions arriving every millisecond (here: keepalives) used to
    keep the batch waiting until the WAL paused: commit->ack p50 was 68 ms at
    500 rows/s. The batch must go after the linger (2 ms), long before the
    trickle ends.
    """
    h, producer = batch_harness()
    t1 = Txn(1, [(101, 1)])
    trickled = 0
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        while not producer.batches and trickled < 200:
            h.source.push(keepalive(t1.commit_lsn, reply_requested=False))
            trickled += 1
            await asyncio.sleep(0.001)  # the trickle's pace, not a wait for a result
        assert producer.batches, "the batch waited for the WAL to pause"
        assert producer.batches[0].batch.job_ids == [101]
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert trickled < 200


async def test_bulk_intents_go_to_their_own_topic_on_the_same_partition() -> None:
    h, producer = batch_harness()
    bulk = frozenset(100 + i for i in range(12) if i % 2)
    txn = Txn(1, [(100 + i, i % 6) for i in range(12)], bulk)
    async with h.running() as task:
        h.source.push(relation_message(), *txn.messages())
        await until(lambda: len(producer.batched_job_ids) == 12, "every record batched")
        for sent in producer.batches:
            sent.future.set_result(None)
        await until(lambda: txn.end_lsn in h.source.flushes, "confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    for sent in producer.batches:
        for key, value, _ in sent.batch.records:
            intent = IntentCaptured.loads(value)
            assert sent.topic == (BULK_INTENTS if intent.job_id in bulk else INTENTS)
            assert intent.priority == ("bulk" if intent.job_id in bulk else "operational")
            assert sent.partition == partition_of(key)  # co-partitioned with INTENTS
    assert {s.topic for s in producer.batches} == {INTENTS, BULK_INTENTS}
