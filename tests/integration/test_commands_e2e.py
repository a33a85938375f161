"""Cancel and reprocess through the CDC path, on real processes (issue 3, acceptance 4 and 7;
issue 19: the outbox article's reprocess UPDATE, end to end)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from connectors.outbox.commands import cancel
from connectors.outbox.enqueue import enqueue
from connectors.outbox.roles import apply_roles
from devtools.stack.local_pipeline import LocalPipeline
from tests.integration import article_sql
from tests.integration.support import Arrivals, wait_for_status

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    env = {
        "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true",
        "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[0.5]",
        "ZAPSTREAM_WORKER_RETRY_SCAN_INTERVAL_S": "0.2",
    }
    with LocalPipeline(partitions=4, worker_env=env) as p:
        p.start_relay()
        p.start_worker()
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL)")
        yield p


def _cli(pipeline: LocalPipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", "jobs", *args],
        env={**os.environ, **pipeline.env()},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_application_cancel_with_its_business_change_stops_a_queued_message(
    pipeline: LocalPipeline,
) -> None:
    run = uuid.uuid4().hex[:8]
    first, doomed = f"{run}-first", f"{run}-doomed"
    pipeline.sim_config(latency_ms=1500)
    try:
        with psycopg.connect(pipeline.dsn) as conn:
            conn.execute("INSERT INTO orders VALUES (1, 'placed')")
            for key in (first, doomed):
                enqueue(
                    conn,
                    instance_id="shop",
                    to="5511900000201",
                    text=f"m [{key}:0]",
                    idempotency_key=key,
                )
            conn.commit()
            # The order is cancelled; the cancel commits with that business change.
            conn.execute("UPDATE orders SET state = 'cancelled' WHERE id = 1")
            cancel(conn, doomed, "order cancelled by the customer")
            conn.commit()
        wait_for_status(pipeline.dsn, [doomed], "CANCELLED", 60)
        wait_for_status(pipeline.dsn, [first], "ACCEPTED", 60)
    finally:
        pipeline.sim_config(latency_ms=0)
    texts = [m["text"] for m in Arrivals(pipeline).refresh()]
    assert f"m [{first}:0]" in texts
    assert f"m [{doomed}:0]" not in texts
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        actor, reason = conn.execute(
            "SELECT e.actor, e.reason FROM outbox_job_events e "
            "JOIN outbox_jobs j ON j.id = e.job_id "
            "WHERE j.idempotency_key = %s AND e.to_status = 'CANCELLED'",
            (doomed,),
        ).fetchone() or ("", "")
    assert actor == "application" and "order cancelled by the customer" in reason


def test_cancel_after_acceptance_goes_through_the_gateway_and_is_confirmed(
    pipeline: LocalPipeline,
) -> None:
    key = f"{uuid.uuid4().hex[:8]}-accepted"
    with psycopg.connect(pipeline.dsn) as conn:
        job_id = enqueue(
            conn, instance_id="shop", to="5511900000202", text=f"m [{key}:0]", idempotency_key=key
        )
    wait_for_status(pipeline.dsn, [key], "ACCEPTED", 60)
    result = _cli(
        pipeline,
        "cancel",
        str(job_id),
        "--reason",
        "sent by mistake",
        "--by",
        "ops:ana",
        "--wait",
        "60",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CANCELLED" in result.stdout
    wait_for_status(pipeline.dsn, [key], "CANCELLED", 30)
    listing = httpx.get(
        f"{pipeline.sim_url}/v1/instances/shop/send-queue",
        params={"page_size": 1000},
        headers={"X-API-Key": "dev-stackzap-key"},
    ).json()
    mine = [j for j in listing["items"] if j["text"] == f"m [{key}:0]"]
    assert [j["status"] for j in mine] == ["cancelled"], "the gateway confirmed the cancel"


def test_cancel_refused_by_the_gateway_is_reported_and_changes_nothing(
    pipeline: LocalPipeline,
) -> None:
    key = f"{uuid.uuid4().hex[:8]}-sent"
    with psycopg.connect(pipeline.dsn) as conn:
        job_id = enqueue(
            conn, instance_id="shop", to="5511900000203", text=f"m [{key}:0]", idempotency_key=key
        )
    wait_for_status(pipeline.dsn, [key], "ACCEPTED", 60)
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        (gateway_id,) = conn.execute(
            "SELECT gateway_job_id FROM outbox_jobs WHERE id = %s", (job_id,)
        ).fetchone() or (None,)
    httpx.post(
        f"{pipeline.sim_url}/_sim/jobs/status", json={"status": "sent", "ids": [gateway_id]}
    ).raise_for_status()
    result = _cli(
        pipeline, "cancel", str(job_id), "--reason", "too late?", "--by", "ops:bo", "--wait", "60"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "already sent" in result.stdout
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        status = conn.execute("SELECT status FROM outbox_jobs WHERE id = %s", (job_id,)).fetchone()
    assert status == ("ACCEPTED",)


def test_reprocessing_a_dead_job_sends_it_once_more_and_records_who_and_why(
    pipeline: LocalPipeline,
) -> None:
    key = f"{uuid.uuid4().hex[:8]}-dead"
    text = f"m [{key}:0]"
    pipeline.sim_config(error_rate=1.0)
    try:
        with psycopg.connect(pipeline.dsn) as conn:
            job_id = enqueue(
                conn,
                instance_id="shop",
                to="5511900000204",
                text=text,
                idempotency_key=key,
                max_attempts=2,
            )
        wait_for_status(pipeline.dsn, [key], "DEAD", 60)
    finally:
        pipeline.sim_config(error_rate=0.0)
    refused = _cli(pipeline, "reprocess", str(job_id), "--by", "ops:cy")
    assert refused.returncode == 2 and "--reason" in refused.stderr
    result = _cli(
        pipeline,
        "reprocess",
        str(job_id),
        "--reason",
        "gateway fixed",
        "--by",
        "ops:cy",
        "--wait",
        "60",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ACCEPTED" in result.stdout
    wait_for_status(pipeline.dsn, [key], "ACCEPTED", 30)
    sent = [m for m in Arrivals(pipeline).refresh() if m["text"] == text]
    assert len(sent) == 1 and str(sent[0]["reference"]).startswith(f"{job_id}-3-")
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT e.actor, e.reason FROM outbox_job_events e "
            "WHERE e.job_id = %s AND e.actor = 'ops:cy'",
            (job_id,),
        ).fetchall()
        keys = conn.execute(
            "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = %s", (key,)
        ).fetchone()
    assert rows and "gateway fixed" in rows[0][1]
    assert keys == (1,)


def test_the_articles_reprocess_update_sends_a_dead_job_once_more_audited_as_the_role(
    pipeline: LocalPipeline,
) -> None:
    # An application's login role, with zapstream_app's grants only.
    apply_roles(pipeline.dsn)
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE shop_backend LOGIN IN ROLE zapstream_app")
    app = make_conninfo(pipeline.dsn, user="shop_backend")
    key = f"{uuid.uuid4().hex[:8]}-article-dead"
    text = f"m [{key}:0]"
    pipeline.sim_config(error_rate=1.0)
    try:
        with psycopg.connect(app) as conn:  # the article's enqueue, verbatim
            payload = json.dumps({"type": "text", "to": "5511900000205", "text": text})
            conn.execute(article_sql.INSERT.encode(), ("shop", payload, key))
        wait_for_status(pipeline.dsn, [key], "DEAD", 60)
    finally:
        pipeline.sim_config(error_rate=0.0)
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        (job_id,) = conn.execute(
            "SELECT id FROM outbox_jobs WHERE idempotency_key = %s", (key,)
        ).fetchone() or (0,)
    with psycopg.connect(app) as conn:  # the FAQ's reprocess, with the documented reason
        conn.execute("SET LOCAL zapstream.reason = 'gateway fixed'")
        assert conn.execute(article_sql.REPROCESS.encode(), (job_id,)).rowcount == 1
    wait_for_status(pipeline.dsn, [key], "ACCEPTED", 60)
    sent = [m for m in Arrivals(pipeline).refresh() if m["text"] == text]
    print(f"job {job_id}: reprocessed by the article's UPDATE, sent {len(sent)} time(s)")
    assert len(sent) == 1
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        answers = conn.execute(
            "SELECT e.actor, e.reason, e.outcome FROM outbox_job_events e "
            "JOIN outbox_commands c ON c.id = e.command_id WHERE e.job_id = %s",
            (job_id,),
        ).fetchall()
    assert answers == [("shop_backend", "reprocess requested: gateway fixed", "reprocessed")]


def test_jobs_list_masks_recipients(pipeline: LocalPipeline) -> None:
    result = _cli(pipeline, "list", "--instance", "shop", "--limit", "100")
    assert result.returncode == 0, result.stderr
    assert "5511900000201" not in result.stdout and "shop" in result.stdout
