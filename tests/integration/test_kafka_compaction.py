"""Compaction and exact Faust table recovery on Apache Kafka (issue 16).

Tansu never compacts, and its ListOffsets is wrong after multi-record batches, so the
Tansu tests run the worker with ``ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH``. Here the
broker is Apache Kafka itself:

1. Recovery without the Tansu workaround: a worker writing its changelog in batches is
   SIGKILLed mid-stream, its successor recovers the ``jobs`` table and finishes the run
   with nothing sent twice; SIGKILLed again once idle, the next one's recovered table
   equals ``zapstream.state`` read from the start (last value per key), entry for entry.
2. Compaction: the compacted topics (``zapstream.state``, ``zapstream.parked``,
   ``zapstream.controls``; the tables' changelogs are these two, not Faust's
   ``<app>-<table>-changelog``) with a short ``segment.ms``, ``min.cleanable.dirty.ratio``
   0, ``min.compaction.lag.ms`` 0 and a short ``delete.retention.ms`` (altered as an
   operator would, with the admin client) hold, once the cleaner ran, exactly one record
   per live key with its latest value: superseded states, the dedup horizon's tombstoned
   jobs and released parked conversations are gone. A worker SIGKILLed and restarted on
   the compacted topics recovers its tables exactly, drops redeliveries of the jobs it
   holds and checks those of the forgotten ones against PostgreSQL.

A segment is cleaned only once it is not the active one, and a segment rolls only when
a record is appended after ``segment.ms``: the test appends a tombstone for a key no
table uses (:data:`ROLL_KEY`) to every partition to roll them, and ignores that key.
The worker's tables are read through ``/tables/digest`` (:mod:`streams.table_digest`),
which shows hashes only.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from connectors.outbox.controls import (
    pause_campaign,
    pause_instance,
    resume_campaign,
    resume_instance,
)
from connectors.outbox.enqueue import enqueue
from devtools.stack.devstack import ManagedProcess, find_free_port
from devtools.stack.kafka_broker import KafkaBroker
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import (
    CONTROLS,
    PARKED,
    STATE,
    ControlChanged,
    StatusChanged,
)
from streams.table_digest import DIGEST_PATH, entry_hash, table_summary
from tests.integration.support import (
    Arrivals,
    enqueue_conversations,
    intents_of,
    republish,
    wait_for_status,
    wait_until,
)
from tests.integration.topic_reader import TopicRecord, read_topic

pytestmark = pytest.mark.integration

PARTITIONS = 4
ROLL_KEY = b"zapstream-test-segment-roll"
"""The key of the tombstones that roll segments; no table holds it."""
COMPACTED = (STATE, PARKED, CONTROLS)
SEGMENT_MS = 1000
FAST_CLEANING = {
    "segment.ms": str(SEGMENT_MS),
    "min.cleanable.dirty.ratio": "0",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "1000",
}
"""Topic configs that let the cleaner run within the test (production keeps the defaults
and ``topics ensure``'s ``min.compaction.lag.ms`` of an hour)."""
CLEANER_BACKOFF_MS = "500"
"""``log.cleaner.backoff.ms``, a dynamic broker config (Kafka's default: 15 s)."""

RECOVERY_ENV = {
    # Kafka's default, said out loud: no Tansu workaround; the changelog goes in batches.
    "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "false",
    # Keep every job: the table only grows, so it can be compared with the changelog.
    "ZAPSTREAM_WORKER_DEDUP_HORIZON_S": "0",
}
HORIZON_ENV = {
    "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "false",
    "ZAPSTREAM_WORKER_DEDUP_HORIZON_S": "4",
    "ZAPSTREAM_WORKER_DEDUP_MARGIN_S": "1",
    "ZAPSTREAM_WORKER_DEDUP_SCAN_INTERVAL_S": "0.5",
    "ZAPSTREAM_WORKER_DEDUP_LOOKUP_RETRY_S": "1",
    "ZAPSTREAM_WORKER_DEDUP_SINK_MARGIN_S": "0.5",
    "ZAPSTREAM_WORKER_DEDUP_SINK_CHECK_S": "0.5",
    "ZAPSTREAM_WORKER_COMMIT_INTERVAL_S": "0.5",
    "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[1]",
    "ZAPSTREAM_WORKER_RETRY_JITTER": "0",
    "ZAPSTREAM_WORKER_RETRY_SCAN_INTERVAL_S": "0.2",
}


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(broker="kafka", partitions=PARTITIONS, own_broker=True) as p:
        p.start_relay()
        yield p


@pytest.fixture(autouse=True)
def sink_running(pipeline: LocalPipeline) -> Iterator[None]:
    """Each test starts with the state sink running and no worker, and leaves none of its
    workers running (a worker left in the group would own partitions in the next test)
    and the simulator's defaults."""
    if pipeline.sink is None or not pipeline.sink.is_running:
        pipeline.start_sink()
    yield
    for proc in pipeline.processes:
        if proc.name.startswith(("recovery-", "compaction-")) and proc.is_running:
            proc.stop()
    pipeline.sim_config(fail_recipients={}, latency_ms=0)


class Worker:
    """A worker process, its ``/metrics`` and its ``/tables/digest``."""

    def __init__(self, pipeline: LocalPipeline, name: str, env: dict[str, str]) -> None:
        self.port = find_free_port()
        self.started = time.monotonic()
        self.process: ManagedProcess = pipeline.start_worker(
            name, env={**env, "ZAPSTREAM_WORKER_WEB_PORT": str(self.port)}
        )

    def digest(self, *, entries: bool = False) -> dict[str, Any]:
        params = {"entries": "1"} if entries else {}
        response = httpx.get(
            f"http://127.0.0.1:{self.port}{DIGEST_PATH}", params=params, timeout=30
        )
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def wait_recovered(self, timeout_s: float = 120) -> float:
        """Wait until the worker owns partitions and has recovered its tables (the same
        key counts twice in a row, 0.5 s apart); return the seconds since its start."""
        last: list[object] = [None]

        def settled() -> bool:
            body = self.digest()
            counts = (
                body["ready"],
                body["assigned"],
                *(t["keys"] for t in body["tables"].values()),
            )
            stable = bool(body["ready"]) and body["assigned"] > 0 and counts == last[0]
            last[0] = counts
            return stable

        wait_until(settled, timeout_s, "the worker's tables recovered", interval_s=0.5)
        return time.monotonic() - self.started

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


# --- reading topics as a table -----------------------------------------------------------


def last_values(records: list[TopicRecord]) -> dict[bytes, bytes]:
    """What a changelog read from the start makes of a table: the last value of each key,
    a tombstone removing it (the roll key's tombstones change nothing)."""
    table: dict[bytes, bytes] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.key is not None, f"a record without a key on partition {record.partition}"
        if record.value:
            table[record.key] = record.value
        else:
            table.pop(record.key, None)
    return table


def entry_diff(worker: dict[str, Any], table: dict[bytes, bytes]) -> tuple[list[str], int]:
    """(keys of the changelog's entries the worker lacks or holds otherwise, count of
    entries the worker holds that the changelog does not)."""
    ours = {entry_hash(k, v): k for k, v in table.items()}
    theirs = set(worker["entries"])
    missing = sorted(ours[h].decode(errors="replace")[:40] for h in ours.keys() - theirs)
    return missing, len(theirs - ours.keys())


def state_of(value: bytes) -> StatusChanged:
    return StatusChanged.loads(value)


def job_ids(dsn: str, keys: list[str]) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, id FROM outbox_jobs WHERE idempotency_key = ANY(%s)", (keys,)
        ).fetchall()
    return {str(k): int(i) for k, i in rows}


def segment_batches(broker: KafkaBroker, topic: str) -> tuple[int, int, int]:
    """(records, batches, most records in one batch) of ``topic``'s segment files.

    Kafka's record batch (v2) header: baseOffset int64, batchLength int32 (the bytes
    after it), partitionLeaderEpoch int32, magic int8, crc int32, attributes int16,
    lastOffsetDelta int32, two timestamps, producer id/epoch, baseSequence, then the
    record count (int32) at byte 57. Control batches (attribute bit 5) are skipped.
    """
    records = batches = largest = 0
    for log in sorted(Path(broker.data_dir).glob(f"{topic}-*/*.log")):
        data = log.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            (length,) = struct.unpack_from(">i", data, pos + 8)
            if length <= 0:
                break
            (attributes,) = struct.unpack_from(">h", data, pos + 21)
            (count,) = struct.unpack_from(">i", data, pos + 57)
            if not attributes & 0x20:
                records += count
                batches += 1
                largest = max(largest, count)
            pos += 12 + length
    return records, batches, largest


# --- the admin side ------------------------------------------------------------------------


async def _topic_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, tuple[str, int]]:
    """Every config of ``topic``: name -> (value, source); source 1 is the topic's own."""
    response = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    out: dict[str, tuple[str, int]] = {}
    for r in response:
        for error_code, message, _type, _name, entries in r.resources:
            assert error_code == 0, f"describe {topic}: {message}"
            for name, value, _read_only, source, *_ in entries:
                out[str(name)] = (str(value), int(source))
    return out


async def _cleanup_policies(bootstrap: str) -> dict[str, str]:
    """Every topic on the broker and its cleanup.policy."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {
            t: (await _topic_configs(admin, t))["cleanup.policy"][0]
            for t in await admin.list_topics()
        }
    finally:
        await admin.close()


async def _clean_fast(bootstrap: str, node_id: int) -> dict[str, str]:
    """Check that the compacted topics were created compacted, then make the cleaner run
    within the test; return each topic's cleanup.policy as created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        created = {}
        for topic in COMPACTED:
            configs = await _topic_configs(admin, topic)
            created[topic] = configs["cleanup.policy"][0]
            # AlterConfigs replaces a topic's own configs as a whole: keep what
            # `topics ensure` set (cleanup.policy) and change the rest.
            own = {name: value for name, (value, source) in configs.items() if source == 1}
            resources = [ConfigResource(ConfigResourceType.TOPIC, topic, {**own, **FAST_CLEANING})]
            for r in await admin.alter_configs(resources):
                for error_code, message, *_ in r.resources:
                    assert error_code == 0, f"alter {topic}: {message}"
        broker = ConfigResource(
            ConfigResourceType.BROKER, str(node_id), {"log.cleaner.backoff.ms": CLEANER_BACKOFF_MS}
        )
        for r in await admin.alter_configs([broker]):
            for error_code, message, *_ in r.resources:
                assert error_code == 0, f"alter broker {node_id}: {message}"
        # Dynamic configs reach the broker through the metadata log: wait until they show.
        deadline = time.monotonic() + 30
        while True:
            seen = {t: await _topic_configs(admin, t) for t in COMPACTED}
            if all(
                float(seen[t][k][0]) == float(v) and seen[t]["cleanup.policy"][0] == "compact"
                for t in COMPACTED
                for k, v in FAST_CLEANING.items()
            ):
                break
            assert time.monotonic() < deadline, f"the topic configs did not apply: {seen}"
            await asyncio.sleep(0.2)
        return created
    finally:
        await admin.close()


async def _roll(bootstrap: str) -> None:
    """A tombstone of :data:`ROLL_KEY` to every partition of the compacted topics: a record
    appended after ``segment.ms`` closes the active segment, so the cleaner may take it."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        acks = []
        for topic in COMPACTED:
            for partition in sorted(await producer.partitions_for(topic)):
                acks.append(await producer.send(topic, None, key=ROLL_KEY, partition=partition))
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


# --- 1. recovery without the Tansu workaround ----------------------------------------------

RECOVERY_MESSAGES = 2_000


def test_recovery_after_sigkill_is_exact_with_batched_changelog_writes(
    pipeline: LocalPipeline,
) -> None:
    assert isinstance(pipeline.kafka, KafkaBroker)
    # Jobs are in flight at the kill: ATTEMPTING in the changelog, outcome unknown.
    pipeline.sim_config(latency_ms=20)
    arrivals = Arrivals(pipeline)
    before = len(arrivals.refresh())
    first = Worker(pipeline, "recovery-1", RECOVERY_ENV)
    keys = enqueue_conversations(
        pipeline.dsn, uuid.uuid4().hex[:8], messages=RECOVERY_MESSAGES, conversations=50
    )
    wait_until(
        lambda: len(arrivals.refresh()) >= before + RECOVERY_MESSAGES // 3,
        120,
        "a third at the gateway",
    )
    first.process.kill(signal.SIGKILL)
    first.process.wait(timeout_s=10)
    killed_at = time.monotonic()
    second = Worker(pipeline, "recovery-2", RECOVERY_ENV)
    second.wait_recovered()
    mid_stream_recovery_s = time.monotonic() - killed_at

    report = arrivals.wait_for(keys, timeout_s=180)
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
    changelog = read_topic(pipeline.kafka.bootstrap, STATE)
    table = last_values(changelog)
    live = second.digest(entries=True)["tables"]["jobs"]
    live_missing, live_extra = entry_diff(live, table)

    # Idle now: killed again, the next worker's table is only what it recovered.
    second.process.kill(signal.SIGKILL)
    second.process.wait(timeout_s=10)
    third = Worker(pipeline, "recovery-3", RECOVERY_ENV)
    recovery_s = third.wait_recovered()
    recovered = third.digest(entries=True)["tables"]["jobs"]
    after = read_topic(pipeline.kafka.bootstrap, STATE)
    missing, extra = entry_diff(recovered, table)
    ids = job_ids(pipeline.dsn, keys)
    ours = {str(i).encode() for i in ids.values()}
    records, batches, largest = segment_batches(pipeline.kafka, STATE)
    final = arrivals.wait_for(keys, timeout_s=10)
    print(
        f"\nrecovery without one-record-per-batch: {RECOVERY_MESSAGES} sent, "
        f"{report.accepted_unique} accepted, duplicates {final.duplicate_count}, "
        f"order violations {len(report.order_violations)}, lost {len(report.missing)}; "
        f"mid-stream SIGKILL -> recovered and ready in {mid_stream_recovery_s:.1f} s\n"
        f"changelog {len(changelog)} records ({records} in {batches} batches, up to "
        f"{largest} per batch), {len(table)} keys; worker after the run: {live['keys']} keys, "
        f"{len(live_missing) + live_extra} mismatches; SIGKILLed idle, its successor "
        f"recovered {recovered['keys']} keys in {recovery_s:.1f} s from start, "
        f"{len(missing)} missing or different, {extra} extra"
    )
    assert report.order_violations == (), report.order_violations[:5]
    assert final.duplicate_count == 0, f"sent twice: {list(final.duplicates)[:5]}"
    assert ours <= table.keys(), "a job of this run has no state on the changelog"
    assert all(state_of(table[k]).status == "ACCEPTED" for k in ours)
    assert (live_missing, live_extra) == ([], 0), live_missing[:5]
    assert len(after) == len(changelog), "the changelog moved while the worker was idle"
    assert (missing, extra) == ([], 0), missing[:5]
    assert recovered["keys"] == len(table)
    assert recovered["digest"] == table_summary(table.items())["digest"]
    # Batched writes: what ONE_RECORD_PER_BATCH=true would have prevented.
    assert largest > 1, f"{records} changelog records in {batches} batches of one"
    assert third.process.terminate(timeout_s=60) == 0, third.process.log_tail()


# --- 2. compaction and recovery from the compacted topics -----------------------------------


def wait_compacted(
    pipeline: LocalPipeline, expected: dict[str, dict[bytes, bytes]], timeout_s: float = 120
) -> tuple[dict[str, list[TopicRecord]], int, float]:
    """Roll the segments every ``segment.ms`` until each compacted topic, read from the
    start, holds exactly one record per live key, with its latest value, and no tombstone
    (the roll key aside). Returns the records read, the rolls and the seconds it took."""
    started = time.monotonic()
    rolls = 0
    last_roll = float("-inf")
    seen: dict[str, list[TopicRecord]] = {}

    def compacted() -> bool:
        nonlocal rolls, last_roll
        if time.monotonic() - last_roll >= SEGMENT_MS / 1000 + 0.1:
            asyncio.run(_roll(pipeline.kafka.bootstrap))
            rolls += 1
            last_roll = time.monotonic()
        for topic, want in expected.items():
            records = [r for r in read_topic(pipeline.kafka.bootstrap, topic) if r.key != ROLL_KEY]
            seen[topic] = records
            counts = collections.Counter(r.key for r in records)
            if any(n > 1 for n in counts.values()) or any(not r.value for r in records):
                return False
            if {r.key: r.value for r in records if r.key is not None} != want:
                return False
        return True

    wait_until(compacted, timeout_s, "the cleaner to compact the topics", interval_s=0.5)
    return seen, rolls, time.monotonic() - started


def test_compaction_keeps_the_latest_value_per_live_key_and_recovery_is_exact(
    pipeline: LocalPipeline,
) -> None:
    assert isinstance(pipeline.kafka, KafkaBroker)
    bootstrap = pipeline.kafka.bootstrap
    arrivals = Arrivals(pipeline)
    arrivals.refresh()
    worker = Worker(pipeline, "compaction-1", HORIZON_ENV)
    run = uuid.uuid4().hex[:8]

    # Phase 1: jobs that settle and leave the table after the dedup horizon (tombstones),
    # one conversation that parks twice and is released (parked records, then
    # tombstones), and an instance and a campaign paused then resumed (two controls each).
    parked_to = "5511900000777"
    pipeline.sim_config(fail_recipients={parked_to: 2})
    parked_keys = [f"{run}p:shop:{parked_to}:{seq}" for seq in range(3)]
    with psycopg.connect(pipeline.dsn) as conn:
        for key in parked_keys:
            enqueue(conn, instance_id="shop", to=parked_to, text=f"p [{key}]", idempotency_key=key)
        conn.commit()
    forgotten_keys = parked_keys + enqueue_conversations(
        pipeline.dsn, f"{run}a", messages=120, conversations=12
    )
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        pause_instance(conn, "compaction-probe", reason="test", actor="test")
        resume_instance(conn, "compaction-probe", reason="test", actor="test")
        pause_campaign(conn, "compaction-probe", reason="test", actor="test")
        resume_campaign(conn, "compaction-probe", reason="test", actor="test")
    report = arrivals.wait_for(forgotten_keys, timeout_s=120)
    assert report.duplicate_count == 0 and report.order_violations == ()
    wait_for_status(pipeline.dsn, forgotten_keys, "ACCEPTED", 120)
    wait_until(
        lambda: (
            worker.metric("zapstream_jobs_forgotten_total") >= len(forgotten_keys)
            and worker.metric("zapstream_jobs_table_size") == 0
        ),
        90,
        "the dedup horizon to forget every settled job",
    )

    # Phase 2: the state sink stops, so the jobs sent now stay in the table (the horizon
    # forgets only what PostgreSQL holds): several states each, the latest to survive.
    assert pipeline.sink is not None
    assert pipeline.sink.terminate(timeout_s=60) == 0, pipeline.sink.log_tail()
    live_keys = enqueue_conversations(pipeline.dsn, f"{run}b", messages=60, conversations=12)
    arrivals.wait_for(live_keys, timeout_s=120)
    live_ids = {str(i).encode() for i in job_ids(pipeline.dsn, live_keys).values()}
    forgotten_ids = {str(i).encode() for i in job_ids(pipeline.dsn, forgotten_keys).values()}
    controls_expected = {b"instance:compaction-probe", b"campaign:compaction-probe"}

    def settled() -> bool:
        jobs = last_values(read_topic(bootstrap, STATE))
        controls = last_values(read_topic(bootstrap, CONTROLS))
        return (
            live_ids <= jobs.keys()
            and all(state_of(jobs[k]).status == "ACCEPTED" for k in live_ids)
            and controls_expected <= controls.keys()
            and all(ControlChanged.loads(controls[k]).action == "resume" for k in controls_expected)
        )

    wait_until(settled, 60, "the live jobs' final states and the resumes on their topics")

    # Before compaction: the whole history, and what it makes of each table.
    history = {topic: read_topic(bootstrap, topic) for topic in COMPACTED}
    expected = {topic: last_values(records) for topic, records in history.items()}
    assert expected[STATE].keys() == live_ids, "only the jobs of phase 2 are live"
    assert not expected[STATE].keys() & forgotten_ids
    assert expected[PARKED] == {}, "every parked conversation was released"
    parked_values = sum(1 for r in history[PARKED] if r.value)
    assert parked_values >= 2 * len(parked_keys), "the conversation never parked"
    superseded = {
        t: len(history[t]) - len(expected[t]) - sum(1 for r in history[t] if not r.value)
        for t in COMPACTED
    }
    assert superseded[STATE] >= len(live_ids), "each live job has more than one state"
    assert superseded[CONTROLS] >= 2

    # What `topics ensure` and Faust created: the tables' changelogs are the contract's
    # topics; Faust adds no <app>-<table>-changelog, only its leader topic (no records).
    policies = asyncio.run(_cleanup_policies(bootstrap))
    compacted_topics = sorted(t for t, p in policies.items() if "compact" in p)
    print(f"\ncompacted topics: {compacted_topics}; all topics: {sorted(policies)}", end="")
    assert not [t for t in policies if t.endswith("-changelog")], sorted(policies)
    assert set(compacted_topics) == {*COMPACTED, "__consumer_offsets"}
    created = asyncio.run(_clean_fast(bootstrap, pipeline.kafka.node_id))
    assert created == {t: "compact" for t in COMPACTED}, created
    compacted, rolls, compaction_s = wait_compacted(pipeline, expected)
    for topic in COMPACTED:
        tombstones = sum(1 for r in history[topic] if not r.value)
        print(
            f"\n{topic}: {len(history[topic])} records ({tombstones} tombstones, "
            f"{superseded[topic]} superseded) -> {len(compacted[topic])} after compaction, "
            f"one per live key ({len(expected[topic])}), no tombstone",
            end="",
        )
    print(f"\ncompacted in {compaction_s:.1f} s ({rolls} segment rolls)")

    # The worker SIGKILLed and started again recovers exactly what the compacted topics hold.
    worker.process.kill(signal.SIGKILL)
    worker.process.wait(timeout_s=10)
    worker = Worker(pipeline, "compaction-2", HORIZON_ENV)
    recovery_s = worker.wait_recovered()
    tables = worker.digest(entries=True)["tables"]
    mismatches = {}
    for name, topic in (("jobs", STATE), ("parked", PARKED)):
        table = last_values(read_topic(bootstrap, topic))
        missing, extra = entry_diff(tables[name], table)
        mismatches[name] = len(missing) + extra
        assert (missing, extra) == ([], 0), f"{name}: {missing[:5]}, {extra} extra"
        assert tables[name]["digest"] == table_summary(table.items())["digest"]
    assert tables["jobs"]["keys"] == len(live_ids)
    assert tables["parked"]["keys"] == 0

    # It uses them: a redelivered live job is a duplicate, a forgotten one is checked
    # against PostgreSQL; neither is sent again.
    sent_before = len(arrivals.refresh())
    replay = intents_of(pipeline, set(live_keys[:10]) | set(forgotten_keys[-10:]))
    assert len(replay) == 20
    asyncio.run(republish(pipeline, replay))
    wait_until(
        lambda: (
            worker.metric("zapstream_late_redeliveries_total", result="duplicate") >= 10
            and worker.metric("zapstream_intents_total", decision="duplicate") >= 20
        ),
        60,
        "the 20 redeliveries recognised",
    )
    final = arrivals.refresh()
    print(
        f"restart on the compacted topics: recovered {tables['jobs']['keys']} jobs and "
        f"{tables['parked']['keys']} parked records in {recovery_s:.1f} s, mismatches "
        f"{mismatches}; 20 redeliveries (10 live, 10 forgotten): "
        f"{len(final) - sent_before} sent again"
    )
    assert len(final) == sent_before
    assert worker.process.terminate(timeout_s=60) == 0, worker.process.log_tail()
