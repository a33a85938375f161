"""The sink's pipeline gauges on a real PostgreSQL: jobs per status, oldest PENDING job.

The timer (:class:`~connectors.sink.pipeline_metrics.PipelineGauges`) reads the
real database; the values are read back from the Prometheus registry the
sink's ``/metrics`` serves.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import sql

from connectors.outbox.enqueue import enqueue
from connectors.sink import pipeline_metrics
from connectors.sink.pipeline_metrics import PipelineGauges
from connectors.sink.pipeline_sql import STATUSES
from devtools.stack.devstack import find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.settings import PostgresSettings
from tests.integration.support import wait_until

pytestmark = pytest.mark.integration

_BY_SINK = "state_version = state_version + 1"
"""What makes a test's status write the state sink's (migration 0009 refuses any other)."""


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def _oldest(instance: str, purpose: str) -> float | None:
    return _sample("zapstream_oldest_pending_seconds", instance=instance, purpose=purpose)


def _job(dsn: str, key: str, instance: str, *, purpose: str | None = None) -> int:
    with psycopg.connect(dsn) as conn:
        return enqueue(
            conn,
            instance_id=instance,
            to="+55 11 98765-4321",
            text="secret text",
            idempotency_key=key,
            purpose=purpose,
        )


def _sql(dsn: str, statement: str, *params: object) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, params or None)


def _db_counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM outbox_jobs GROUP BY status").fetchall()
    return {str(s): int(n) for s, n in rows}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_gauges_follow_the_database(outbox_db: str) -> None:
    old_a = _job(outbox_db, "pm-a1", "pm-shop-a", purpose="black-friday")
    _job(outbox_db, "pm-a2", "pm-shop-a", purpose="black-friday")
    _job(outbox_db, "pm-b1", "pm-shop-b")
    dead = _job(outbox_db, "pm-b2", "pm-shop-b")
    # States as the state sink writes them: one version up (migration 0009 refuses others).
    _sql(outbox_db, f"UPDATE outbox_jobs SET status = 'DEAD', {_BY_SINK} WHERE id = %s", dead)
    _sql(
        outbox_db,
        "UPDATE outbox_jobs SET created_at = now() - interval '20 minutes' WHERE id = %s",
        old_a,
    )
    clock = Clock()
    gauges = PipelineGauges(PostgresSettings(url=outbox_db), interval_s=60, clock=clock)
    await gauges.start()  # the first read happens at once
    try:
        await _until(lambda: gauges.reads >= 1)
        expected = _db_counts(outbox_db)
        for state in STATUSES:
            assert _sample("zapstream_jobs", state=state) == expected.get(state, 0), state
        assert _sample("zapstream_jobs", state="DEAD") >= 1
        assert _sample("zapstream_jobs", state="REVIEW") == 0

        a = _oldest("pm-shop-a", "black-friday")
        b = _oldest("pm-shop-b", "")
        assert a is not None and 1195 <= a <= 1260
        assert b is not None and 0 <= b < 60
        assert _sample("zapstream_oldest_pending_max_seconds") == pytest.approx(a)

        # Between reads the ages grow with the clock.
        clock.now += 30
        grown = _oldest("pm-shop-a", "black-friday")
        assert grown == pytest.approx(a + 30)

        # Nothing pending any more for shop-a: its series goes; shop-b's stays.
        _sql(
            outbox_db,
            f"UPDATE outbox_jobs SET status = 'ACCEPTED', {_BY_SINK} "
            "WHERE instance_id = 'pm-shop-a'",
        )
        await gauges.refresh()
        assert _oldest("pm-shop-a", "black-friday") is None
        b = _oldest("pm-shop-b", "")
        assert b is not None and b < 60
        assert _sample("zapstream_oldest_pending_max_seconds") == pytest.approx(b)
        assert _sample("zapstream_jobs", state="ACCEPTED") == _db_counts(outbox_db)["ACCEPTED"]
        assert _sample("zapstream_pipeline_metrics_last_success_timestamp_seconds") > 0
    finally:
        await gauges.stop()


async def test_an_unreachable_database_is_logged_once_and_never_stops_the_timer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = find_free_port()
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    before = _sample("zapstream_pipeline_metrics_failures_total") or 0.0
    gauges = PipelineGauges(PostgresSettings(url=dsn), interval_s=0.05, connect_timeout_s=1)
    with caplog.at_level(logging.INFO, logger=pipeline_metrics.__name__):
        await gauges.start()
        await _until(
            lambda: (_sample("zapstream_pipeline_metrics_failures_total") or 0) >= before + 3
        )
        await gauges.stop()
        await gauges.stop()  # idempotent
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "pipeline gauges (PostgreSQL) unavailable" in warnings[0].getMessage()
    assert gauges.reads == 0


async def test_the_queries_use_indexes(outbox_db: str) -> None:
    # With sequential scans priced out, a plan without an index would still be a Seq Scan.
    from connectors.sink.pipeline_sql import _COUNTS, _PENDING

    async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as conn:
        await conn.execute("SET enable_seqscan = off")
        for query in (_COUNTS, _PENDING):
            composed = sql.SQL(query) if isinstance(query, str) else query
            cur = await conn.execute(sql.SQL("EXPLAIN ") + composed)
            plan = "\n".join(str(r[0]) for r in await cur.fetchall())
            assert "Seq Scan" not in plan, plan
            assert "outbox_jobs_" in plan, plan


async def _until(predicate: object, timeout_s: float = 10.0) -> None:
    assert callable(predicate)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


# --- the real `zapstream sink` process -------------------------------------------------------


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def test_the_sink_process_serves_the_gauges_and_outlives_a_database_outage(
    tmp_path: Path,
) -> None:
    with LocalPipeline(tmp_path, partitions=2, with_sink=False, proxied=True) as pipeline:
        port = find_free_port()
        sink = pipeline.start_sink(
            env={
                "ZAPSTREAM_SINK_METRICS_PORT": str(port),
                "ZAPSTREAM_SINK_PIPELINE_METRICS_INTERVAL_S": "0.3",
            }
        )
        dsn = pipeline.dsn
        for n in range(3):
            _job(dsn, f"proc-{n}", "proc-shop", purpose="launch")
        pending = ("zapstream_jobs", (("state", "PENDING"),))
        oldest = (
            "zapstream_oldest_pending_seconds",
            (("instance", "proc-shop"), ("purpose", "launch")),
        )
        wait_until(lambda: _scrape(port).get(pending) == 3, 20, "3 PENDING jobs in the gauge")
        assert _scrape(port)[("zapstream_jobs", (("state", "REVIEW"),))] == 0
        assert oldest in _scrape(port)

        proxy = pipeline.pg_proxy
        assert proxy is not None
        proxy.cut()
        failures = ("zapstream_pipeline_metrics_failures_total", ())
        wait_until(lambda: _scrape(port).get(failures, 0) >= 3, 30, "failed reads while cut")
        assert sink.is_running
        proxy.restore()

        _sql(
            dsn,
            f"UPDATE outbox_jobs SET status = 'ACCEPTED', {_BY_SINK} "
            "WHERE instance_id = 'proc-shop'",
        )
        wait_until(lambda: oldest not in _scrape(port), 30, "the series to go")
        assert _scrape(port).get(pending) == 0
        log = sink.log_tail(400)
        assert sink.is_running
    outage = [
        line for line in log.splitlines() if "pipeline gauges (PostgreSQL) unavailable" in line
    ]
    assert len(outage) == 1, log
    assert "pipeline gauges (PostgreSQL) available again" in log
