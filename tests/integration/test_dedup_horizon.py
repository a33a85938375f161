"""The dedup horizon on real processes: settled jobs leave the worker's table, and a
redelivery after that (an offset rewind, a replay) is recognised through PostgreSQL
and never sent again, also after a restart that recovers the table from its changelog.

The horizon is a few seconds here (``ZAPSTREAM_WORKER_DEDUP_HORIZON_S``); the jobs'
own intents are read back from ``zapstream.intents`` (the pipeline's, under its topic
prefix) and re-published byte for byte to the same partition with the same key: what a
rewind would deliver.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from pydantic import SecretStr

from connectors.outbox.enqueue import enqueue
from connectors.sink.job_history import PostgresJobHistory
from devtools.stack.delivery_audit import audit
from devtools.stack.devstack import ManagedProcess, find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.job_history import HistoryUnavailable
from streams.kernel.settings import PostgresSettings
from tests.integration.support import (
    Arrivals,
    enqueue_conversations,
    intents_of,
    republish,
    wait_for_status,
    wait_until,
)

pytestmark = pytest.mark.integration

JOBS = 200
WORKER_ENV = {
    # For DEVSTACK_BROKER=tansu: Tansu's ListOffsets is wrong after multi-record batches and
    # recovery must be exact here (Apache Kafka needs none of it).
    "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true",
    "ZAPSTREAM_WORKER_DEDUP_HORIZON_S": "4",
    "ZAPSTREAM_WORKER_DEDUP_MARGIN_S": "1",
    "ZAPSTREAM_WORKER_DEDUP_SCAN_INTERVAL_S": "0.5",
    "ZAPSTREAM_WORKER_DEDUP_LOOKUP_RETRY_S": "1",
    "ZAPSTREAM_WORKER_DEDUP_SINK_MARGIN_S": "0.5",
    "ZAPSTREAM_WORKER_DEDUP_SINK_CHECK_S": "0.5",
    "ZAPSTREAM_WORKER_COMMIT_INTERVAL_S": "0.5",
}


class Worker:
    """A worker process and its ``/metrics``."""

    def __init__(self, pipeline: LocalPipeline, name: str) -> None:
        self.port = find_free_port()
        self.process: ManagedProcess = pipeline.start_worker(
            name, env={"ZAPSTREAM_WORKER_WEB_PORT": str(self.port)}
        )

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4, worker_env=WORKER_ENV) as p:
        p.start_relay()
        yield p


def test_a_redelivery_after_the_horizon_is_not_sent_again(pipeline: LocalPipeline) -> None:
    worker = Worker(pipeline, "worker")
    arrivals = Arrivals(pipeline)
    keys = enqueue_conversations(
        pipeline.dsn, uuid.uuid4().hex[:8], messages=JOBS, conversations=20
    )
    arrivals.wait_for(keys, timeout_s=120)
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)

    wait_until(
        lambda: (
            worker.metric("zapstream_jobs_forgotten_total") >= JOBS
            and worker.metric("zapstream_jobs_table_size") == 0
        ),
        60,
        f"the worker forgetting {JOBS} settled jobs",
    )
    records = intents_of(pipeline, set(keys))
    assert len(records) == JOBS

    sent_before = len(arrivals.refresh())
    asyncio.run(republish(pipeline, records))
    wait_until(
        lambda: worker.metric("zapstream_late_redeliveries_total", result="duplicate") >= JOBS,
        60,
        f"{JOBS} late redeliveries recognised",
    )
    late = worker.metric("zapstream_late_redeliveries_total", result="duplicate")
    sent_after = len(arrivals.refresh())
    report = audit(keys, arrivals.items)
    print(
        f"\ndedup horizon: sent {JOBS}, accepted {report.accepted_unique}, forgotten "
        f"{worker.metric('zapstream_jobs_forgotten_total'):.0f}, redelivered {len(records)}, "
        f"recognised late {late:.0f}, duplicates {report.duplicate_count}, "
        f"arrivals {sent_before} -> {sent_after}"
    )
    assert report.duplicate_count == 0, list(report.duplicates)[:5]
    assert sent_after == sent_before
    assert late == JOBS

    # Restarted after the horizon: the table recovers from zapstream.state without the
    # forgotten jobs (tombstones honoured). Had recovery brought their ACCEPTED states
    # back, the replay below would be dropped as ordinary redeliveries of settled jobs,
    # never reaching the late-redelivery check this new process counts.
    assert worker.process.terminate(timeout_s=60) == 0, worker.process.log_tail()
    worker = Worker(pipeline, "worker")
    asyncio.run(republish(pipeline, records))
    wait_until(
        lambda: worker.metric("zapstream_late_redeliveries_total", result="duplicate") >= JOBS,
        60,
        f"{JOBS} late redeliveries recognised after the restart",
    )
    report = audit(keys, arrivals.refresh())
    late = worker.metric("zapstream_late_redeliveries_total", result="duplicate")
    print(
        f"after restart: table size {worker.metric('zapstream_jobs_table_size'):.0f}, "
        f"recognised late {late:.0f}, "
        f"duplicates {report.duplicate_count}"
    )
    assert report.duplicate_count == 0, list(report.duplicates)[:5]
    assert pipeline.sink is not None
    sink_log = pipeline.sink.log_path.read_text(errors="replace")
    assert "does not decode" not in sink_log, "the state sink took a tombstone for poison"
    worker.process.terminate(timeout_s=60)


def test_jobs_the_sink_has_not_written_are_never_forgotten(pipeline: LocalPipeline) -> None:
    """Forgetting a job PostgreSQL does not know yet would leave no record that it was sent."""
    assert pipeline.sink is not None
    assert pipeline.sink.terminate(timeout_s=60) == 0, pipeline.sink.log_tail()
    worker = Worker(pipeline, "worker-sink-down")
    arrivals = Arrivals(pipeline)
    forgotten_before = worker.metric("zapstream_jobs_forgotten_total")
    keys = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=50, conversations=5)
    arrivals.wait_for(keys, timeout_s=120)
    # Without the sink, the newest state PostgreSQL is known to hold ages on the partitions
    # that got the 50 jobs (the others stay current: the sink has all of them). Once it
    # is past horizon + margin + a few scans, an unguarded horizon would have forgotten them.
    wait_until(
        lambda: (
            max(
                worker.metric("zapstream_dedup_sink_durable_age_seconds", partition=str(p))
                for p in range(4)
            )
            > 8
        ),
        60,
        "the sink's known progress to fall behind the horizon",
    )
    table = worker.metric("zapstream_jobs_table_size")
    forgotten = worker.metric("zapstream_jobs_forgotten_total") - forgotten_before
    print(f"\nsink down: table {table:.0f}, forgotten {forgotten:.0f} of 50 sent")
    assert forgotten == 0
    assert table >= 50

    pipeline.start_sink()
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
    wait_until(
        lambda: worker.metric("zapstream_jobs_forgotten_total") - forgotten_before >= 50,
        60,
        "the 50 jobs forgotten once the sink wrote them",
    )
    assert worker.process.terminate(timeout_s=60) == 0, worker.process.log_tail()


async def test_postgres_job_history_answers_and_classifies_outages(outbox_db: str) -> None:
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        job_id = enqueue(
            conn, instance_id="i", to="5511987654321", text="hi", idempotency_key="history-1"
        )
    history = PostgresJobHistory(PostgresSettings(url=SecretStr(outbox_db)))
    try:
        assert await history.status_of(job_id) == "PENDING"
        assert await history.status_of(job_id + 1_000_000) is None
        with psycopg.connect(outbox_db, autocommit=True) as conn:
            conn.execute(
                "UPDATE outbox_jobs SET status = 'ACCEPTED', state_version = 3, attempts = 1, "
                "gateway_job_id = 'g-9' WHERE id = %s",
                (job_id,),
            )
            for version, (before, after) in enumerate(
                [
                    ("PENDING", "ATTEMPTING"),
                    ("ATTEMPTING", "RETRY_WAIT"),
                    ("RETRY_WAIT", "ATTEMPTING"),
                ]
            ):
                conn.execute(
                    "INSERT INTO outbox_job_events (job_id, from_status, to_status, version, actor)"
                    " VALUES (%s, %s, %s, %s, 'worker')",
                    (job_id, before, after, version + 1),
                )
        state = await history.state_of(job_id)
        assert state is not None
        assert (state.status, state.version, state.attempts, state.gateway_job_id) == (
            "ACCEPTED",
            3,
            1,
            "g-9",
        )
        assert state.attempt_seq == 2  # two moves into ATTEMPTING: attempts 1 and 2
        assert await history.state_of(job_id + 1_000_000) is None
    finally:
        await history.stop()

    away = PostgresJobHistory(
        PostgresSettings(url=SecretStr(f"postgresql://postgres@127.0.0.1:{find_free_port()}/x")),
        timeout_s=2,
    )
    with pytest.raises(HistoryUnavailable) as refused:
        await away.status_of(job_id)
    assert not refused.value.permanent

    no_db = outbox_db.rsplit("/", 1)[0] + "/no_such_database"
    missing = PostgresJobHistory(PostgresSettings(url=SecretStr(no_db)), timeout_s=2)
    with pytest.raises(HistoryUnavailable) as wrong:
        await missing.status_of(job_id)
    assert wrong.value.permanent, wrong.value.problem
