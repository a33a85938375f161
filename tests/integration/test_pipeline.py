"""End to end on real processes: plain INSERTs, idempotency, malformed rows, write-back."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import orjson
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from connectors.outbox.enqueue import enqueue
from devtools.stack.delivery_audit import demo_key, demo_text
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import (
    IntentCaptured,
    IntentRejected,
    JobDead,
    conversation_partition_key,
)
from tests.integration.support import Arrivals, count_rows, wait_for_status, wait_until
from tests.integration.topic_reader import read_topic

pytestmark = pytest.mark.integration

ARTICLE_INSERT = (
    b"INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES ($1, $2, $3)"
)


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4) as p:
        p.start_relay()
        p.start_worker()
        yield p


def test_outbox_articles_plain_insert_is_sent_and_marked_accepted(pipeline: LocalPipeline) -> None:
    key = f"plain-{uuid.uuid4().hex}"
    text = f"order confirmed [{key}:0]"
    payload = orjson.dumps({"type": "text", "to": "+5511912345678", "text": text})
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        # The article's statement byte for byte, with server-side $n parameters.
        result = conn.pgconn.exec_params(ARTICLE_INSERT, [b"shop-1", payload, key.encode()])
        assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, result.error_message
    arrivals = Arrivals(pipeline)
    wait_until(
        lambda: any(m["text"] == text for m in arrivals.refresh()),
        60,
        "the plain INSERT at the gateway",
    )
    sent = [m for m in arrivals.items if m["text"] == text]
    assert len(sent) == 1
    assert sent[0]["to"] == "5511912345678" and sent[0]["instance"] == "shop-1"
    wait_for_status(pipeline.dsn, [key], "ACCEPTED", 30)
    with psycopg.connect(pipeline.dsn) as conn:
        row = conn.execute(
            "SELECT gateway_job_id, state_version, attempts, sent_at IS NOT NULL FROM outbox_jobs "
            "WHERE idempotency_key = %s",
            (key,),
        ).fetchone()
        events = conn.execute(
            "SELECT from_status, to_status, version, actor FROM outbox_job_events e "
            "JOIN outbox_jobs j ON j.id = e.job_id WHERE j.idempotency_key = %s ORDER BY version",
            (key,),
        ).fetchall()
    assert row == (sent[0]["id"], 2, 1, True)
    assert events == [
        ("PENDING", "ATTEMPTING", 1, "worker"),
        ("ATTEMPTING", "ACCEPTED", 2, "worker"),
    ]


def test_duplicate_idempotency_key_creates_no_second_row_and_no_second_send(
    pipeline: LocalPipeline,
) -> None:
    key = f"dup-{uuid.uuid4().hex}"
    text = f"your code is 1234 [{key}:0]"
    with psycopg.connect(pipeline.dsn) as conn:
        first = enqueue(
            conn, instance_id="shop-2", to="5511987650000", text=text, idempotency_key=key
        )
        conn.commit()
        second = enqueue(
            conn, instance_id="shop-2", to="5511987650000", text=text, idempotency_key=key
        )
        conn.commit()
    assert first == second
    wait_for_status(pipeline.dsn, [key], "ACCEPTED", 60)
    # A later message behind it in another transaction proves the pipeline moved past it.
    marker = f"marker-{uuid.uuid4().hex}"
    with psycopg.connect(pipeline.dsn) as conn:
        enqueue(
            conn,
            instance_id="shop-2",
            to="5511987650000",
            text=f"m [{marker}:1]",
            idempotency_key=marker,
        )
    wait_for_status(pipeline.dsn, [marker], "ACCEPTED", 60)
    arrivals = Arrivals(pipeline).refresh()
    assert sum(1 for m in arrivals if m["text"] == text) == 1
    assert (
        count_rows(
            pipeline.dsn, "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = %s", (key,)
        )
        == 1
    )


async def _read_invalid(bootstrap: str, topic: str, expected: int) -> list[IntentRejected]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        found: list[IntentRejected] = []
        deadline = asyncio.get_running_loop().time() + 60
        while len(found) < expected and asyncio.get_running_loop().time() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            found.extend(IntentRejected.loads(r.value) for rs in batch.values() for r in rs)
        return found
    finally:
        await consumer.stop()


def test_malformed_rows_land_in_invalid_and_rows_after_them_are_delivered(
    pipeline: LocalPipeline,
) -> None:
    run = uuid.uuid4().hex
    bad = {
        f"{run}-array": "[1, 2, 3]",
        f"{run}-type": '{"type": "sticker", "to": "5511900000001", "text": "x"}',
        f"{run}-noto": '{"type": "text", "text": "nobody"}',
    }
    good = [f"{run}-good-{i}" for i in range(3)]
    insert = "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES (%s, %s, %s)"
    with psycopg.connect(pipeline.dsn) as conn:
        with conn.transaction():
            conn.execute(insert, ("shop-3", bad[f"{run}-array"], f"{run}-array"))
            conn.execute(insert, ("shop-3", _text_payload(good[0]), good[0]))
        with conn.transaction():
            conn.execute(insert, ("shop-3", bad[f"{run}-type"], f"{run}-type"))
            conn.execute(insert, ("shop-3", bad[f"{run}-noto"], f"{run}-noto"))
        for key in good[1:]:
            conn.execute(insert, ("shop-3", _text_payload(key), key))
            conn.commit()
    wait_for_status(pipeline.dsn, good, "ACCEPTED", 60)
    found = asyncio.run(_read_invalid(pipeline.kafka.bootstrap, pipeline.topics.invalid, 3))
    rejected = {r.row["idempotency_key"]: r for r in found}
    assert set(bad) <= set(rejected)
    assert "not an object" in rejected[f"{run}-array"].reason
    assert "unknown message type 'sticker'" in rejected[f"{run}-type"].reason
    assert "recipient is missing" in rejected[f"{run}-noto"].reason
    assert rejected[f"{run}-type"].job_id is not None
    assert rejected[f"{run}-array"].row["payload"] == "[1, 2, 3]"


def _text_payload(key: str) -> str:
    return orjson.dumps(
        {"type": "text", "to": "+55 11 95555-0000", "text": f"ok [{key}:0]"}
    ).decode()


def test_sending_goes_on_while_the_state_sink_is_down(pipeline: LocalPipeline) -> None:
    """The sink is its own process: stopping it stops write-back, never sending."""
    sink = pipeline.sink
    assert sink is not None and sink.is_running
    assert sink.pid not in {p.pid for p in pipeline.processes if p.name == "worker"}
    since = sink.log_offset()
    assert sink.terminate(timeout_s=30) == 0, sink.log_tail()
    assert sink.wait_for_log(
        r"zapstream state sink stopped after [\d.]+s: \d+ states applied", since=since, timeout_s=1
    )

    run = uuid.uuid4().hex[:8]
    keys = [demo_key(f"nosink-{run}", "shop-4", 0, seq) for seq in range(20)]
    with psycopg.connect(pipeline.dsn) as conn:
        for key in keys:
            enqueue(
                conn,
                instance_id="shop-4",
                to="+5511955550000",
                text=demo_text(key),
                idempotency_key=key,
            )
        conn.commit()
    report = Arrivals(pipeline).wait_for(keys, timeout_s=60)
    assert not report.duplicates and not report.order_violations
    pending = "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = ANY(%s) AND status = %s"
    assert count_rows(pipeline.dsn, pending, (keys, "PENDING")) == len(keys)

    pipeline.start_sink()
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 60)


def test_no_process_logged_a_full_phone_number_or_message_text(pipeline: LocalPipeline) -> None:
    """Runs last in this module: scans every log the relay, worker, sink and simulator wrote."""
    logs = {p.name: p.read_text(errors="replace") for p in pipeline.dir.glob("*.log")}
    assert {"relay.log", "worker.log", "sink.log", "gateway-sim.log"} <= set(logs)
    secrets = [
        "5511912345678",
        "5511987650000",
        "5511955550000",
        "order confirmed",
        "your code is 1234",
        "nobody",
        "dev-stackzap-key",
    ]
    leaks = [(name, s) for name, text in logs.items() for s in secrets if s in text]
    assert not leaks, leaks


def test_forged_intents_of_the_wrong_shape_go_to_the_dead_letters_and_send_nothing(
    pipeline: LocalPipeline,
) -> None:
    """Anyone who can produce to ``zapstream.intents`` must not make the worker send what
    the contract forbids: each forged record is dead-lettered with the field it breaks,
    and the good intent behind it on the same partition is sent."""
    run = uuid.uuid4().hex[:12]
    to = "5511955550000"
    valid = IntentCaptured(
        job_id=10**12 + 1,
        instance_id="shop-9",
        conversation_key=to,
        idempotency_key=f"forged-{run}",
        message_type="text",
        to=to,
        text=f"forged [{run}]",
    ).to_dict()
    forged = {
        "job_id must be an integer": {**valid, "job_id": str(valid["job_id"])},
        "to must be a string": {**valid, "to": int(to)},
        "max_attempts must be from 1 to 100": {**valid, "max_attempts": -1},
        "instance_id '..' is not": {**valid, "instance_id": ".."},
    }
    key = conversation_partition_key("shop-9", to)

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=pipeline.kafka.bootstrap, acks="all")
        await producer.start()
        try:
            for record in forged.values():
                await producer.send_and_wait(pipeline.topics.intents, orjson.dumps(record), key=key)
        finally:
            await producer.stop()

    asyncio.run(produce())
    good = f"after-forged-{run}"
    with psycopg.connect(pipeline.dsn) as conn:
        enqueue(conn, instance_id="shop-9", to=to, text=f"ok [{good}:0]", idempotency_key=good)
    wait_for_status(pipeline.dsn, [good], "ACCEPTED", 60)

    def dead_reasons() -> list[str]:
        reasons = []
        for r in read_topic(pipeline.kafka.bootstrap, pipeline.topics.dead, timeout_s=5):
            dead = JobDead.loads(r.value)
            if dead.record is not None and run in str(dead.record.get("value", "")):
                reasons.append(dead.reason)
        return reasons

    wait_until(lambda: len(dead_reasons()) == len(forged), 30, "the forged records dead-lettered")
    reasons = dead_reasons()
    for expected in forged:
        assert any(expected in reason for reason in reasons), (expected, reasons)
    assert not [m for m in Arrivals(pipeline).refresh() if m["text"] == f"forged [{run}]"]
