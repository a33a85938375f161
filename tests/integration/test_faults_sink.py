"""The state sink under faults, on real processes (issue 7, items 4 and 10).

The relay and the worker reach PostgreSQL directly; the sink reaches it through
a :class:`~devtools.simulator.tcp_proxy.TcpProxy` the tests cut, so only the write-back
loses the database while jobs keep flowing to the gateway.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from devtools.simulator.tcp_proxy import TcpProxy
from devtools.stack.devstack import ManagedProcess, find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from tests.integration.support import (
    Arrivals,
    count_rows,
    enqueue_conversations,
    wait_for_status,
)

pytestmark = pytest.mark.integration

OUTAGE_S = 10.0


class _Stack:
    def __init__(self, pipeline: LocalPipeline, proxy: TcpProxy, sink: ManagedProcess, port: int):
        self.pipeline = pipeline
        self.proxy = proxy
        self.sink = sink
        self.metrics_port = port


@pytest.fixture(scope="module")
def stack() -> Iterator[_Stack]:
    env = {"ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true"}
    with LocalPipeline(partitions=4, worker_env=env, with_sink=False) as pipeline:
        with TcpProxy(pipeline.postgres.port) as proxy:
            pipeline.start_relay()
            pipeline.start_worker()
            port = find_free_port()
            sink = pipeline.start_sink(
                env={
                    "ZAPSTREAM_DATABASE_URL": (
                        f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
                    ),
                    "ZAPSTREAM_SINK_METRICS_PORT": str(port),
                    "ZAPSTREAM_SINK_RETRY_MAX_S": "1",
                }
            )
            yield _Stack(pipeline, proxy, sink, port)


def _log(proc: ManagedProcess) -> str:
    return proc.log_path.read_text("utf-8", "replace")


def _metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_postgres_outage_is_waited_out_and_every_job_is_written_back(stack: _Stack) -> None:
    pipeline, sink = stack.pipeline, stack.sink
    arrivals = Arrivals(pipeline)
    run = uuid.uuid4().hex[:8]
    before = enqueue_conversations(pipeline.dsn, f"{run}a", messages=100, conversations=10)
    wait_for_status(pipeline.dsn, before, "ACCEPTED", 60)

    stack.proxy.cut()
    cut_at = time.monotonic()
    during = enqueue_conversations(pipeline.dsn, f"{run}b", messages=300, conversations=30)
    sink.wait_for_log(r"WARNING .*postgres unavailable", timeout_s=30)
    # The workers go on sending while the sink cannot write.
    arrivals.wait_for(during, 60)
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))  # the fault's length, not a wait
    assert sink.is_running, sink.log_tail()
    written_during = count_rows(
        pipeline.dsn,
        "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = ANY(%s) AND status = 'ACCEPTED'",
        (during,),
    )
    stack.proxy.restore()
    restored_at = time.monotonic()

    keys = before + during
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 60)
    caught_up_s = time.monotonic() - restored_at
    sink.wait_for_log(r"INFO .*postgres available again after", timeout_s=30)
    report = arrivals.wait_for(keys, 30)
    log = _log(sink)
    warnings = re.findall(r"WARNING .*postgres unavailable", log)
    recovered = re.findall(
        r"postgres available again after ([0-9.]+)s and (\d+) failed attempts", log
    )
    outage_s = _metric(
        stack.metrics_port, 'zapstream_sink_outage_seconds_total{dependency="postgres"}'
    )
    retries = _metric(stack.metrics_port, 'zapstream_sink_retries_total{dependency="postgres"}')
    print(
        f"sent {len(keys)}, accepted in outbox_jobs {len(keys)} "
        f"(written during the outage: {written_during}), caught up {caught_up_s:.1f}s after "
        f"PostgreSQL returned, outage logged {recovered}, metrics: outage {outage_s:.1f}s, "
        f"retries {retries:.0f}; gateway duplicates {len(report.duplicates)}, "
        f"order violations {len(report.order_violations)}, lost {len(report.missing)}"
    )
    assert sink.is_running
    assert written_during == 0, "the sink wrote through a cut proxy?"
    assert len(warnings) == 1, warnings
    assert len(recovered) == 1 and float(recovered[0][0]) >= OUTAGE_S * 0.5, recovered
    assert "Traceback" not in log
    assert outage_s >= OUTAGE_S * 0.5 and retries >= 3
    assert not report.duplicates and not report.order_violations and not report.missing
    assert count_rows(
        pipeline.dsn,
        "SELECT count(*) FROM outbox_job_events e JOIN outbox_jobs j ON j.id = e.job_id "
        "WHERE j.idempotency_key = ANY(%s) AND e.to_status = 'ACCEPTED'",
        (keys,),
    ) == len(keys)


def test_a_malformed_row_ends_invalid_with_its_reason(stack: _Stack) -> None:
    pipeline = stack.pipeline
    run = uuid.uuid4().hex[:8]
    bad, good = f"{run}-array", f"{run}-after"
    with psycopg.connect(pipeline.dsn) as conn:
        conn.execute(
            "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) "
            'VALUES (\'shop\', \'["not", "an", "object"]\', %s)',
            (bad,),
        )
        conn.execute(
            "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES "
            '(\'shop\', \'{"type":"text","to":"+5511987650001","text":"m [x:0]"}\', %s)',
            (good,),
        )
        conn.commit()
    wait_for_status(pipeline.dsn, [bad], "INVALID", 60)
    wait_for_status(pipeline.dsn, [good], "ACCEPTED", 60)
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        job = conn.execute(
            "SELECT id, last_error, state_version FROM outbox_jobs WHERE idempotency_key = %s",
            (bad,),
        ).fetchone()
        assert job is not None
        events = conn.execute(
            "SELECT from_status, to_status, actor, reason FROM outbox_job_events "
            "WHERE job_id = %s ORDER BY version",
            (job[0],),
        ).fetchall()
    print(f"INVALID job {job[0]}: {job[1]}; events {events}")
    assert "payload is a JSON list" in job[1]
    assert events == [("PENDING", "INVALID", "relay", job[1])]
    invalid = _metric(stack.metrics_port, 'zapstream_sink_rejected_rows_total{result="invalid"}')
    assert invalid >= 1


def test_the_sink_without_the_schema_exits_2_naming_db_migrate(stack: _Stack) -> None:
    pipeline = stack.pipeline
    empty = pipeline.postgres.create_database(f"empty_{uuid.uuid4().hex[:6]}")
    for name, dsn, expected in (
        ("sink-no-schema", empty, "run `zapstream db migrate`"),
        (
            "sink-no-database",
            pipeline.postgres.dsn("no_such_db"),
            "the database does not exist: check the database name in ZAPSTREAM_DATABASE_URL",
        ),
    ):
        proc = pipeline.process(
            name,
            ["sink"],
            {
                "ZAPSTREAM_DATABASE_URL": dsn,
                "ZAPSTREAM_SINK_METRICS_PORT": "0",
                "ZAPSTREAM_SINK_GROUP_ID": name,
            },
        )
        proc.start()
        code = proc.wait(timeout_s=60)
        log = _log(proc)
        lines = [line for line in log.splitlines() if expected in line]
        print(f"{name}: exit {code}: {lines}")
        assert code == 2, log
        assert len(lines) == 1 and lines[0].startswith("zapstream: state sink cannot start: "), log
        assert "Traceback" not in log
