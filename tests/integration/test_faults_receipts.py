"""Issue 7 acceptance: receipts for the current attempt only, fresh signatures, each event
once; a listing in another shape reconciles when configured and never makes jobs
UNCERTAIN when it does not parse. Real processes: PostgreSQL, Kafka, simulator, relay,
worker, sink and webhook (``LocalPipeline``).

Each receipt check ends with a receipt about the *same* job's current attempt
(``delivered``): it is applied after everything emitted before it (one conversation,
one partition, one lane; one job, one state partition), so the event history read
after it shows whether the receipts before it changed anything.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from connectors.outbox.commands import request_reprocess
from connectors.outbox.enqueue import enqueue
from connectors.webhook.signature import sign
from devtools.stack.devstack import ManagedProcess, find_free_port
from devtools.stack.local_pipeline import WEBHOOK_SECRET, LocalPipeline
from tests.integration.support import (
    Arrivals,
    count_rows,
    enqueue_conversations,
    wait_for_status,
    wait_until,
)

pytestmark = pytest.mark.integration

OTHER_SHAPE = {"items": "jobs", "reference": "ref"}
WORKER_ENV = {
    "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[3]",
    "ZAPSTREAM_WORKER_RETRY_JITTER": "0",
    "ZAPSTREAM_WORKER_RETRY_SCAN_INTERVAL_S": "0.2",
    "ZAPSTREAM_WORKER_COMMIT_INTERVAL_S": "0.5",
}
SIM_DEFAULTS: dict[str, Any] = {
    "callback_statuses": [],
    "drop_response_rate": 0.0,
    "listing_fields": {},
    "fault_scope": "send",
}


class Worker:
    """A worker process and the port of its ``/metrics``."""

    def __init__(self, pipeline: LocalPipeline, name: str, env: dict[str, str]) -> None:
        self.port = find_free_port()
        self.process: ManagedProcess = pipeline.start_worker(
            name, env={**env, "ZAPSTREAM_WORKER_WEB_PORT": str(self.port)}
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

    def log_count(self, pattern: str, since: int = 0) -> int:
        path = self.process.log_path
        text = path.read_bytes()[since:].decode("utf-8", errors="replace")
        return len(re.findall(pattern, text))


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4) as p:
        p.start_relay()
        url = p.start_webhook()
        p.sim_config(**SIM_DEFAULTS)
        p.webhook = url  # type: ignore[attr-defined]
        yield p


@pytest.fixture(scope="module")
def worker(pipeline: LocalPipeline) -> Iterator[Worker]:
    """A worker with the default listing field names."""
    w = Worker(pipeline, "worker", WORKER_ENV)
    yield w
    w.process.stop()


@pytest.fixture(autouse=True)
def sim_defaults(pipeline: LocalPipeline) -> Iterator[None]:
    pipeline.sim_config(**SIM_DEFAULTS)
    yield
    pipeline.sim_config(**SIM_DEFAULTS)


# --- helpers -------------------------------------------------------------------------


def _row(dsn: str, job_id: int) -> tuple[str, str | None]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, gateway_job_id FROM outbox_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return str(row[0]), row[1]


def _events(dsn: str, job_id: int) -> list[tuple[int, str, str, str | None]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT version, to_status, actor, reason FROM outbox_job_events "
            "WHERE job_id = %s ORDER BY version",
            (job_id,),
        ).fetchall()
    return [(int(v), str(s), str(a), r) for v, s, a, r in rows]


def _emit(pipeline: LocalPipeline, sim_id: str, status: str, **extra: object) -> str:
    response = httpx.post(
        f"{pipeline.sim_url}/_sim/callbacks/emit",
        json={"id": sim_id, "status": status, **extra},
        timeout=10,
    )
    response.raise_for_status()
    return response.headers.get("X-Sim-Callback-Status", "")


def _send_one(pipeline: LocalPipeline, key: str, to: str) -> int:
    with psycopg.connect(pipeline.dsn) as conn:
        job_id = enqueue(conn, instance_id="shop", to=to, text=f"r [{key}]", idempotency_key=key)
    wait_for_status(pipeline.dsn, [key], "ACCEPTED", 60)
    return job_id


def _wait_row(pipeline: LocalPipeline, job_id: int, status: str, what: str) -> None:
    wait_until(lambda: _row(pipeline.dsn, job_id)[0] == status, 60, what)


def _sim_outcomes(pipeline: LocalPipeline) -> dict[str, int]:
    stats = httpx.get(f"{pipeline.sim_url}/_sim/stats", timeout=10).json()
    listings = {f"listed_{k}": v for k, v in stats["listings"].items()}
    return {**stats["by_outcome"], **listings}


# --- receipts ------------------------------------------------------------------------


def test_replayed_failed_receipt_of_an_earlier_attempt_changes_nothing(
    pipeline: LocalPipeline, worker: Worker
) -> None:
    key = f"{uuid.uuid4().hex[:8]}-replay"
    job_id = _send_one(pipeline, key, "5511900000701")
    _, g1 = _row(pipeline.dsn, job_id)
    assert g1
    # Attempt 1 fails at the gateway (a current receipt: applied), the operator reprocesses.
    assert _emit(pipeline, g1, "failed", event_id=f"{key}-e1") == "202"
    _wait_row(pipeline, job_id, "FAILED", "the failed receipt")
    with psycopg.connect(pipeline.dsn) as conn:
        request_reprocess(conn, job_id, "gateway says it is fixed", "ops:test")
    wait_until(
        lambda: _row(pipeline.dsn, job_id)[0] == "ACCEPTED" and _row(pipeline.dsn, job_id)[1] != g1,
        60,
        "attempt 2 accepted with a new gateway id",
    )
    status, g2 = _row(pipeline.dsn, job_id)
    before = _events(pipeline.dsn, job_id)
    ignored_before = worker.metric("zapstream_receipts_ignored_total")
    log_offset = worker.process.log_offset()

    # The old "failed" callback of attempt 1, replayed: with its own event id and with a
    # new one (only the attempt check can stop that one), signed now, so it passes the
    # intake and reaches the worker.
    assert _emit(pipeline, g1, "failed", event_id=f"{key}-e1") == "202"
    assert _emit(pipeline, g1, "failed", event_id=f"{key}-replayed") == "202"
    assert _emit(pipeline, g1, "read", event_id=f"{key}-old-read") == "202"
    # The marker: attempt 2's own receipt, applied after the three above.
    sim2 = g2 or ""
    assert _emit(pipeline, sim2, "delivered", event_id=f"{key}-marker") == "202"
    _wait_row(pipeline, job_id, "DELIVERED", "the current attempt's receipt")

    after = _events(pipeline.dsn, job_id)
    status_after, gateway_after = _row(pipeline.dsn, job_id)
    ignored = worker.metric("zapstream_receipts_ignored_total") - ignored_before
    log_lines = worker.log_count(r"receipt '\w+' ignored: ", since=log_offset)
    print(
        f"replay: job {job_id} attempt 2 {status} {g2}; replayed receipts 3, ignored {ignored:g}, "
        f"log lines {log_lines}; events before {len(before)}, after {len(after)} "
        f"(+{[e[1] for e in after[len(before) :]]}); gateway id after {gateway_after}"
    )
    assert after[: len(before)] == before
    assert [e[1] for e in after[len(before) :]] == ["DELIVERED"], "a replay changed the job"
    assert (status_after, gateway_after) == ("DELIVERED", g2)
    # One line per reason a minute (a flood of replays is one line with a count): the
    # event already applied, and the two about attempt 1.
    assert ignored == 3 and log_lines == 2
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        references = conn.execute(
            "SELECT count(*) FROM outbox_job_events "
            "WHERE job_id = %s AND to_status = 'FAILED' AND actor LIKE 'gateway:%%'",
            (job_id,),
        ).fetchone()
    assert references == (1,), "only attempt 1's own failed receipt failed the job"


def test_a_callback_older_than_the_replay_window_gets_401_and_a_duplicated_event_changes_nothing(
    pipeline: LocalPipeline, worker: Worker
) -> None:
    key = f"{uuid.uuid4().hex[:8]}-stale"
    job_id = _send_one(pipeline, key, "5511900000702")
    _, gid = _row(pipeline.dsn, job_id)
    assert gid
    now = int(time.time())
    # Signed 10 minutes ago (window 300 s), and 2 minutes in the future (skew 30 s).
    assert _emit(pipeline, gid, "read", signed_at=now - 600) == "401"
    assert _emit(pipeline, gid, "read", signed_at=now + 120) == "401"
    # The same, posted directly: a correct HMAC over an old timestamp.
    body = orjson.dumps(
        {"event_id": f"{key}-old", "id": gid, "status": "read", "reference": f"{job_id}-1"}
    )
    old = httpx.post(
        f"{pipeline.webhook}/v1/webhooks/stackzap",  # type: ignore[attr-defined]
        content=body,
        headers={
            "X-Zap-Signature": sign(WEBHOOK_SECRET, body, gateway="stackzap", timestamp=now - 301)
        },
        timeout=10,
    )
    assert old.status_code == 401

    # Duplicated event id: an unknown label moves the job to REVIEW, "sent" back to
    # ACCEPTED; the first callback again (same event id) would move it to REVIEW again.
    assert _emit(pipeline, gid, "exploded", event_id=f"{key}-e1") == "202"
    _wait_row(pipeline, job_id, "REVIEW", "the unknown label")
    assert _emit(pipeline, gid, "sent", event_id=f"{key}-e2") == "202"
    _wait_row(pipeline, job_id, "ACCEPTED", "the sent receipt")
    assert _emit(pipeline, gid, "exploded", event_id=f"{key}-e1") == "202"
    assert _emit(pipeline, gid, "delivered", event_id=f"{key}-marker") == "202"
    _wait_row(pipeline, job_id, "DELIVERED", "the marker receipt")

    moves = [e[1] for e in _events(pipeline.dsn, job_id)]
    print(f"stale/duplicate: job {job_id} events {moves}")
    assert moves == ["ATTEMPTING", "ACCEPTED", "REVIEW", "ACCEPTED", "DELIVERED"]
    assert "READ" not in moves


# --- the listing -----------------------------------------------------------------------


def test_a_listing_that_does_not_parse_postpones_reconciliation_never_uncertain(
    pipeline: LocalPipeline, worker: Worker
) -> None:
    """A gateway answering a listing no parser can read: every dropped response waits
    (logged once, counted), none UNCERTAIN within ``ZAPSTREAM_WORKER_RECONCILE_MAX_WAIT_S``
    (600 s here), none sent twice; once the listing parses again they are adopted. (The
    seed's ``{"jobs": [...]}`` with ``ref`` parses with the default names now.)"""
    run = uuid.uuid4().hex[:8]
    instance = f"shape-{run}"
    log_offset = worker.process.log_offset()
    before = worker.metric("zapstream_reconcile_listing_unreadable_total", instance=instance)
    pipeline.sim_config(listing_shape="unknown", drop_response_rate=1.0)
    recipients = [f"55119000007{n + 10:02d}" for n in range(6)]
    keys = [f"{run}:{instance}:{to}:0" for to in recipients]  # one per conversation
    with psycopg.connect(pipeline.dsn) as conn:
        for to, key in zip(recipients, keys, strict=True):
            enqueue(conn, instance_id=instance, to=to, text=f"w [{key}]", idempotency_key=key)
    waiting_sql = (
        "SELECT count(DISTINCT j.id) FROM outbox_jobs j JOIN outbox_job_events e "
        "ON e.job_id = j.id WHERE j.idempotency_key = ANY(%s) "
        "AND e.reason LIKE '%%listing unreadable%%'"
    )
    wait_until(
        lambda: count_rows(pipeline.dsn, waiting_sql, (keys,)) == len(keys),
        90,
        "every job to wait on the unreadable listing",
    )
    wait_until(
        lambda: (
            worker.metric("zapstream_reconcile_listing_unreadable_total", instance=instance)
            - before
            >= len(keys)
        ),
        30,
        "the unreadable-listing metric",
    )
    uncertain_sql = (
        "SELECT count(*) FROM outbox_job_events e JOIN outbox_jobs j ON j.id = e.job_id "
        "WHERE j.idempotency_key = ANY(%s) AND e.to_status = 'UNCERTAIN'"
    )
    unreadable = (
        worker.metric("zapstream_reconcile_listing_unreadable_total", instance=instance) - before
    )
    warnings = worker.log_count(
        rf"listing of instance {instance} is unreadable: .*ZAPSTREAM_STACKZAP_LISTING_FIELDS",
        since=log_offset,
    )
    arrivals = Arrivals(pipeline)
    sent_while_unreadable = sum(1 for m in arrivals.refresh() if m["instance"] == instance)
    uncertain = count_rows(pipeline.dsn, uncertain_sql, (keys,))
    assert uncertain == 0
    assert warnings == 1, "logged once per instance per outage"
    assert sent_while_unreadable == len(keys), "a job was sent again before it was reconciled"

    # The gateway's listing is readable again: the waiting jobs are adopted, not resent.
    pipeline.sim_config(listing_shape="items", drop_response_rate=0.0)
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 60)
    report = arrivals.wait_for(keys, timeout_s=10)
    recovered = worker.log_count(rf"listing of instance {instance} parses again", since=log_offset)
    print(
        f"unreadable listing: sent {len(keys)}, responses dropped {len(keys)}, "
        f"unreadable reconciliations {unreadable:g}, warning lines {warnings}, "
        f"UNCERTAIN {count_rows(pipeline.dsn, uncertain_sql, (keys,))}, "
        f"accepted {report.accepted_unique}, duplicates {report.duplicate_count}, "
        f"order violations {len(report.order_violations)}, lost {len(report.missing)}, "
        f"recovery lines {recovered}"
    )
    assert report.duplicate_count == 0 and not report.missing and report.order_violations == ()
    assert count_rows(pipeline.dsn, uncertain_sql, (keys,)) == 0
    assert recovered == 1


def test_a_listing_in_another_shape_reconciles_dropped_responses_when_configured(
    pipeline: LocalPipeline, worker: Worker
) -> None:
    """``ZAPSTREAM_STACKZAP_LISTING_FIELDS={"items": "jobs", "reference": "ref"}`` against a
    gateway answering that shape: 25 % of responses dropped, every job accepted once,
    found by narrow (``reference=``) listing queries."""
    worker.process.stop()  # the default-names worker; this one reads the other shape
    shaped = Worker(
        pipeline,
        "worker-shaped",
        {**WORKER_ENV, "ZAPSTREAM_STACKZAP_LISTING_FIELDS": orjson.dumps(OTHER_SHAPE).decode()},
    )
    try:
        outcomes_before = _sim_outcomes(pipeline)
        pipeline.sim_config(listing_fields=OTHER_SHAPE, drop_response_rate=0.25, seed=7)
        run = uuid.uuid4().hex[:8]
        keys = enqueue_conversations(
            pipeline.dsn, run, messages=80, conversations=16, instances=2, per_transaction=40
        )
        arrivals = Arrivals(pipeline)
        report = arrivals.wait_for(keys, timeout_s=120)
        wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
        outcomes = _sim_outcomes(pipeline)
        dropped = outcomes.get("dropped", 0) - outcomes_before.get("dropped", 0)
        narrow = outcomes.get("listed_filtered", 0) - outcomes_before.get("listed_filtered", 0)
        full = outcomes.get("listed_all", 0) - outcomes_before.get("listed_all", 0)
        unreadable = shaped.metric("zapstream_reconcile_listing_unreadable_total")
        print(
            f"other shape: sent {len(keys)}, responses dropped {dropped}, accepted "
            f"{report.accepted_unique}, duplicates {report.duplicate_count}, order violations "
            f"{len(report.order_violations)}, lost {len(report.missing)}, narrow listings "
            f"{narrow}, full listings {full}, unreadable {unreadable:g}"
        )
        assert dropped > 0
        assert report.duplicate_count == 0 and report.order_violations == ()
        assert report.accepted_unique == len(keys)
        # Jobs reconciled together share a listing request (one per instance, not per job);
        # the only full listings are the one-page start checks of the two new instances.
        assert 0 < narrow <= dropped and full <= 2
        assert unreadable == 0
    finally:
        shaped.process.stop()
