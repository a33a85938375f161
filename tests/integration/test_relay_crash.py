"""The CDC relay under SIGKILL, standby takeover and SIGTERM, on real processes.

Acceptance: 5,000 intents over 50 conversations, the relay SIGKILLed mid-stream
and restarted: every key reaches the gateway exactly once, in per-conversation
order, and outbox_jobs shows them accepted. Relay replays (records produced but
not yet confirmed to PostgreSQL) are absorbed by the worker's job table.
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator

import pytest

from devtools.local_pipeline import LocalPipeline
from tests.integration.support import (
    Arrivals,
    count_rows,
    enqueue_conversations,
    wait_for_status,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4) as p:
        p.start_worker()
        yield p


def _slot_confirmed(dsn: str) -> int:
    return count_rows(
        dsn,
        "SELECT coalesce(confirmed_flush_lsn - '0/0', 0)::bigint FROM pg_replication_slots "
        "WHERE slot_name = 'zapstream_outbox'",
    )


def test_relay_sigkill_mid_stream_loses_nothing_and_sends_each_key_once(
    pipeline: LocalPipeline,
) -> None:
    relay = pipeline.start_relay("relay-a")
    start_confirmed = _slot_confirmed(pipeline.dsn)
    run = uuid.uuid4().hex[:8]
    half_committed = threading.Event()
    killed = threading.Event()

    def pace(committed: int) -> None:
        # The application keeps committing while the relay dies and comes back.
        if committed >= 2_500:
            half_committed.set()
            killed.wait(timeout=60)

    keys: list[str] = []
    producer = threading.Thread(
        target=lambda: keys.extend(
            enqueue_conversations(
                pipeline.dsn, run, messages=5_000, conversations=50, after_transaction=pace
            )
        )
    )
    producer.start()
    assert half_committed.wait(timeout=120), "enqueue did not get halfway"
    # Mid-stream: the relay has confirmed part of the WAL, not all of it.
    wait_until(
        lambda: _slot_confirmed(pipeline.dsn) > start_confirmed, 30, "the relay to confirm some WAL"
    )
    relay.kill(signal.SIGKILL)
    relay.wait(timeout_s=10)
    killed.set()
    relay = pipeline.start_relay("relay-a")
    producer.join(timeout=120)
    assert len(keys) == 5_000

    report = Arrivals(pipeline).wait_for(keys, timeout_s=240)
    assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
    assert report.order_violations == ()
    assert report.accepted_unique == 5_000
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
    relay.terminate(timeout_s=30)


def test_standby_relay_takes_over_when_the_active_one_dies(pipeline: LocalPipeline) -> None:
    active = pipeline.start_relay("relay-active")
    active.wait_for_log(r"relay streaming", timeout_s=30)
    standby = pipeline.start_relay("relay-standby")
    standby.wait_for_log(r"relay standby", timeout_s=30)
    active.kill(signal.SIGKILL)
    standby.wait_for_log(r"relay streaming", timeout_s=60)
    keys = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=200, conversations=10)
    report = Arrivals(pipeline).wait_for(keys, timeout_s=120)
    assert report.ok, report.summary()
    assert standby.terminate(timeout_s=30) == 0


def test_sigterm_drains_confirms_and_exits_cleanly(pipeline: LocalPipeline) -> None:
    relay = pipeline.start_relay("relay-term")
    keys = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=300, conversations=10)
    Arrivals(pipeline).wait_for(keys, timeout_s=120)
    confirmed_before = _slot_confirmed(pipeline.dsn)
    assert relay.terminate(timeout_s=30) == 0
    relay.wait_for_log(r"relay stopped: .* confirmed", timeout_s=5)
    assert _slot_confirmed(pipeline.dsn) >= confirmed_before
    # Nothing in flight was lost: a new relay has nothing left to replay to the gateway.
    relay = pipeline.start_relay("relay-term")
    arrivals = Arrivals(pipeline)
    later = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=20, conversations=2)
    report = arrivals.wait_for(keys + later, timeout_s=60)
    assert report.duplicate_count == 0
    relay.terminate(timeout_s=30)
