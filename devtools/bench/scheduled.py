"""``make bench --only scheduled``: a million jobs scheduled for one minute ahead.

Issue 19's acceptance 2, on real processes (relay, worker, gateway simulator):

1. an idle worker's RSS is read;
2. ``--scheduled-jobs`` bulk jobs for one instance are pre-filled with ONE
   ``INSERT ... SELECT generate_series`` whose ``next_retry_at`` is a minute ahead
   (``--scheduled-due-s``): migration 0008 makes them SCHEDULED;
3. just before they are due: the worker's RSS (they must cost it nothing: within
   10 % of idle) and the records added to the intents topics since the fill (they
   must cost Kafka nothing: 0);
4. when due, the relay releases them and the worker drains them through the
   instance's pacing (``ZAPSTREAM_WORKER_INSTANCE_RATE_PER_S``), while one operational
   message a 0.2 s goes to the same instance: its commit -> gateway p99 must stay
   within 1 s over ``--scheduled-drain-s``; the campaign's drain rate and the
   release rate are printed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TextIO

import psycopg

from devtools.bench.support import Figure, ms, percentile, proc_status_mib, wait_until
from devtools.stack.delivery_audit import KEY_IN_TEXT
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import BULK_INTENTS, INTENTS

PACED_RATE_PER_S = 200.0
"""The instance's send rate: the campaign drains at this pace."""

_FILL = """
INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, priority, purpose, next_retry_at)
SELECT 'inst-b',
       jsonb_build_object(
           'type', 'text',
           'to', '+55 11 9' || lpad((g %% 50000)::text, 8, '0'),
           'text', 'campaign [' || %(run)s || ':inst-b:c' || (g %% 50000) || ':'
               || (g / 50000) || ']'),
       %(run)s || '-' || g, 'bulk', 'campaign', now() + make_interval(secs => %(due)s)
FROM generate_series(0, %(jobs)s - 1) AS g
"""


def _log(out: TextIO, text: str) -> None:
    print(f"bench: scheduled: {text}", file=out, flush=True)


async def _end_offsets(bootstrap: str, topics: list[str]) -> int:
    """The sum of the topics' end offsets: records ever produced to them."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    # Subscribed (no group): start() fetches the topics' metadata.
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in topics
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        ends = await consumer.end_offsets(partitions)
        return sum(ends.values())
    finally:
        await consumer.stop()


async def _relayed_at(bootstrap: str, topic: str, keys: set[str]) -> dict[str, float]:
    """When the relay produced each of ``keys``' intents (the record's timestamp, s)."""
    from aiokafka import AIOKafkaConsumer

    from streams.kernel.contract import ContractError, IntentCaptured

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    found: dict[str, float] = {}
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=2000)
            if not batch:
                return found
            for records in batch.values():
                for record in records:
                    try:
                        intent = IntentCaptured.loads(record.value or b"")
                    except ContractError:
                        continue
                    key = KEY_IN_TEXT.search(intent.text)
                    if key and key.group(1) in keys:
                        found.setdefault(key.group(1), record.timestamp / 1000)
    finally:
        await consumer.stop()


def _count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def run_scheduled_section(
    *,
    jobs: int,
    due_s: float,
    drain_s: float,
    partitions: int,
    out: TextIO,
    broker: str | None = None,
) -> list[Figure]:
    """The figures of acceptance 2 (see the module docstring)."""
    rate = {"ZAPSTREAM_WORKER_INSTANCE_RATE_PER_S": str(PACED_RATE_PER_S)}
    with LocalPipeline(partitions=partitions, broker=broker, worker_env=rate) as pipe:
        pipe.start_relay()
        worker = pipe.start_worker()
        topics = [pipe.kafka_settings().names.by_logical()[t] for t in (INTENTS, BULK_INTENTS)]
        time.sleep(5.0)  # idle: let the worker settle after start-up
        idle_mib = proc_status_mib(worker.pid, "VmRSS")
        offsets_before = asyncio.run(_end_offsets(pipe.kafka.bootstrap, topics))
        run = uuid.uuid4().hex[:8]
        started = time.monotonic()
        with psycopg.connect(pipe.dsn, autocommit=True) as conn:
            conn.execute(_FILL, {"run": run, "due": due_s, "jobs": jobs})
        fill_s = time.monotonic() - started
        due_at = started + due_s
        _log(out, f"{jobs:,} jobs filled in {fill_s:.1f} s, due {due_s:g} s after the start")
        scheduled = _count(pipe.dsn, "SELECT count(*) FROM outbox_jobs WHERE status = 'SCHEDULED'")
        wait_until(
            lambda: time.monotonic() >= due_at - 3.0, timeout_s=due_s + 5, what="just before due"
        )
        before_mib = proc_status_mib(worker.pid, "VmRSS")
        offsets_waiting = asyncio.run(_end_offsets(pipe.kafka.bootstrap, topics))
        _log(
            out,
            f"before due: worker RSS {before_mib:.0f} MiB (idle {idle_mib:.0f} MiB), "
            f"{offsets_waiting - offsets_before} records added to the intents topics, "
            f"{scheduled:,} SCHEDULED after the fill",
        )
        committed: dict[str, float] = {}
        with psycopg.connect(pipe.dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            wait_until(lambda: time.monotonic() >= due_at, timeout_s=10, what="due")
            drain_started = time.monotonic()
            i = 0
            while time.monotonic() < drain_started + drain_s:
                key = f"{run}:inst-b:op{i}:0"
                conn.execute(
                    "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES "
                    "('inst-b', jsonb_build_object('type', 'text', 'to', %s::text, "
                    "'text', %s::text), %s)",
                    (f"+351 91{i % 10_000_000:07d}", f"code [{key}]", key),
                )
                committed[key] = time.time()
                i += 1
                time.sleep(0.2)
        left = _count(pipe.dsn, "SELECT count(*) FROM outbox_jobs WHERE status = 'SCHEDULED'")
        released_per_s = (jobs - left) / drain_s
        try:
            wait_until(
                lambda: _arrived(pipe, committed) >= len(committed),
                timeout_s=30,
                what="the operational messages",
                interval_s=0.5,
            )
        except TimeoutError as exc:
            _log(out, str(exc))
        first: dict[str, float] = {}
        campaign = 0
        for arrival in pipe.sim_messages():
            found = KEY_IN_TEXT.search(str(arrival.get("text", "")))
            if not found:
                continue
            key = found.group(1)
            if key in committed:
                first.setdefault(key, float(arrival["arrived_at"]))
            elif ":inst-b:c" in key:
                campaign += 1
        latencies = sorted(first[k] - committed[k] for k in first)
        p99 = percentile(latencies, 0.99)
        # Where the time goes: commit -> the relay's record, and that record -> the gateway.
        relayed = asyncio.run(_relayed_at(pipe.kafka.bootstrap, topics[0], set(first)))
        to_kafka = percentile(sorted(relayed[k] - committed[k] for k in relayed), 0.99)
        to_gateway = percentile(sorted(first[k] - relayed[k] for k in relayed), 0.99)
        _log(
            out,
            f"operational stages p99: commit->relay {ms(to_kafka)}, relay->gateway "
            f"{ms(to_gateway)} ({len(relayed)} of {len(first)} found on {topics[0]})",
        )
        _log(
            out,
            f"drain {drain_s:g} s: {campaign:,} campaign messages at the gateway "
            f"({campaign / drain_s:.0f}/s, paced at {PACED_RATE_PER_S:g}/s), "
            f"{released_per_s:,.0f} released/s; operational p99 {ms(p99)} "
            f"({len(first)}/{len(committed)})",
        )
    within = before_mib <= idle_mib * 1.10
    return [
        Figure(
            "scheduled",
            f"worker RSS with {jobs:,} jobs scheduled, before due",
            f"{before_mib:.0f} MiB",
            comparison=f"idle worker {idle_mib:.0f} MiB",
            target="within 10% of idle",
            passed=within,
        ),
        Figure(
            "scheduled",
            "records added to the intents topics while they wait",
            f"{offsets_waiting - offsets_before}",
            target="0",
            passed=offsets_waiting == offsets_before,
        ),
        Figure(
            "scheduled",
            "operational commit->gateway p99 on the same instance while the campaign drains",
            ms(p99),
            comparison=f"campaign {campaign / drain_s:.0f}/s paced at {PACED_RATE_PER_S:g}/s",
            target="<= 1 s",
            passed=p99 is not None and p99 <= 1.0 and len(first) == len(committed),
        ),
        Figure(
            "scheduled",
            f"pre-fill of {jobs:,} scheduled jobs (one INSERT ... SELECT)",
            f"{fill_s:.1f} s",
            comparison=f"released {released_per_s:,.0f}/s when due",
        ),
    ]


def _arrived(pipe: LocalPipeline, committed: dict[str, float]) -> int:
    found = 0
    for arrival in pipe.sim_messages():
        match = KEY_IN_TEXT.search(str(arrival.get("text", "")))
        if match and match.group(1) in committed:
            found += 1
    return found
