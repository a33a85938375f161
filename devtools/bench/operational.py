"""Operational messages on an instance a bulk campaign keeps busy: the probe of issues 9 and 19.

Both the ``campaign`` section (100,000 jobs due now) and the opt-in ``scheduled``
section (a million jobs due a minute ahead) fill one instance with a campaign by ONE
``INSERT ... SELECT generate_series`` (:func:`fill_campaign`), commit one operational
message to the same instance every 0.2 s while it drains (:func:`commit_operational`),
and measure those messages' commit -> gateway latency with its two stages
(:func:`operational_latency`): commit -> the relay's record (its CreateTime on the
intents topic) and that record -> the gateway. A p99 over 1 s means operational traffic
waited behind the campaign somewhere; the stages say whether in the relay or the worker.

Keys follow :mod:`devtools.stack.delivery_audit` (the key is in the text, so an arrival
traces back): campaign job ``g`` is ``<run>:inst-b:c<g % 50000>:<g // 50000>``,
operational message ``i`` is ``<run>:inst-b:op<i>:0``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TextIO

import psycopg

from devtools.bench.support import ms, percentile, wait_until
from devtools.stack.delivery_audit import KEY_IN_TEXT
from devtools.stack.local_pipeline import LocalPipeline

INSTANCE = "inst-b"
"""The one instance of the campaign and the operational messages."""
PACED_RATE_PER_S = 200.0
"""The instance's send rate (``ZAPSTREAM_WORKER_INSTANCE_RATE_PER_S``): the campaign drains
at this pace."""
INTERVAL_S = 0.2
"""One operational message per this many seconds."""
P99_TARGET_S = 1.0
"""Issue 9's bound on the operational p99 while a campaign drains on the same instance."""

_FILL = """
INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, priority, purpose, next_retry_at)
SELECT %(instance)s,
       jsonb_build_object(
           'type', 'text',
           'to', '+55 11 9' || lpad((g %% 50000)::text, 8, '0'),
           'text', 'campaign [' || %(run)s || ':' || %(instance)s || ':c' || (g %% 50000) || ':'
               || (g / 50000) || ']'),
       %(run)s || '-' || g, 'bulk', 'campaign', now() + make_interval(secs => %(due)s)
FROM generate_series(0, %(jobs)s - 1) AS g
"""


def meets_bound(p99_s: float | None, delivered: int, committed: int) -> bool:
    """Issue 9's bound: p99 within :data:`P99_TARGET_S` and every message delivered."""
    return p99_s is not None and p99_s <= P99_TARGET_S and delivered == committed


def paced_env() -> dict[str, str]:
    """The worker's environment: every instance paced at :data:`PACED_RATE_PER_S`."""
    return {"ZAPSTREAM_WORKER_INSTANCE_RATE_PER_S": str(PACED_RATE_PER_S)}


def fill_campaign(dsn: str, *, run: str, jobs: int, due_s: float | None = None) -> str:
    """``jobs`` bulk campaign jobs for :data:`INSTANCE` in one statement, due ``due_s`` ahead
    (None: due now, PENDING; later: SCHEDULED by migration 0008's trigger).

    Returns ``pg_current_wal_insert_lsn()`` after the commit: once the relay's slot is
    confirmed past it the whole campaign is in Kafka (the insert position, not
    ``pg_current_wal_lsn()``, which lags unflushed commits with ``synchronous_commit=off``).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        # make_interval(secs => NULL) is NULL, and so is now() + NULL: next_retry_at unset.
        conn.execute(_FILL, {"run": run, "jobs": jobs, "due": due_s, "instance": INSTANCE})
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def is_campaign_key(key: str) -> bool:
    return f":{INSTANCE}:c" in key


def commit_operational(dsn: str, *, run: str, seconds: float) -> dict[str, float]:
    """One operational message to :data:`INSTANCE` per :data:`INTERVAL_S` for ``seconds``,
    one per transaction with ``synchronous_commit = on`` (as applications commit); returns
    each key's commit time (wall clock, as the simulator stamps arrivals)."""
    committed: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        started = time.monotonic()
        i = 0
        while time.monotonic() < started + seconds:
            key = f"{run}:{INSTANCE}:op{i}:0"
            conn.execute(
                "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES "
                "(%s, jsonb_build_object('type', 'text', 'to', %s::text, "
                "'text', %s::text), %s)",
                (INSTANCE, f"+351 91{i % 10_000_000:07d}", f"code [{key}]", key),
            )
            committed[key] = time.time()
            i += 1
            delay = started + i * INTERVAL_S - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    return committed


def first_arrivals(pipe: LocalPipeline, keys: set[str] | dict[str, float]) -> dict[str, float]:
    """Each of ``keys``' first arrival time at the simulator."""
    first: dict[str, float] = {}
    for arrival in pipe.sim_messages():
        found = KEY_IN_TEXT.search(str(arrival.get("text", "")))
        if found and found.group(1) in keys:
            first.setdefault(found.group(1), float(arrival["arrived_at"]))
    return first


def campaign_arrivals(pipe: LocalPipeline) -> list[float]:
    """The arrival times of every campaign message the simulator accepted."""
    times: list[float] = []
    for arrival in pipe.sim_messages():
        found = KEY_IN_TEXT.search(str(arrival.get("text", "")))
        if found and is_campaign_key(found.group(1)):
            times.append(float(arrival["arrived_at"]))
    return times


async def _end_offsets(bootstrap: str, topics: list[str]) -> int:
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


def end_offsets(bootstrap: str, topics: list[str]) -> int:
    """The sum of the topics' end offsets: records ever produced to them."""
    return asyncio.run(_end_offsets(bootstrap, topics))


async def _relayed_at(bootstrap: str, topic: str, keys: set[str]) -> dict[str, float]:
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
                        continue  # a command or a receipt
                    key = KEY_IN_TEXT.search(intent.text)
                    if key and key.group(1) in keys:
                        found.setdefault(key.group(1), record.timestamp / 1000)
    finally:
        await consumer.stop()


@dataclasses.dataclass(frozen=True, slots=True)
class OperationalLatency:
    """The operational messages' commit -> gateway latency and its two stages (seconds)."""

    committed: int
    delivered: int
    p50_s: float | None
    p99_s: float | None
    to_relay_p50_s: float | None
    to_relay_p99_s: float | None
    to_gateway_p50_s: float | None
    to_gateway_p99_s: float | None
    found_on_topic: int

    @property
    def passed(self) -> bool:
        return meets_bound(self.p99_s, self.delivered, self.committed)

    def stages(self) -> str:
        return (
            f"stages p50/p99: commit->relay record {ms(self.to_relay_p50_s)}/"
            f"{ms(self.to_relay_p99_s)}, relay record->gateway {ms(self.to_gateway_p50_s)}/"
            f"{ms(self.to_gateway_p99_s)}"
        )


def operational_latency(
    pipe: LocalPipeline, committed: dict[str, float], *, topic: str, out: TextIO, label: str
) -> OperationalLatency:
    """Wait (up to 30 s) for ``committed`` at the gateway, then their latencies; the relay's
    record times are read back from ``topic`` (the intents topic: operational, not bulk)."""
    try:
        wait_until(
            lambda: len(first_arrivals(pipe, committed)) >= len(committed),
            timeout_s=30,
            what="the operational messages",
            interval_s=0.5,
        )
    except TimeoutError as exc:
        print(f"bench: {label}: {exc}", file=out, flush=True)
    first = first_arrivals(pipe, committed)
    relayed = asyncio.run(_relayed_at(pipe.kafka.bootstrap, topic, set(first)))
    total = sorted(first[k] - committed[k] for k in first)
    to_relay = sorted(relayed[k] - committed[k] for k in relayed)
    to_gateway = sorted(first[k] - relayed[k] for k in relayed)
    latency = OperationalLatency(
        committed=len(committed),
        delivered=len(first),
        p50_s=percentile(total, 0.5),
        p99_s=percentile(total, 0.99),
        to_relay_p50_s=percentile(to_relay, 0.5),
        to_relay_p99_s=percentile(to_relay, 0.99),
        to_gateway_p50_s=percentile(to_gateway, 0.5),
        to_gateway_p99_s=percentile(to_gateway, 0.99),
        found_on_topic=len(relayed),
    )
    print(
        f"bench: {label}: operational p50 {ms(latency.p50_s)}, p99 {ms(latency.p99_s)} "
        f"({latency.delivered}/{latency.committed} delivered); {latency.stages()} "
        f"({latency.found_on_topic} of {latency.delivered} found on {topic})",
        file=out,
        flush=True,
    )
    return latency
