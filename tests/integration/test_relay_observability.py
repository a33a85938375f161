"""What an SRE sees of the relay, on real processes (PostgreSQL, Kafka, two relays).

- The slot's lag is exported by a standby relay too (its monitor has its own
  connection): with the active relay frozen (SIGSTOP, so it keeps the slot) and
  rows committed, the standby's ``zapstream_relay_slot_lag_bytes`` grows; once the
  standby takes over it falls back to about zero. ``/readyz`` is 503 on the
  standby and 200 on the streaming relay; ``/healthz`` is 200 on both.
- The WAL heartbeat: with the outbox idle, the slot's ``confirmed_flush_lsn``
  and the relay's ``zapstream_relay_confirmed_lsn`` move forward, heartbeat by
  heartbeat.
"""

from __future__ import annotations

import re
import signal
import uuid
from collections.abc import Iterator

import httpx
import pytest

from devtools.stack.devstack import ManagedProcess, find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from tests.integration.support import count_rows, enqueue_conversations, wait_until

pytestmark = pytest.mark.integration

SLOT = "zapstream_outbox"


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    # No worker: the slot's side of the relay is under test, not delivery.
    with LocalPipeline(partitions=4) as p:
        yield p


def _start(pipeline: LocalPipeline, name: str, **env: str) -> tuple[ManagedProcess, int]:
    port = find_free_port()
    relay = pipeline.start_relay(
        name,
        env={
            "ZAPSTREAM_RELAY_METRICS_PORT": str(port),
            "ZAPSTREAM_RELAY_SLOT_METRICS_INTERVAL_S": "0.2",
            "ZAPSTREAM_RELAY_STANDBY_RETRY_S": "0.5",
            **env,
        },
    )
    return relay, port


def _get(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)


def _metric(port: int, name: str) -> float | None:
    text = _get(port, "/metrics").text
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else None


def _lag(port: int) -> float:
    value = _metric(port, "zapstream_relay_slot_lag_bytes")
    assert value is not None, "zapstream_relay_slot_lag_bytes missing from /metrics"
    return value


def _confirmed_flush(dsn: str) -> int:
    return count_rows(
        dsn,
        "SELECT coalesce(confirmed_flush_lsn - '0/0', 0)::bigint FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (SLOT,),
    )


def _sql_lag(dsn: str) -> int:
    return count_rows(
        dsn,
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (SLOT,),
    )


def test_a_standby_exports_the_growing_lag_of_a_slot_nobody_confirms(
    pipeline: LocalPipeline,
) -> None:
    active, active_port = _start(pipeline, "relay-active", ZAPSTREAM_RELAY_HEARTBEAT_INTERVAL_S="1")
    active.wait_for_log(r"relay streaming", timeout_s=30)
    standby, standby_port = _start(
        pipeline, "relay-standby", ZAPSTREAM_RELAY_HEARTBEAT_INTERVAL_S="1"
    )
    standby.wait_for_log(r"relay standby", timeout_s=30)
    try:
        wait_until(lambda: _get(active_port, "/readyz").status_code == 200, 30, "active ready")
        assert _get(active_port, "/healthz").status_code == 200
        assert _metric(active_port, "zapstream_relay_active") == 1
        readyz = _get(standby_port, "/readyz")
        assert readyz.status_code == 503 and "standby" in readyz.text
        assert _get(standby_port, "/healthz").status_code == 200
        assert _metric(standby_port, "zapstream_relay_active") == 0
        assert _get(standby_port, "/nothing").status_code == 404

        # Frozen, the active relay keeps its walsender (the slot stays taken) and confirms
        # nothing: the lag is visible only through the standby's own connection.
        active.kill(signal.SIGSTOP)
        before = _lag(standby_port)
        enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=200, conversations=5)
        wait_until(lambda: _lag(standby_port) > before + 10_000, 20, "the standby's lag to grow")
        first = _lag(standby_port)
        enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=200, conversations=5)
        wait_until(lambda: _lag(standby_port) > first + 10_000, 20, "the lag to grow again")
        # The exported figure is PostgreSQL's: it is at most one read interval behind SQL.
        assert _lag(standby_port) <= _sql_lag(pipeline.dsn)
        print(
            f"\n[slot lag] before={before:.0f} after 200 rows={first:.0f} "
            f"after 400 rows={_lag(standby_port):.0f} (SQL {_sql_lag(pipeline.dsn)})"
        )
        assert _get(standby_port, "/readyz").status_code == 503
    finally:
        active.kill(signal.SIGKILL)
        active.wait(timeout_s=10)

    # The standby takes over, streams the backlog and confirms it: the lag falls to ~0.
    standby.wait_for_log(r"relay streaming", timeout_s=60)
    wait_until(lambda: _get(standby_port, "/readyz").status_code == 200, 30, "standby ready")
    assert _metric(standby_port, "zapstream_relay_active") == 1
    wait_until(lambda: _lag(standby_port) < 4096, 30, "the lag back to ~0 after takeover")
    confirmed = _metric(standby_port, "zapstream_relay_confirmed_lsn")
    assert confirmed is not None and confirmed > 0
    assert standby.terminate(timeout_s=30) == 0


def test_heartbeats_move_the_slot_forward_on_an_idle_outbox(pipeline: LocalPipeline) -> None:
    relay, port = _start(pipeline, "relay-heartbeat", ZAPSTREAM_RELAY_HEARTBEAT_INTERVAL_S="0.5")
    relay.wait_for_log(r"relay streaming", timeout_s=30)
    wait_until(
        lambda: (_metric(port, "zapstream_relay_heartbeat_last_seconds") or 0) > 0,
        20,
        "the first heartbeat",
    )
    # No row is written from here: only the heartbeats write WAL for the slot to pass.
    start_flush = _confirmed_flush(pipeline.dsn)
    start_beat = _metric(port, "zapstream_relay_heartbeat_last_seconds") or 0
    start_metric = _metric(port, "zapstream_relay_confirmed_lsn") or 0
    # Three advances in a row, each within a few heartbeat intervals (an idle server
    # without heartbeats leaves confirmed_flush_lsn where it is).
    flush = start_flush
    for step in range(3):
        previous = flush
        wait_until(
            lambda: _confirmed_flush(pipeline.dsn) > previous,  # noqa: B023 (used at once)
            5,
            f"confirmed_flush_lsn to advance (step {step + 1})",
        )
        flush = _confirmed_flush(pipeline.dsn)
    wait_until(
        lambda: (_metric(port, "zapstream_relay_confirmed_lsn") or 0) > start_metric,
        20,
        "zapstream_relay_confirmed_lsn to advance",
    )
    assert (_metric(port, "zapstream_relay_heartbeat_last_seconds") or 0) > start_beat
    # Idle and heartbeating, the slot lags by at most the WAL written since the last one.
    wait_until(lambda: _lag(port) < 4096, 20, "the lag to stay ~0")
    print(
        f"\n[heartbeat] confirmed_flush {start_flush} -> {_confirmed_flush(pipeline.dsn)}, "
        f"lag {_lag(port):.0f} bytes"
    )
    assert relay.terminate(timeout_s=30) == 0
