"""Consumer lag stays visible while the worker is down, and returns to 0 when it is back.

Real processes: PostgreSQL, Kafka, the relay, a worker, and ``zapstream
lag-monitor`` (a consumer outside any group) reading every second. Intents are
enqueued at a steady rate throughout. The worker is stopped with SIGTERM: the
monitor's ``/metrics`` shows the worker group's lag in records (summed over
partitions) and in seconds growing; after a restart both return to 0, on the
monitor's page and on the worker's own ``/metrics``.

The monitor reads end offsets the broker's default way (``list_offsets`` on Apache
Kafka; on Tansu, ``DEVSTACK_BROKER=tansu``, ``high_watermark``: the relay produces
batches, after which Tansu's ListOffsets is wrong).
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

from devtools.stack.devstack import find_free_port
from devtools.stack.local_pipeline import LocalPipeline, default_broker
from streams.kernel.contract import BULK_INTENTS, INTENTS
from tests.integration.support import enqueue_conversations, wait_until

pytestmark = pytest.mark.integration

WORKER_GROUP = "zapstream-worker"


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    # Proxied: the services reach Kafka through a proxy the last test cuts.
    with LocalPipeline(
        partitions=4, with_sink=False, proxied=True, worker_env={"ZAPSTREAM_LAG_INTERVAL_S": "1"}
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


def group_lag(url: str, group: str) -> tuple[float, float | None, int]:
    """(lag summed over the group's partitions, max lag seconds, partitions reported)."""
    samples = scrape(url)
    lags = [
        v
        for (name, labels), v in samples.items()
        if name == "kafka_consumergroup_group_lag" and ("group", group) in labels
    ]
    seconds = samples.get(("kafka_consumergroup_group_max_lag_seconds", (("group", group),)))
    return sum(lags), seconds, len(lags)


def committed(url: str, group: str) -> float:
    """The worker group's committed offsets, summed over partitions."""
    return sum(
        v
        for (name, labels), v in scrape(url).items()
        if name == "kafka_consumergroup_group_offset" and ("group", group) in labels
    )


FAST = {
    "ZAPSTREAM_LAG_INTERVAL_S": "1",
    # Names before the topic prefix: the monitor applies its own (LagMonitorSettings.watched).
    "ZAPSTREAM_LAG_GROUPS": f'{{"{WORKER_GROUP}": ["{INTENTS}", "{BULK_INTENTS}"]}}',
}


def test_lag_grows_while_the_worker_is_down_and_returns_to_zero_after_restart(
    pipeline: LocalPipeline,
) -> None:
    _, monitor_url = pipeline.start_lag_monitor(env=FAST)
    group = pipeline.topics.group(WORKER_GROUP)
    worker_port = find_free_port()
    worker_env = {"ZAPSTREAM_WORKER_WEB_PORT": str(worker_port)}
    worker = pipeline.start_worker("worker", env=worker_env)
    with SteadyIntents(pipeline.dsn) as intents:
        # While the worker runs: every partition of both topics reported, commits moving.
        wait_until(lambda: intents.enqueued >= 20, 30, "20 intents enqueued")
        wait_until(
            lambda: group_lag(monitor_url, group)[2] == 2 * pipeline.partitions,
            30,
            f"lag of all {2 * pipeline.partitions} partitions on the monitor",
        )
        wait_until(
            lambda: committed(monitor_url, group) > 0, 30, "the worker group's first commits"
        )

        stopped_at = time.monotonic()
        assert worker.terminate(timeout_s=60) == 0, worker.log_tail()
        terminated_at = time.monotonic()
        wait_until(lambda: group_lag(monitor_url, group)[0] >= 10, 30, "10 records of lag")
        first_lag, first_seconds, _ = group_lag(monitor_url, group)
        assert first_seconds is not None and first_seconds > 0
        wait_until(
            lambda: group_lag(monitor_url, group)[0] >= first_lag + 20,
            30,
            f"the lag growing past {first_lag + 20} records (was {first_lag})",
        )
        wait_until(
            lambda: (group_lag(monitor_url, group)[1] or 0) >= first_seconds + 3,
            30,
            f"the lag in seconds growing past {first_seconds + 3:.1f} s",
        )
        _, seconds_down, _ = group_lag(monitor_url, group)
        read_at = time.monotonic()
        down_s, drained_s = read_at - stopped_at, read_at - terminated_at
        # The oldest unconsumed intent arrived while the worker was stopping (its drain, which
        # a loaded machine makes longer): it is as old as the outage, give or take a commit
        # interval, a reading (1 s each) and the drain.
        assert seconds_down is not None, "no lag in seconds"
        assert drained_s - 3 <= seconds_down <= down_s + 3, (seconds_down, drained_s, down_s)

        worker = pipeline.start_worker("worker", env=worker_env)
        # The restarted worker works through arrivals, then the arrivals stop.
        wait_until(lambda: group_lag(monitor_url, group)[0] < first_lag, 60, "the lag shrinking")
    wait_until(
        lambda: group_lag(monitor_url, group)[:2] == (0, 0),
        60,
        "lag 0 records and 0 s on the monitor",
    )
    worker_url = f"http://127.0.0.1:{worker_port}/metrics"
    wait_until(
        lambda: (
            group_lag(worker_url, group)[:2] == (0, 0)
            and group_lag(worker_url, group)[2] == 2 * pipeline.partitions
        ),
        30,
        "lag 0 records and 0 s on the worker's own /metrics, every partition",
    )
    # Issue 10's idle gauges, on the live worker: nothing in flight reads 0, and Faust's
    # "active" gauges (stuck at the last batch's size) are not served at all.
    idle = scrape(worker_url)
    assert idle[("zapstream_dispatch_in_flight", (("priority", "operational"),))] == 0
    assert idle[("zapstream_dispatch_in_flight", (("priority", "bulk"),))] == 0
    assert not [name for name, _ in idle if "active_messages" in name or "active_events" in name]
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


async def _produce(bootstrap: str, topic: str, values: list[bytes], *, batched: bool) -> list[int]:
    """Produce to partition 0, one request per record or all in one batch; return the
    records' timestamps.

    Each record carries its own timestamp, one second apart: aiokafka's metadata of a
    batched send reports the batch's first timestamp for every record (measured), so it
    cannot tell which record the lag is measured from; a CI run under load had its sends
    62 ms apart and read 29.938 s for an expected 30.
    """
    from aiokafka import AIOKafkaProducer

    base_ms = int(time.time() * 1000) - 60_000
    stamps = [base_ms + 1000 * i for i in range(len(values))]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50 if batched else 0)
    await producer.start()
    try:
        if batched:
            futures = [
                await producer.send(topic, v, partition=0, timestamp_ms=t)
                for v, t in zip(values, stamps, strict=True)
            ]
            await producer.flush()
            metas = [await f for f in futures]
        else:
            metas = [
                await producer.send_and_wait(topic, v, partition=0, timestamp_ms=t)
                for v, t in zip(values, stamps, strict=True)
            ]
    finally:
        await producer.stop()
    assert [m.offset for m in metas] == list(range(len(values)))
    return stamps


async def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    tp = TopicPartition(topic, 0)
    # No auto-commit: aiokafka's stop() commits the consumer's position, which its fetcher
    # may have reset to the end (10) in the meantime; a CI run read committed=10.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


@pytest.mark.parametrize(
    ("source", "batched"),
    [
        ("high_watermark", True),
        ("high_watermark", False),
        ("list_offsets", False),
        pytest.param(
            "list_offsets",
            True,
            marks=pytest.mark.skipif(
                default_broker() == "tansu", reason="Tansu's ListOffsets is wrong after a batch"
            ),
        ),
    ],
)
async def test_lag_in_records_and_seconds_is_exact_for_a_known_commit(
    pipeline: LocalPipeline, source: str, batched: bool
) -> None:
    """10 records, the group committed 4: lag 6 records, as old as record 4.

    ``list_offsets`` is the Apache Kafka default, right after a batch too; on Tansu it is
    only right when every record came in its own produce request (after one batch of 10
    it answers 1), so there it is checked that way only.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from streams.kernel.settings import EndOffsetSource, KafkaSettings
    from streams.lag_monitor import LagMonitor

    bootstrap = pipeline.kafka.bootstrap
    topic, group = f"lagtest-{uuid.uuid4().hex[:8]}", f"lagtest-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    stamps = await _produce(bootstrap, topic, [b"x%d" % i for i in range(10)], batched=batched)
    await _commit(bootstrap, group, topic, 4)
    kafka = pipeline.kafka_settings().model_copy(update={"end_offsets": EndOffsetSource(source)})
    assert isinstance(kafka, KafkaSettings)
    now = stamps[-1] / 1000 + 30.0
    monitor = LagMonitor(kafka, {group: [topic]}, clock=lambda: now)
    try:
        [lag] = await monitor.read_once()
    finally:
        await monitor.stop()
    by_partition = {p.partition: p for p in lag.partitions}
    p0, p1 = by_partition[0], by_partition[1]
    assert (p0.committed, p0.latest, p0.lag) == (4, 10, 6)
    assert p0.lag_seconds == pytest.approx(now - stamps[4] / 1000, abs=0.001)  # 35 s
    assert (p1.committed, p1.latest, p1.lag, p1.lag_seconds) == (None, 0, 0, 0.0)
    assert (lag.max_lag, lag.sum_lag, lag.unread) == (6, 6, 0)


def test_the_lag_monitor_outlives_a_kafka_outage_keeping_its_last_values(
    pipeline: LocalPipeline,
) -> None:
    monitor, url = pipeline.start_lag_monitor("lag-monitor-outage", env=FAST)
    group = pipeline.topics.group(WORKER_GROUP)
    last_read = ("zapstream_lag_monitor_last_read_timestamp_seconds", (("group", group),))
    errors = ("zapstream_timer_errors_total", (("job", "lag monitor"),))
    wait_until(lambda: last_read in scrape(url), 30, "a first reading")
    before = scrape(url)
    proxy = pipeline.kafka_proxy
    assert proxy is not None
    since = monitor.log_offset()
    proxy.cut()
    try:
        monitor.wait_for_log(r"lag monitor unavailable", timeout_s=30, since=since)
        cut_at = scrape(url)[last_read]
        wait_until(lambda: scrape(url).get(errors, 0) >= 3, 30, "three failed readings")
        during = scrape(url)
        assert monitor.is_running, monitor.log_tail()
        assert during[last_read] == cut_at
        lag_series = {k for k in before if k[0] == "kafka_consumergroup_group_lag"}
        assert lag_series and lag_series <= set(during)
        outage_log = monitor.log_path.read_text()[since:]
        assert outage_log.count("lag monitor unavailable") <= 2, outage_log[-2000:]
    finally:
        proxy.restore()
    wait_until(lambda: scrape(url)[last_read] > cut_at, 60, "readings again after the outage")
    assert monitor.terminate(timeout_s=15) == 0, monitor.log_tail()
