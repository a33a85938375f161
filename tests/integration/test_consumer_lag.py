"""Consumer lag stays visible while the worker is down, and returns to 0 when it is back.

Real processes: PostgreSQL, Tansu, the relay, a worker, and ``zapstream
lag-monitor`` (a consumer outside any group) reading every second. Intents are
enqueued at a steady rate throughout. The worker is stopped with SIGTERM: the
monitor's ``/metrics`` shows the worker group's lag in records (summed over
partitions) and in seconds growing; after a restart both return to 0, on the
monitor's page and on the worker's own ``/metrics``.

Tansu runs with the default end-offset source for it (``high_watermark``): the
relay produces batches, after which Tansu's ListOffsets is wrong.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.devstack import find_free_port
from devtools.local_pipeline import LocalPipeline
from streams.contract import BULK_INTENTS, INTENTS
from tests.integration.support import enqueue_conversations, wait_until

pytestmark = pytest.mark.integration

GROUP = "zapstream-worker"


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(
        partitions=4, with_sink=False, worker_env={"ZAPSTREAM_LAG_INTERVAL_S": "1"}
    ) as p:
        p.start_relay()
        yield p


class SteadyIntents:
    """Enqueues ``per_tick`` intents every ``tick_s`` in a thread until stopped."""

    def __init__(self, dsn: str, per_tick: int = 4, tick_s: float = 0.25) -> None:
        self.dsn = dsn
        self.per_tick = per_tick
        self.tick_s = tick_s
        self.enqueued = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-intents", daemon=True)

    def __enter__(self) -> SteadyIntents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            keys = enqueue_conversations(
                self.dsn,
                uuid.uuid4().hex[:8],
                messages=self.per_tick,
                conversations=self.per_tick,
                per_transaction=self.per_tick,
            )
            self.enqueued += len(keys)
            self._stop.wait(self.tick_s)  # the rate, not a wait for a condition


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a ``/metrics`` page, keyed by name and sorted labels."""
    text = httpx.get(url, timeout=5.0).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def group_lag(url: str) -> tuple[float, float | None, int]:
    """(lag summed over the group's partitions, max lag seconds, partitions reported)."""
    samples = scrape(url)
    lags = [
        v
        for (name, labels), v in samples.items()
        if name == "kafka_consumergroup_group_lag" and ("group", GROUP) in labels
    ]
    seconds = samples.get(("kafka_consumergroup_group_max_lag_seconds", (("group", GROUP),)))
    return sum(lags), seconds, len(lags)


def committed(url: str) -> float:
    """The worker group's committed offsets, summed over partitions."""
    return sum(
        v
        for (name, labels), v in scrape(url).items()
        if name == "kafka_consumergroup_group_offset" and ("group", GROUP) in labels
    )


def test_lag_grows_while_the_worker_is_down_and_returns_to_zero_after_restart(
    pipeline: LocalPipeline,
) -> None:
    _, monitor_url = pipeline.start_lag_monitor(
        env={
            "ZAPSTREAM_LAG_INTERVAL_S": "1",
            "ZAPSTREAM_LAG_GROUPS": f'{{"{GROUP}": ["{INTENTS}", "{BULK_INTENTS}"]}}',
        }
    )
    worker_port = find_free_port()
    worker_env = {"ZAPSTREAM_WORKER_WEB_PORT": str(worker_port)}
    worker = pipeline.start_worker("worker", env=worker_env)
    with SteadyIntents(pipeline.dsn) as intents:
        # While the worker runs: every partition of both topics reported, commits moving.
        wait_until(lambda: intents.enqueued >= 20, 30, "20 intents enqueued")
        wait_until(
            lambda: group_lag(monitor_url)[2] == 2 * pipeline.partitions,
            30,
            f"lag of all {2 * pipeline.partitions} partitions on the monitor",
        )
        wait_until(lambda: committed(monitor_url) > 0, 30, "the worker group's first commits")

        assert worker.terminate(timeout_s=60) == 0, worker.log_tail()
        stopped_at = time.monotonic()
        wait_until(lambda: group_lag(monitor_url)[0] >= 10, 30, "10 records of lag")
        first_lag, first_seconds, _ = group_lag(monitor_url)
        assert first_seconds is not None and first_seconds > 0
        wait_until(
            lambda: group_lag(monitor_url)[0] >= first_lag + 20,
            30,
            f"the lag growing past {first_lag + 20} records (was {first_lag})",
        )
        wait_until(
            lambda: (group_lag(monitor_url)[1] or 0) >= first_seconds + 3,
            30,
            f"the lag in seconds growing past {first_seconds + 3:.1f} s",
        )
        _, seconds_down, _ = group_lag(monitor_url)
        down_s = time.monotonic() - stopped_at
        # The oldest unconsumed intent is about as old as the outage (one reading late).
        assert seconds_down is not None and seconds_down <= down_s + 5, (seconds_down, down_s)

        worker = pipeline.start_worker("worker", env=worker_env)
        # The restarted worker works through arrivals, then the arrivals stop.
        wait_until(lambda: group_lag(monitor_url)[0] < first_lag, 60, "the lag shrinking")
    wait_until(
        lambda: group_lag(monitor_url)[:2] == (0, 0), 60, "lag 0 records and 0 s on the monitor"
    )
    worker_url = f"http://127.0.0.1:{worker_port}/metrics"
    wait_until(
        lambda: (
            group_lag(worker_url)[:2] == (0, 0)
            and group_lag(worker_url)[2] == 2 * pipeline.partitions
        ),
        30,
        "lag 0 records and 0 s on the worker's own /metrics, every partition",
    )
    assert worker.terminate(timeout_s=60) == 0, worker.log_tail()
    print(f"\nlag while down: {first_lag:.0f}+ records, {seconds_down:.1f} s after {down_s:.1f} s")


def test_the_lag_monitor_stops_on_sigterm(pipeline: LocalPipeline) -> None:
    monitor, url = pipeline.start_lag_monitor("lag-monitor-stop")
    wait_until(
        lambda: "zapstream_lag_monitor_last_read_timestamp_seconds" in httpx.get(url).text,
        30,
        "a first reading",
    )
    monitor.kill(signal.SIGTERM)
    assert monitor.wait(timeout_s=15) == 0, monitor.log_tail()
