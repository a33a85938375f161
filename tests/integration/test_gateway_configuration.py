"""A configuration detail never FAILs the queue: base URLs as users copy them, and wrong ones.

On the whole pipeline (PostgreSQL, Kafka, relay, worker, state sink, gateway
simulator), audited by what the simulator really received:

1. ``ZAP_API_URL`` with a trailing ``/v1`` (as the outbox article writes its
   ``baseURL``): every message delivered once, in order.
2. ``ZAP_API_URL`` that really is wrong (a path the simulator answers 404):
   ``zapstream doctor`` fails naming it; the worker logs one ERROR naming it,
   pauses the instances, ends no job FAILED; fixed and restarted, it sends every
   job exactly once, in order.
3. The same with ``STACKZAP_API_URL``; the fixed URL has a trailing ``/v1`` too.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from devtools.stack.delivery_audit import audit
from devtools.stack.devstack import ManagedProcess
from devtools.stack.local_pipeline import LocalPipeline
from tests.integration.support import (
    Arrivals,
    enqueue_conversations,
    wait_for_status,
    wait_until,
    zapstream,
)

pytestmark = pytest.mark.integration

ENV = {
    "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true",
    "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[0.5, 1, 2]",
    "ZAPSTREAM_WORKER_RETRY_SCAN_INTERVAL_S": "0.2",
    # Probes of a paused instance: 1 s, then doubling up to 4 s.
    "ZAPSTREAM_WORKER_INSTANCE_PROBE_S": "1",
    "ZAPSTREAM_WORKER_INSTANCE_PROBE_MAX_S": "4",
}
MESSAGES, CONVERSATIONS, INSTANCES = 60, 12, 3


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4, worker_env=ENV) as p:
        p.start_relay()
        yield p


def status_counts(dsn: str, keys: list[str]) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM outbox_jobs WHERE idempotency_key = ANY(%s) "
            "GROUP BY status",
            (keys,),
        ).fetchall()
    return {str(s): int(n) for s, n in rows}


def log_since(worker: ManagedProcess, offset: int) -> str:
    return worker.log_path.read_bytes()[offset:].decode("utf-8", "replace")


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "ERROR" in line]


def doctor(pipeline: LocalPipeline, env: dict[str, str]) -> tuple[int, list[str]]:
    code, out, _ = zapstream(["doctor"], {**os.environ, **pipeline.env(), **env})
    return code, [line for line in out.splitlines() if line.startswith("FAIL")]


def enqueue(pipeline: LocalPipeline) -> list[str]:
    return enqueue_conversations(
        pipeline.dsn,
        uuid.uuid4().hex[:8],
        messages=MESSAGES,
        conversations=CONVERSATIONS,
        instances=INSTANCES,
        per_transaction=30,
    )


def test_zap_api_url_with_a_trailing_v1_delivers_every_message_once(
    pipeline: LocalPipeline,
) -> None:
    env = {"ZAPSTREAM_GATEWAY": "zapapi", "ZAP_API_URL": f"{pipeline.sim_url}/v1"}
    code, failed = doctor(pipeline, env)
    worker = pipeline.start_worker("worker-v1", env=env)
    arrivals = Arrivals(pipeline)
    earlier = len(arrivals.refresh())
    keys = enqueue(pipeline)
    arrivals.wait_for(keys, timeout_s=120)
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
    report = audit(keys, arrivals.refresh()[earlier:])
    log = log_since(worker, 0)
    notes = re.findall(r"dropped a trailing '/v1' from ZAP_API_URL", log)
    print(
        f"\nZAP_API_URL=<sim>/v1: doctor exit {code} {failed}; sent {len(keys)}, accepted "
        f"{report.accepted_unique}, duplicates {report.duplicate_count}, order violations "
        f"{len(report.order_violations)}, lost {len(report.missing)}; normalised notes {notes}"
    )
    assert code == 0, failed
    assert report.accepted_unique == len(keys) and report.missing == ()
    assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
    assert report.order_violations == ()
    assert len(notes) == 1, "the normalisation is logged once, at INFO"
    worker.terminate(timeout_s=60)


@pytest.mark.parametrize(
    ("gateway", "setting", "fixed_suffix"),
    [("zapapi", "ZAP_API_URL", ""), ("stackzap", "STACKZAP_API_URL", "/v1")],
)
def test_a_wrong_base_url_pauses_the_instances_and_nothing_fails_until_it_is_fixed(
    pipeline: LocalPipeline, gateway: str, setting: str, fixed_suffix: str
) -> None:
    wrong = {"ZAPSTREAM_GATEWAY": gateway, setting: f"{pipeline.sim_url}/wrong-base"}
    code, failed = doctor(pipeline, wrong)
    assert code == 1, "doctor must fail on a wrong base URL"
    assert len(failed) == 1 and "gateway" in failed[0] and setting in failed[0], failed

    worker = pipeline.start_worker(f"worker-wrong-{gateway}", env=wrong)
    arrivals = Arrivals(pipeline)
    earlier = len(arrivals.refresh())
    keys = enqueue(pipeline)
    # Every instance pauses at its first send: that job waits (RETRY_WAIT, its attempt
    # given back), the others park PENDING without calling the gateway.
    paused_re = re.compile(r"instance (inst-\d+) paused")
    wait_until(
        lambda: (
            len(set(paused_re.findall(log_since(worker, 0)))) == INSTANCES
            and status_counts(pipeline.dsn, keys).get("RETRY_WAIT", 0) >= INSTANCES
        ),
        90,
        f"{INSTANCES} instances paused, each with a job waiting",
    )
    # Each instance's probes (1 s, 2 s, 4 s apart) meet the same 404 and change nothing.
    first_sends = _attempts(pipeline, keys)
    wait_until(
        lambda: _attempts(pipeline, keys) >= first_sends + 2 * INSTANCES,
        60,
        "two probes of every paused instance",
    )
    assert worker.is_running, "the worker keeps running"
    held_log = log_since(worker, 0)
    during = status_counts(pipeline.dsn, keys)
    errors = error_lines(log_since(worker, 0))
    misconfigured = [line for line in errors if setting in line]
    new_arrivals = arrivals.refresh()[earlier:]
    print(
        f"\n{gateway} wrong {setting}: doctor exit {code}: {failed[0]}\nduring the pause: "
        f"{during}, arrivals {len(new_arrivals)}, ERROR lines "
        f"{len(errors)} ({len(misconfigured)} naming {setting}): {misconfigured[:1]}; paused "
        f"instances {sorted(set(paused_re.findall(held_log)))}; attempts journaled "
        f"{first_sends} first sends, then {_attempts(pipeline, keys) - first_sends} probes"
    )
    assert "FAILED" not in during and "DEAD" not in during and "UNCERTAIN" not in during
    assert new_arrivals == [], "nothing may reach the gateway through a wrong base URL"
    assert len(misconfigured) == 1, errors
    assert len(errors) == 1, f"one ERROR in all, got {errors}"
    worker.terminate(timeout_s=60)

    # The operator fixes the setting and restarts the worker.
    fixed = {"ZAPSTREAM_GATEWAY": gateway, setting: f"{pipeline.sim_url}{fixed_suffix}"}
    code_fixed, failed_fixed = doctor(pipeline, fixed)
    restarted = pipeline.start_worker(f"worker-fixed-{gateway}", env=fixed)
    arrivals.wait_for(keys, timeout_s=120)
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
    report = audit(keys, arrivals.refresh()[earlier:])
    after = status_counts(pipeline.dsn, keys)
    print(
        f"after the fix: doctor exit {code_fixed} {failed_fixed}; sent {len(keys)}, accepted "
        f"{report.accepted_unique}, duplicates {report.duplicate_count}, order violations "
        f"{len(report.order_violations)}, lost {len(report.missing)}; states {after}"
    )
    assert code_fixed == 0, failed_fixed
    assert report.accepted_unique == len(keys) and report.missing == ()
    assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
    assert report.order_violations == ()
    assert after == {"ACCEPTED": len(keys)}
    restarted.terminate(timeout_s=60)


def _attempts(pipeline: LocalPipeline, keys: list[str]) -> int:
    """Attempts journaled so far (ATTEMPTING state changes): first sends plus probes."""
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_job_events e JOIN outbox_jobs j ON j.id = e.job_id "
            "WHERE j.idempotency_key = ANY(%s) AND e.to_status = 'ATTEMPTING'",
            (keys,),
        ).fetchone()
    return int(row[0]) if row else 0
