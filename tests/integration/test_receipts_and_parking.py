"""Receipts through the signed webhook; retries without head-of-line blocking (issues 3, 8).

The simulator's configuration is reset after every test by a fixture, so one
failing test leaves the next one the defaults; assertions are on facts that
cannot race (the event history in ``outbox_job_events``, arrival order at the
gateway, a fault that holds until the test lifts it), never on a state seen
inside a timing window.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator, Mapping

import httpx
import orjson
import psycopg
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner

from connectors.outbox.enqueue import enqueue
from connectors.webhook.signature import sign
from devtools.stack.local_pipeline import WEBHOOK_SECRET, LocalPipeline
from streams.kernel.contract import conversation_partition_key
from tests.integration.support import Arrivals, count_rows, wait_for_status, wait_until
from tests.integration.topic_reader import read_topic

pytestmark = pytest.mark.integration
PARTITIONS = 4


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    env = {
        "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true",
        "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[2]",
        "ZAPSTREAM_WORKER_RETRY_JITTER": "0",
        "ZAPSTREAM_WORKER_RETRY_SCAN_INTERVAL_S": "0.2",
        "ZAPSTREAM_WORKER_COMMIT_INTERVAL_S": "0.5",
    }
    with LocalPipeline(partitions=PARTITIONS, worker_env=env) as p:
        p.start_relay()
        p.start_worker()
        p.webhook_url = p.start_webhook()  # type: ignore[attr-defined]
        yield p


DEFAULT_SIM = {
    "callback_statuses": ["sent", "delivered", "read"],
    "fail_recipients": {},
    "error_rate": 0.0,
    "drop_response_rate": 0.0,
}


@pytest.fixture(autouse=True)
def sim_defaults(pipeline: LocalPipeline) -> Iterator[None]:
    """Whatever a test configured, the next one starts from the simulator's defaults."""
    yield
    pipeline.sim_config(
        **DEFAULT_SIM,
        callback_url=f"{pipeline.webhook_url}/v1/webhooks/stackzap",  # type: ignore[attr-defined]
        callback_secret=WEBHOOK_SECRET,
    )


def _status(dsn: str, key: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status FROM outbox_jobs WHERE idempotency_key = %s", (key,)
        ).fetchone()
    return str(row[0]) if row else ""


def _send_one(pipeline: LocalPipeline, key: str, to: str) -> tuple[int, str]:
    with psycopg.connect(pipeline.dsn) as conn:
        job_id = enqueue(conn, instance_id="shop", to=to, text=f"r [{key}:0]", idempotency_key=key)
    wait_until(
        lambda: _status(pipeline.dsn, key) in {"ACCEPTED", "DELIVERED", "READ"}, 60, "acceptance"
    )
    sim_id = next(m["id"] for m in Arrivals(pipeline).refresh() if m["text"] == f"r [{key}:0]")
    return job_id, sim_id


def _emit(pipeline: LocalPipeline, sim_id: str, status: str, **extra: object) -> str:
    response = httpx.post(
        f"{pipeline.sim_url}/_sim/callbacks/emit", json={"id": sim_id, "status": status, **extra}
    )
    response.raise_for_status()
    return response.headers.get("X-Sim-Callback-Status", "")


def test_receipts_in_order_end_read(pipeline: LocalPipeline) -> None:
    key = f"{uuid.uuid4().hex[:8]}-receipts"
    _send_one(pipeline, key, "5511900000301")
    wait_for_status(pipeline.dsn, [key], "READ", 60)


def test_out_of_order_and_duplicated_receipts_leave_the_right_final_state(
    pipeline: LocalPipeline,
) -> None:
    pipeline.sim_config(callback_statuses=[])
    key = f"{uuid.uuid4().hex[:8]}-ooo"
    job_id, sim_id = _send_one(pipeline, key, "5511900000302")
    assert _emit(pipeline, sim_id, "delivered") == "202"
    wait_for_status(pipeline.dsn, [key], "DELIVERED", 30)
    for late in ("read", "sent", "delivered", "read", "sent"):
        assert _emit(pipeline, sim_id, late) == "202"
    wait_for_status(pipeline.dsn, [key], "READ", 30)
    # A marker receipt on another job proves the late ones were processed, not pending.
    marker = f"{uuid.uuid4().hex[:8]}-marker"
    _, marker_sim = _send_one(pipeline, marker, "5511900000302")
    assert _emit(pipeline, marker_sim, "read") == "202"
    wait_for_status(pipeline.dsn, [marker], "READ", 30)
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        moves = conn.execute(
            "SELECT to_status FROM outbox_job_events WHERE job_id = %s ORDER BY version",
            (job_id,),
        ).fetchall()
    assert [m[0] for m in moves] == ["ATTEMPTING", "ACCEPTED", "DELIVERED", "READ"]


def test_unsigned_or_badly_signed_callbacks_get_401_and_change_nothing(
    pipeline: LocalPipeline,
) -> None:
    pipeline.sim_config(callback_statuses=[])
    key = f"{uuid.uuid4().hex[:8]}-unsigned"
    job_id, sim_id = _send_one(pipeline, key, "5511900000303")
    assert _emit(pipeline, sim_id, "read", signed=False) == "401"
    webhook = str(httpx.get(f"{pipeline.sim_url}/_sim/config").json()["callback_url"])
    body = f'{{"id": "{sim_id}", "status": "read", "reference": "{job_id}-1"}}'.encode()
    forged = httpx.post(
        webhook, content=body, headers={"X-Zap-Signature": sign("wrong", body, gateway="stackzap")}
    )
    assert forged.status_code == 401
    # The next signed receipt is applied; the forged ones before it were not.
    assert _emit(pipeline, sim_id, "delivered") == "202"
    wait_for_status(pipeline.dsn, [key], "DELIVERED", 30)
    assert (
        count_rows(
            pipeline.dsn,
            "SELECT count(*) FROM outbox_job_events WHERE job_id = %s AND to_status = 'READ'",
            (job_id,),
        )
        == 0
    )


def _signed_post(
    pipeline: LocalPipeline, gateway: str, body: Mapping[str, object], *, signed_for: str
) -> int:
    raw = orjson.dumps(body)
    answer = httpx.post(
        f"{pipeline.webhook_url}/v1/webhooks/{gateway}",  # type: ignore[attr-defined]
        content=raw,
        headers={"X-Zap-Signature": sign(WEBHOOK_SECRET, raw, gateway=signed_for)},
    )
    return answer.status_code


def test_receipts_replayed_to_another_gateway_or_about_another_gateway_job_change_nothing(
    pipeline: LocalPipeline,
) -> None:
    """Issue 18, finding 2: the reference alone (guessable ``<job>-<seq>``) bound a receipt;
    the webhook path's gateway and the receipt's gateway job id were not compared, and the
    signature did not cover the path."""
    pipeline.sim_config(callback_statuses=[])
    key = f"{uuid.uuid4().hex[:8]}-bound"
    job_id, sim_id = _send_one(pipeline, key, "5511900000305")
    sent = next(m for m in Arrivals(pipeline).refresh() if m["id"] == sim_id)
    reference = str(sent["reference"])
    assert reference.startswith(f"{job_id}-1-") and len(reference.split("-")) == 3
    read = {"id": sim_id, "status": "read", "reference": reference}
    # The StackZap callback's signed bytes replayed to the ZAP API's path: refused.
    assert (
        _signed_post(pipeline, "zapapi", {**read, "event_id": "r1"}, signed_for="stackzap") == 401
    )
    # Signed for the ZAP API's path: the reference does not verify there (dead-lettered).
    assert _signed_post(pipeline, "zapapi", {**read, "event_id": "r2"}, signed_for="zapapi") == 202
    # The right path and reference, another gateway job id.
    other = {**read, "id": "sim-other-job", "event_id": "r3"}
    assert _signed_post(pipeline, "stackzap", other, signed_for="stackzap") == 202
    # A guessed reference (the old format, or a forged tag) without the gateway job id.
    for n, guessed in enumerate((f"{job_id}-1", f"{job_id}-1-{'0' * 24}")):
        body = {"id": "sim-guess", "status": "read", "reference": guessed, "event_id": f"g{n}"}
        assert _signed_post(pipeline, "stackzap", body, signed_for="stackzap") == 202
    # The genuine receipt, after them in the same conversation, applies; they did not.
    assert _emit(pipeline, sim_id, "delivered") == "202"
    wait_for_status(pipeline.dsn, [key], "DELIVERED", 30)
    assert (
        count_rows(
            pipeline.dsn,
            "SELECT count(*) FROM outbox_job_events WHERE job_id = %s AND to_status = 'READ'",
            (job_id,),
        )
        == 0
    )


def _partition(instance: str, conversation: str) -> int:
    key = conversation_partition_key(instance, conversation)
    return int(DefaultPartitioner()(key, list(range(PARTITIONS)), list(range(PARTITIONS))))


async def _committed_and_end(pipeline: LocalPipeline, partition: int) -> tuple[int, int]:
    bootstrap = pipeline.kafka.bootstrap
    tp = TopicPartition(pipeline.topics.intents, partition)
    group = pipeline.topics.group("zapstream-worker")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    finally:
        await admin.close()
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        # The log end offset (no transactions here: the offset after the last record). Not
        # "read until a 500 ms poll comes back empty": a first fetch from Apache Kafka can
        # take longer than that on a loaded machine, which read as an empty partition.
        end = (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()
    meta = offsets.get(tp)
    return (meta.offset if meta else -1), end


def _history(dsn: str, key: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT e.to_status FROM outbox_job_events e JOIN outbox_jobs j ON j.id = e.job_id "
            "WHERE j.idempotency_key = %s ORDER BY e.version",
            (key,),
        ).fetchall()
    return [str(r[0]) for r in rows]


def test_a_failing_conversation_waits_without_blocking_its_partition(
    pipeline: LocalPipeline,
) -> None:
    pipeline.sim_config(callback_url=None)
    run = uuid.uuid4().hex[:8]
    blocked_to = "5511900000400"
    blocked_partition = _partition("shop", blocked_to)
    neighbours = [
        f"55119000004{n:02d}"
        for n in range(1, 80)
        if _partition("shop", f"55119000004{n:02d}") == blocked_partition
    ][:8]
    assert len(neighbours) >= 3
    # The head fails (503) until the test lifts the fault, with a budget no wait here
    # can exhaust (100 attempts x 2 s): while it is set, the head can only be waiting.
    pipeline.sim_config(fail_recipients={blocked_to: 1_000_000})
    blocked = [f"{run}:shop:{blocked_to}:{seq}" for seq in range(4)]
    others = [f"{run}:shop:{to}:{seq}" for to in neighbours for seq in range(3)]
    with psycopg.connect(pipeline.dsn) as conn:
        for seq in range(4):
            key = blocked[seq]
            enqueue(
                conn,
                instance_id="shop",
                to=blocked_to,
                text=f"b [{key}]",
                idempotency_key=key,
                max_attempts=100,
            )
            for to in neighbours:
                if seq < 3:
                    k = f"{run}:shop:{to}:{seq}"
                    enqueue(conn, instance_id="shop", to=to, text=f"o [{k}]", idempotency_key=k)
        conn.commit()
    arrivals = Arrivals(pipeline)
    # The neighbours finish while the blocked conversation's head is still failing.
    wait_for_status(pipeline.dsn, others, "ACCEPTED", 60)
    wait_until(
        lambda: (lambda c, e: c == e)(
            *asyncio.run(_committed_and_end(pipeline, blocked_partition))
        ),
        30,
        "the committed offset to pass the waiting conversation",
    )
    # Still failing, so none of the blocked conversation reached the gateway: the
    # committed offset passed records whose conversation waits.
    assert not [m for m in arrivals.refresh() if m["text"].startswith("b [")]
    assert "RETRY_WAIT" in _history(pipeline.dsn, blocked[0])

    pipeline.sim_config(fail_recipients={})
    report = arrivals.wait_for(blocked + others, timeout_s=60)
    print(
        f"parking: sent {len(blocked + others)}, accepted {report.accepted_unique}, "
        f"duplicates {report.duplicate_count}, order violations {len(report.order_violations)}, "
        f"lost {len(report.missing)}"
    )
    assert report.duplicate_count == 0 and report.order_violations == ()
    times = {
        k: m["arrived_at"]
        for m in arrivals.items
        for k in blocked + others
        if m["text"].endswith(f"[{k}]")
    }
    assert max(times[k] for k in others) < times[blocked[0]], "neighbours did not wait"
    assert [times[k] for k in blocked] == sorted(times[k] for k in blocked)
    wait_for_status(pipeline.dsn, blocked, "ACCEPTED", 30)
    history = _history(pipeline.dsn, blocked[0])
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        (attempts,) = conn.execute(
            "SELECT attempts FROM outbox_jobs WHERE idempotency_key = %s", (blocked[0],)
        ).fetchone() or (0,)
    print(f"parking: head attempts {attempts}, history {history}")
    assert history.index("RETRY_WAIT") < history.index("ACCEPTED")
    assert history[-2:] == ["ATTEMPTING", "ACCEPTED"]
    assert attempts >= 2 and attempts == history.count("ATTEMPTING")
    assert history.count("RETRY_WAIT") == attempts - 1
    # Its followers waited behind it and went out once each, first time.
    for key in blocked[1:]:
        assert _history(pipeline.dsn, key) == ["ATTEMPTING", "ACCEPTED"]


def _parked_records(pipeline: LocalPipeline, conversation: bytes) -> tuple[dict[bytes, bytes], int]:
    """(latest value of each key of ``conversation`` on the parked changelog, the largest
    value of any record on it)."""
    records = read_topic(pipeline.kafka.bootstrap, pipeline.topics.parked)
    latest = {
        r.key: r.value
        for r in records
        if r.key is not None and (r.key == conversation or r.key.startswith(conversation + b"\x00"))
    }
    return latest, max((len(r.value) for r in records), default=0)


def test_a_long_backlog_parks_as_small_records_and_goes_out_in_order_exactly_once(
    pipeline: LocalPipeline,
) -> None:
    """Issue 8: 300 messages behind a failing head; no parked record grows with the backlog,
    and a restarted worker recovers the backlog from the changelog."""
    pipeline.sim_config(callback_url=None)
    run = uuid.uuid4().hex[:8]
    to = "5511900000500"
    conversation = conversation_partition_key("shop", to)
    pipeline.sim_config(fail_recipients={to: 1_000_000})
    partition = _partition("shop", to)
    _, start = asyncio.run(_committed_and_end(pipeline, partition))
    keys = [f"{run}:shop:{to}:{seq}" for seq in range(300)]
    with psycopg.connect(pipeline.dsn) as conn:
        for key in keys:
            enqueue(
                conn,
                instance_id="shop",
                to=to,
                text=f"p [{key}]",
                idempotency_key=key,
                max_attempts=100,
            )
        conn.commit()
    arrivals = Arrivals(pipeline)
    arrivals.refresh()

    # Every intent acknowledged (committed), so parked durably behind the failing head.
    wait_until(
        lambda: (lambda c, e: c == e >= start + 300)(
            *asyncio.run(_committed_and_end(pipeline, partition))
        ),
        90,
        "the committed offset to pass the parked backlog",
        interval_s=1,
    )
    latest, largest = _parked_records(pipeline, conversation)
    head = latest[conversation]
    print(f"\nparked backlog of 300: largest parked record {largest} B, head {len(head)} B")
    # One intent per record, whatever the backlog (one value of 300 intents before).
    assert largest <= 1_024
    assert sum(1 for k, v in latest.items() if k != conversation and v) == 300
    assert (orjson.loads(head)["first"], orjson.loads(head)["next"]) == (0, 300)
    assert not [m for m in arrivals.refresh() if run in str(m["text"])]

    # The worker dies; its successor rebuilds the conversation from the changelog.
    worker = next(p for p in pipeline.processes if p.name == "worker" and p.is_running)
    worker.kill(signal.SIGKILL)
    worker.wait(timeout_s=10)
    worker = pipeline.start_worker("worker")
    worker.wait_for_log(
        r"parking: 1 conversations with 300 messages parked after recovery", timeout_s=60
    )

    pipeline.sim_config(fail_recipients={})
    lifted = time.monotonic()
    report = arrivals.wait_for(keys, timeout_s=120)
    print(f"parked backlog of 300: all at the gateway {time.monotonic() - lifted:.1f}s after")
    assert report.duplicate_count == 0, list(report.duplicates)[:5]
    assert report.order_violations == ()
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 60)
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT j.idempotency_key, array_agg(e.to_status ORDER BY e.version) "
            "FROM outbox_jobs j JOIN outbox_job_events e ON e.job_id = j.id "
            "WHERE j.idempotency_key = ANY(%s) GROUP BY j.idempotency_key",
            (keys[1:],),
        ).fetchall()
    # The followers waited behind the head and went out once each, first time.
    assert len(rows) == 299 and all(list(h) == ["ATTEMPTING", "ACCEPTED"] for _, h in rows)
    # Everything of the conversation is tombstoned on the changelog: nothing left parked.
    wait_until(
        lambda: not any(_parked_records(pipeline, conversation)[0].values()),
        30,
        "the conversation's parked records to be tombstoned",
        interval_s=1,
    )
