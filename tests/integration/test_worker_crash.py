"""The worker SIGKILLed mid-stream and restarted, on real processes.

Acceptance: every key reaches the gateway at least once, in per-conversation
order; any duplicate is a message that was in flight at the kill (sent to the
gateway, outcome not yet durable in Kafka); the test reports how many.

On Tansu (``DEVSTACK_BROKER=tansu``) ListOffsets is wrong after multi-record batches
and Faust's table recovery reads up to it, so this test runs the worker with one record
per produce request (``ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH``), a test-only setting:
without it recovery can stop short and resend jobs that were already recorded. Apache
Kafka (the default) needs none of it (``test_kafka_compaction.py`` checks recovery with
batched writes).
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from devtools.stack.local_pipeline import LocalPipeline
from tests.integration.support import Arrivals, enqueue_conversations, wait_for_status, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(
        partitions=4, worker_env={"ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true"}
    ) as p:
        p.start_relay()
        yield p


def test_worker_sigkill_mid_stream_sends_every_key_in_order_and_only_in_flight_twice(
    pipeline: LocalPipeline,
) -> None:
    worker = pipeline.start_worker("worker")
    keys = enqueue_conversations(
        pipeline.dsn, uuid.uuid4().hex[:8], messages=5_000, conversations=50
    )
    arrivals = Arrivals(pipeline)
    wait_until(lambda: len(arrivals.refresh()) >= 1_500, 120, "1,500 messages at the gateway")
    worker.kill(signal.SIGKILL)
    killed_at = time.time()
    worker.wait(timeout_s=10)
    worker = pipeline.start_worker("worker")

    report = arrivals.wait_for(keys, timeout_s=300)
    assert report.order_violations == (), report.order_violations[:5]
    assert report.accepted_unique == 5_000
    first_arrival: dict[str, float] = {}
    for item in arrivals.items:
        for key in report.duplicates:
            if key in str(item["text"]) and key not in first_arrival:
                first_arrival[key] = float(item["arrived_at"])
    late = [k for k, t in first_arrival.items() if t > killed_at]
    assert not late, f"duplicates first sent after the kill, so not in flight then: {late[:5]}"
    # At most one in-flight message per conversation lane can be resent.
    assert report.duplicate_count <= 50
    print(f"\nworker SIGKILL: {report.duplicate_count} duplicate(s), all in flight at the kill")
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
    worker.terminate(timeout_s=30)


def test_worker_sigterm_drains_and_its_successor_resends_nothing(pipeline: LocalPipeline) -> None:
    worker = pipeline.start_worker("worker-term")
    arrivals = Arrivals(pipeline)
    arrivals.refresh()
    keys = enqueue_conversations(
        pipeline.dsn, uuid.uuid4().hex[:8], messages=1_000, conversations=20
    )
    wait_until(lambda: len(audit_keys(arrivals, keys)) >= 300, 120, "300 messages at the gateway")
    assert worker.terminate(timeout_s=60) == 0, worker.log_tail()
    worker = pipeline.start_worker("worker-term")
    report = arrivals.wait_for(keys, timeout_s=180)
    assert report.duplicate_count == 0, (
        f"resent after a graceful stop: {list(report.duplicates)[:5]}"
    )
    assert report.order_violations == ()
    worker.terminate(timeout_s=60)


def audit_keys(arrivals: Arrivals, keys: list[str]) -> set[str]:
    wanted = set(keys)
    return {k for k in (_key(m) for m in arrivals.refresh()) if k in wanted}


def _key(message: dict[str, object]) -> str:
    text = str(message.get("text", ""))
    return text[text.rfind("[") + 1 : text.rfind("]")]
