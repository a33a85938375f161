"""The CDC relay under SIGKILL, standby takeover and SIGTERM, on real processes.

Acceptance: 5,000 intents over 50 conversations, the relay SIGKILLed mid-stream
and restarted: every key reaches the gateway exactly once, in per-conversation
order, and outbox_jobs shows them accepted. Relay replays (records produced but
not yet confirmed to PostgreSQL) are absorbed by the worker's job table.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from connectors.cdc.lsn import Lsn
from devtools.stack.devstack import ManagedProcess, find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import HEADER_JOB_ID, HEADER_LSN
from tests.integration.support import (
    Arrivals,
    count_rows,
    enqueue_conversations,
    metric_value,
    wait_for_status,
    wait_until,
)
from tests.integration.topic_reader import end_offsets_sum, read_topic

pytestmark = pytest.mark.integration

PARTITIONS = 4


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=PARTITIONS) as p:
        p.start_worker()
        yield p


def _slot_confirmed(dsn: str) -> int:
    return count_rows(
        dsn,
        "SELECT coalesce(confirmed_flush_lsn - '0/0', 0)::bigint FROM pg_replication_slots "
        "WHERE slot_name = 'zapstream_outbox'",
    )


def _job_ids(dsn: str, keys: list[str]) -> set[int]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id FROM outbox_jobs WHERE idempotency_key = ANY(%s)", (keys,)
        ).fetchall()
    return {int(r[0]) for r in rows}


def _produced(pipeline: LocalPipeline, job_ids: set[int]) -> list[tuple[int, Lsn]]:
    """(job id, transaction LSN) of every record in zapstream.intents for these jobs."""
    out = []
    for record in read_topic(pipeline.kafka.bootstrap, pipeline.topics.intents):
        job = record.headers.get(HEADER_JOB_ID)
        if job is not None and job.decode().isdigit() and int(job) in job_ids:
            out.append((int(job), Lsn.parse(record.headers[HEADER_LSN].decode())))
    return out


def _resumed_from(relay: ManagedProcess) -> Lsn:
    """The slot position the (re)started relay streamed from, from its log."""
    # wait_for_log reads only what this run of the process wrote.
    match = relay.wait_for_log(r"relay streaming slot \S+ from (\S+)", timeout_s=60)
    return Lsn.parse(match.group(1))


def test_relay_sigkill_mid_stream_loses_nothing_and_sends_each_key_once(
    pipeline: LocalPipeline,
) -> None:
    # A slow status interval: at the kill, records are produced but not yet confirmed.
    metrics_port = find_free_port()
    slow = {
        "ZAPSTREAM_RELAY_STATUS_INTERVAL_S": "10",
        "ZAPSTREAM_RELAY_METRICS_PORT": str(metrics_port),
    }
    relay = pipeline.start_relay("relay-a", env=slow)
    start_confirmed = _slot_confirmed(pipeline.dsn)
    run = uuid.uuid4().hex[:8]
    half_committed = threading.Event()
    killed = threading.Event()

    commits = [0]

    def pace(committed: int) -> None:
        # The application keeps committing, steadily, while the relay dies and comes back.
        commits[0] = committed
        if committed >= 2_500:
            half_committed.set()
            if not killed.is_set():
                time.sleep(0.2)

    keys: list[str] = []
    producer = threading.Thread(
        target=lambda: keys.extend(
            enqueue_conversations(
                pipeline.dsn,
                run,
                messages=5_000,
                conversations=50,
                per_transaction=10,  # 250 paced transactions after halfway: ~50 s to kill in
                after_transaction=pace,
            )
        )
    )
    try:
        producer.start()
        assert half_committed.wait(timeout=120), "enqueue did not get halfway"
        # Mid-stream: the relay has confirmed part of the WAL, not all of it.
        wait_until(
            lambda: _slot_confirmed(pipeline.dsn) > start_confirmed,
            30,
            "the relay to confirm some WAL",
        )

        # Kill inside a confirmation window, never right after one: wait for a fresh
        # confirmation, then for records to land in Kafka after it (the relay confirms them only
        # at its next status, 10 s later). A loaded machine may hold the relay behind the
        # application's commits, so the relay's own confirmation and Kafka are what count.
        def in_kafka() -> int:
            return end_offsets_sum(pipeline.kafka.bootstrap, pipeline.topics.intents, PARTITIONS)

        def relay_confirmed() -> float:
            return metric_value(metrics_port, "zapstream_relay_confirmed_lsn")

        confirmed = relay_confirmed()
        wait_until(lambda: relay_confirmed() > confirmed, 30, "a fresh confirmation")
        confirmed, landed = relay_confirmed(), in_kafka()

        def landed_past_it() -> bool:
            grown = in_kafka() > landed
            assert relay_confirmed() == confirmed, "a later confirmation came first"
            return grown

        wait_until(landed_past_it, 8, "records in Kafka after it")
        assert producer.is_alive(), "the application stopped writing before the kill"
    except BaseException:
        relay.terminate(timeout_s=30)  # never left holding the slot for the next tests
        raise
    relay.kill(signal.SIGKILL)
    relay.wait(timeout_s=10)
    killed.set()
    relay = pipeline.start_relay("relay-a")
    try:
        _check_the_restart(pipeline, relay, producer, keys)
    finally:
        # A failed check must not leave this relay holding the slot for the next tests.
        relay.terminate(timeout_s=30)


def _check_the_restart(
    pipeline: LocalPipeline, relay: ManagedProcess, producer: threading.Thread, keys: list[str]
) -> None:
    resumed = _resumed_from(relay)
    producer.join(timeout=120)
    assert len(keys) == 5_000

    report = Arrivals(pipeline).wait_for(keys, timeout_s=240)
    # A replay happened: records the killed relay produced but never confirmed were
    # produced again from the slot's confirmed position (Kafka-level duplicates) ...
    produced = _produced(pipeline, _job_ids(pipeline.dsn, keys))
    counts = Counter(job for job, _ in produced)
    replayed = {job for job, n in counts.items() if n > 1}
    kafka_duplicates = sum(n - 1 for n in counts.values())
    print(
        f"\n[relay SIGKILL] sent=5000 accepted={report.accepted_unique} "
        f"duplicates={report.duplicate_count} order_violations={len(report.order_violations)} "
        f"lost={len(report.missing)} kafka_duplicates={kafka_duplicates} resumed_from={resumed}"
    )
    assert len(counts) == 5_000, "some intents never reached zapstream.intents"
    assert kafka_duplicates > 0, "no replay after the SIGKILL: the test did not test a crash"
    # ... and every replayed transaction lies after the position the new relay resumed from.
    assert all(lsn >= resumed for job, lsn in produced if job in replayed)
    # ... while the gateway saw each message once, in order.
    assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
    assert report.order_violations == ()
    assert report.accepted_unique == 5_000
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)


def test_standby_relay_takes_over_when_the_active_one_dies(pipeline: LocalPipeline) -> None:
    active = pipeline.start_relay("relay-active")
    active.wait_for_log(r"relay streaming", timeout_s=30)
    standby = pipeline.start_relay("relay-standby")
    standby.wait_for_log(r"relay standby", timeout_s=30)
    active.kill(signal.SIGKILL)
    standby.wait_for_log(r"relay streaming", timeout_s=60)
    keys = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=200, conversations=10)
    report = Arrivals(pipeline).wait_for(keys, timeout_s=120)
    assert report.ok, report.summary()
    assert standby.terminate(timeout_s=30) == 0


def test_sigterm_drains_confirms_and_exits_cleanly(pipeline: LocalPipeline) -> None:
    relay = pipeline.start_relay("relay-term")
    keys = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=300, conversations=10)
    Arrivals(pipeline).wait_for(keys, timeout_s=120)
    job_ids = _job_ids(pipeline.dsn, keys)
    last_txn = max(lsn for _, lsn in _produced(pipeline, job_ids))
    assert relay.terminate(timeout_s=30) == 0
    relay.wait_for_log(r"zapstream relay stopped after [\d.]+s: .* confirmed", timeout_s=5)
    # The drain confirmed the last transaction: the slot is past its commit record.
    assert _slot_confirmed(pipeline.dsn) > last_txn.value
    # So a new relay replays none of it to Kafka, and the gateway sees nothing twice.
    relay = pipeline.start_relay("relay-term")
    assert _resumed_from(relay) > last_txn
    arrivals = Arrivals(pipeline)
    later = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=20, conversations=2)
    report = arrivals.wait_for(keys + later, timeout_s=60)
    assert report.duplicate_count == 0
    counts = Counter(job for job, _ in _produced(pipeline, job_ids))
    assert set(counts.values()) == {1}, "the restarted relay produced drained records again"
    relay.terminate(timeout_s=30)
