"""OutboxRelay under the failures it must survive: oversized records, refused records,
transient PostgreSQL and Kafka outages; and the permanent ones it must stop on.

Same fakes as ``test_relay_loop.py``; every assertion is on what was produced
and on the exact LSNs confirmed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import psycopg
import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError

from connectors.cdc.lsn import Lsn
from connectors.cdc.outbox_rows import TRUNCATION_MARKER
from connectors.cdc.replication_stream import ReplicationError, ReplicationStreamClosed
from streams.kernel.contract import INTENTS, INVALID
from streams.kernel.failures import StartRefused
from tests.unit.connectors.cdc.test_relay_loop import (
    COMMIT_TS,
    DEADLINE_S,
    OUTBOX,
    SLOT_CONFIRMED,
    FakeProducer,
    FakeSource,
    Harness,
    Txn,
    _xlog,
    encode_begin,
    encode_commit,
    encode_insert,
    relation_message,
    until,
)

BIG = 2 * 1024 * 1024


def _bad_row(job_id: int, payload: str) -> list[str | None]:
    return [str(job_id), "inst-1", f"key-{job_id}", payload, "operational", None]


def _good_row(job_id: int, text: str) -> list[str | None]:
    payload = {"type": "text", "to": "5511987654321", "text": text}
    return [
        str(job_id),
        "inst-1",
        f"key-{job_id}",
        orjson.dumps(payload).decode(),
        "operational",
        None,
    ]


def _txn_messages(number: int, rows: list[list[str | None]]) -> tuple[list[Any], Lsn]:
    commit_lsn = SLOT_CONFIRMED + 0x1000 * number
    end_lsn = commit_lsn + 0x30
    messages = [_xlog(encode_begin(commit_lsn, COMMIT_TS, 900 + number), commit_lsn)]
    messages += [_xlog(encode_insert(OUTBOX.oid, row), commit_lsn) for row in rows]
    messages.append(_xlog(encode_commit(commit_lsn, end_lsn, COMMIT_TS), end_lsn))
    return messages, end_lsn


async def _run_until_stop(h: Harness, predicate: Any, what: str) -> None:
    async with h.running() as task:
        await until(predicate, what)
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)


async def test_a_2mb_malformed_row_is_reduced_and_the_rows_after_it_flow() -> None:
    h = Harness()
    bad, end1 = _txn_messages(1, [_bad_row(100, "[" + "x" * BIG + "]")])
    good, end2 = _txn_messages(2, [_good_row(200 + i, f"hi {i}") for i in range(50)])
    h.source.push(relation_message(), *bad, *good)
    async with h.running() as task:
        await until(lambda: len(h.producer.sent) == 51, "51 sends")
        for sent in h.producer.sent:
            sent.future.set_result(None)
        await until(lambda: end2 in h.source.flushes, "both transactions confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    rejected = h.producer.sent[0]
    assert rejected.topic == INVALID
    assert len(rejected.value) <= h.relay.settings.max_record_bytes
    record = orjson.loads(rejected.value)
    assert record["job_id"] == 100
    assert record["lsn"] == str(SLOT_CONFIRMED + 0x1000)
    # Over max_record_bytes: rejected on its size, never parsed (size before parse).
    assert record["reason"] == (
        f"payload is {BIG + 2} bytes, over the relay's ZAPSTREAM_RELAY_MAX_RECORD_BYTES "
        f"({h.relay.settings.max_record_bytes}): rejected unparsed"
    )
    assert record["row"]["payload"].startswith("[xxxx")
    assert TRUNCATION_MARKER.format(size=BIG + 2) in record["row"]["payload"]
    assert [s.topic for s in h.producer.sent[1:]] == [INTENTS] * 50
    assert h.relay.stats.reduced == 1
    assert end1 < end2


async def test_an_oversized_intent_becomes_a_reduced_rejection() -> None:
    h = Harness(max_record_bytes=4096, rejected_value_max_bytes=256)
    # 1,000 characters pass the intent rules and 4-byte characters make the payload
    # 4,046 bytes, under the limit; with the record's other fields it is over it.
    txn, end = _txn_messages(1, [_good_row(100, "\U0001f600" * 1000)])
    h.source.push(relation_message(), *txn)
    async with h.running() as task:
        await until(lambda: len(h.producer.sent) == 1, "one send")
        h.producer.sent[0].future.set_result(None)
        await until(lambda: h.source.flushes == [end], "confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    sent = h.producer.sent[0]
    assert sent.topic == INVALID and len(sent.value) <= 4096
    data = orjson.loads(sent.value)
    assert data["job_id"] == 100 and "record too large" in data["reason"]
    assert data["lsn"] == str(SLOT_CONFIRMED + 0x1000)


class RefusingProducer(FakeProducer):
    """Raises MessageSizeTooLargeError from send() for records over ``limit`` bytes."""

    limit = 1000

    async def send(
        self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None
    ) -> Any:
        if len(value) > self.limit:
            raise MessageSizeTooLargeError(f"{len(value)} bytes")
        return await super().send(topic, value, key, headers)


async def test_a_record_kafka_refuses_at_send_becomes_a_minimal_rejection() -> None:
    h = Harness(producer=RefusingProducer)
    t1 = Txn(1)
    big, end = _txn_messages(2, [_good_row(200, "a" * 3000)])
    h.source.push(relation_message(), *t1.messages(), *big)
    async with h.running() as task:
        await until(lambda: len(h.producer.sent) == 2, "two sends")
        for sent in h.producer.sent:
            sent.future.set_result(None)
        await until(lambda: end in h.source.flushes, "refused record's transaction confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    minimal = orjson.loads(h.producer.sent[1].value)
    assert h.producer.sent[1].topic == INVALID
    assert minimal["job_id"] == 200 and "record too large" in minimal["reason"]
    assert minimal["lsn"] == str(SLOT_CONFIRMED + 0x2000)
    assert minimal["row"] == {"id": "200"}


async def test_a_record_kafka_refuses_in_its_ack_is_replaced_and_then_confirmed() -> None:
    h = Harness()
    t1, t2 = Txn(1), Txn(2)
    h.source.push(relation_message(), *t1.messages(), *t2.messages())
    async with h.running() as task:
        await until(lambda: len(h.producer.sent) == 2, "two sends")
        h.producer.of(t1.job_ids[0]).set_exception(MessageSizeTooLargeError("broker limit"))
        h.producer.ack(*t2.job_ids)
        await until(lambda: len(h.producer.sent) == 3, "the replacement")
        # t2's ack is in; the loop goes round several status intervals (each ends in a
        # report of the confirmed position) and still confirms nothing.
        reads = h.source.reads
        await until(lambda: h.source.reads >= reads + 5, "several status intervals")
        assert h.source.flushes == []  # t1 waits for its replacement
        h.producer.sent[2].future.set_result(None)
        await until(lambda: t2.end_lsn in h.source.flushes, "both confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    replacement = h.producer.sent[2]
    assert replacement.topic == INVALID and replacement.job_id == t1.job_ids[0]
    assert "record too large" in orjson.loads(replacement.value)["reason"]


async def test_a_transient_kafka_failure_resumes_from_the_slot_without_exiting() -> None:
    h = Harness(sources=2, reconnect_initial_s=0.01, reconnect_max_s=0.02)
    first, second = h.sources
    t1, t2 = Txn(1), Txn(2)
    async with h.running() as task:
        first.push(relation_message(), *t1.messages(), *t2.messages())
        await until(lambda: len(h.producer.sent) == 2, "two sends")
        h.producer.ack(*t1.job_ids)
        await until(lambda: first.flushes == [t1.end_lsn], "t1 confirmed")
        h.producer.of(t2.job_ids[0]).set_exception(KafkaTimeoutError("batch expired"))
        second.push(relation_message(), *t2.messages())
        await until(lambda: len(h.producer.sent) == 3, "t2 produced again")
        h.producer.ack(*t2.job_ids)
        await until(lambda: second.flushes == [t2.end_lsn], "t2 confirmed")
        assert not task.done()
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert first.flushes == [t1.end_lsn] and first.closed


class FailingStartSource(FakeSource):
    def __init__(self, events: list[Any], error: Exception) -> None:
        super().__init__(events)
        self.error = error

    async def start(self, start_lsn: Lsn) -> None:
        raise self.error


async def test_postgres_away_at_connect_is_retried_until_it_is_back() -> None:
    h = Harness(sources=3, reconnect_initial_s=0.01, reconnect_max_s=0.02)
    refused = ReplicationStreamClosed("could not connect: Connection refused")
    h.sources[0] = FailingStartSource(h.events, refused)
    h.sources[1] = FailingStartSource(
        h.events, ReplicationError("the database system is shutting down", sqlstate="57P03")
    )
    t1 = Txn(1)
    h.sources[2].push(relation_message(), *t1.messages())
    await _run_until_stop(h, lambda: len(h.producer.sent) == 1, "t1 sent after two failures")
    assert h.sources[2].flushes == [t1.end_lsn]


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        (
            ReplicationStreamClosed('could not connect: FATAL:  database "nope" does not exist'),
            "ZAPSTREAM_DATABASE_URL",
        ),
        (
            ReplicationStreamClosed(
                'could not connect: FATAL:  password authentication failed for user "x"'
            ),
            "ZAPSTREAM_DATABASE_URL",
        ),
        (
            ReplicationError("must be superuser or replication role", sqlstate="42501"),
            "REPLICATION",
        ),
    ],
)
async def test_a_permanent_postgres_failure_stops_with_a_config_error(
    error: Exception, hint: str
) -> None:
    h = Harness()
    h.sources[0] = FailingStartSource(h.events, error)
    async with h.running() as task:
        with pytest.raises(StartRefused, match=hint):
            await asyncio.wait_for(task, DEADLINE_S)


async def test_provisioning_is_retried_while_postgres_is_away() -> None:
    calls = 0

    async def provision() -> Lsn:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise psycopg.OperationalError("connection failed: Connection refused")
        return SLOT_CONFIRMED

    h = Harness(reconnect_initial_s=0.01, reconnect_max_s=0.02, provision=provision)
    t1 = Txn(1)
    h.source.push(relation_message(), *t1.messages())
    await _run_until_stop(h, lambda: len(h.producer.sent) == 1, "t1 sent")
    assert calls == 3


class UnreachableKafka(FakeProducer):
    def __init__(self, events: list[Any], failures: int) -> None:
        super().__init__(events)
        self.failures = failures

    async def start(self) -> None:
        if self.failures:
            self.failures -= 1
            raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9)]")
        await super().start()


async def test_kafka_away_at_start_is_retried() -> None:
    h = Harness(
        reconnect_initial_s=0.01,
        reconnect_max_s=0.02,
        producer=lambda events: UnreachableKafka(events, failures=3),
    )
    assert isinstance(h.producer, UnreachableKafka)
    await h.relay.start()
    assert h.producer.started
    await h.relay.stop()
