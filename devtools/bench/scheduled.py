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

The fill and the operational probe are :mod:`devtools.bench.operational`'s, shared with
the ``campaign`` section (the same bound for a campaign due at once).
"""

from __future__ import annotations

import time
import uuid
from typing import TextIO

import psycopg

from devtools.bench.operational import (
    PACED_RATE_PER_S,
    campaign_arrivals,
    commit_operational,
    end_offsets,
    fill_campaign,
    operational_latency,
    paced_env,
)
from devtools.bench.support import Figure, ms, proc_status_mib, wait_until
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import BULK_INTENTS, INTENTS


def _log(out: TextIO, text: str) -> None:
    print(f"bench: scheduled: {text}", file=out, flush=True)


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
    with LocalPipeline(partitions=partitions, broker=broker, worker_env=paced_env()) as pipe:
        pipe.start_relay()
        worker = pipe.start_worker()
        topics = [pipe.kafka_settings().names.by_logical()[t] for t in (INTENTS, BULK_INTENTS)]
        time.sleep(5.0)  # idle: let the worker settle after start-up
        idle_mib = proc_status_mib(worker.pid, "VmRSS")
        offsets_before = end_offsets(pipe.kafka.bootstrap, topics)
        run = uuid.uuid4().hex[:8]
        started = time.monotonic()
        fill_campaign(pipe.dsn, run=run, jobs=jobs, due_s=due_s)
        fill_s = time.monotonic() - started
        due_at = started + due_s
        _log(out, f"{jobs:,} jobs filled in {fill_s:.1f} s, due {due_s:g} s after the start")
        scheduled = _count(pipe.dsn, "SELECT count(*) FROM outbox_jobs WHERE status = 'SCHEDULED'")
        wait_until(
            lambda: time.monotonic() >= due_at - 3.0, timeout_s=due_s + 5, what="just before due"
        )
        before_mib = proc_status_mib(worker.pid, "VmRSS")
        offsets_waiting = end_offsets(pipe.kafka.bootstrap, topics)
        _log(
            out,
            f"before due: worker RSS {before_mib:.0f} MiB (idle {idle_mib:.0f} MiB), "
            f"{offsets_waiting - offsets_before} records added to the intents topics, "
            f"{scheduled:,} SCHEDULED after the fill",
        )
        wait_until(lambda: time.monotonic() >= due_at, timeout_s=10, what="due")
        committed = commit_operational(pipe.dsn, run=run, seconds=drain_s)
        left = _count(pipe.dsn, "SELECT count(*) FROM outbox_jobs WHERE status = 'SCHEDULED'")
        released_per_s = (jobs - left) / drain_s
        latency = operational_latency(pipe, committed, topic=topics[0], out=out, label="scheduled")
        campaign = len(campaign_arrivals(pipe))
        _log(
            out,
            f"drain {drain_s:g} s: {campaign:,} campaign messages at the gateway "
            f"({campaign / drain_s:.0f}/s, paced at {PACED_RATE_PER_S:g}/s), "
            f"{released_per_s:,.0f} released/s",
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
            ms(latency.p99_s),
            comparison=f"campaign {campaign / drain_s:.0f}/s paced at {PACED_RATE_PER_S:g}/s; "
            f"{latency.delivered}/{latency.committed} delivered; {latency.stages()}",
            target="<= 1 s",
            passed=latency.passed,
        ),
        Figure(
            "scheduled",
            f"pre-fill of {jobs:,} scheduled jobs (one INSERT ... SELECT)",
            f"{fill_s:.1f} s",
            comparison=f"released {released_per_s:,.0f}/s when due",
        ),
    ]
