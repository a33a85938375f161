"""Every Faust, mode and aiokafka internal :mod:`streams.faust_adapter` touches still exists
with the shape it uses, and its hooks still take effect.

An upgrade that moves or renames one of them fails here, before a worker runs with a hook
that silently stopped working. The effects themselves (commits, flow control, fetch
settings) are tested in ``test_transport.py`` and ``test_monitor.py``.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from pathlib import Path
from typing import Any

import aiokafka
import faust
import pytest
from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from mode.utils.queues import FlowControlEvent, ThrowableQueue

from streams.faust_adapter import hooks
from streams.faust_adapter.monitor import PER_EVENT_SERIES
from streams.faust_adapter.transport import AgentQueue, KafkaTransport, _Consumer, _ConsumerThread


async def _noop(*args: Any) -> None:
    return None


def _params(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def _assigned_in(cls: type, attribute: str) -> bool:
    """``self.<attribute> = ...`` (annotated or not) in the class's source."""
    pattern = rf"self\.{re.escape(attribute)}\s*(:[^=\n]*)?=[^=]"
    return re.search(pattern, inspect.getsource(cls)) is not None


@pytest.mark.parametrize(("package", "version"), sorted(hooks.CHECKED_AGAINST.items()))
def test_the_hooks_were_checked_against_the_installed_versions(package: str, version: str) -> None:
    """A new version: re-check every hook of streams/faust_adapter (their comments name the
    version), then update CHECKED_AGAINST and the comments."""
    assert importlib.metadata.version(package) == version


@pytest.mark.parametrize(
    ("owner", "name", "params"),
    [
        (faust_aiokafka.AIOKafkaConsumerThread, "_create_worker_consumer", ["self", "transport"]),
        (faust_aiokafka.AIOKafkaConsumerThread, "_ensure_consumer", ["self"]),
        (faust_aiokafka.AIOKafkaConsumerThread, "seek_to_committed", ["self"]),
        (faust_aiokafka.Consumer, "_new_consumer_thread", ["self"]),
        (faust_aiokafka.Consumer, "_is_changelog_tp", ["self", "tp"]),
        (faust_aiokafka.Consumer, "_filter_committable_offsets", ["self", "tps"]),
        (faust_aiokafka.Consumer, "_should_commit", ["self", "tp", "offset"]),
        (faust_aiokafka.Consumer, "_get_active_partitions", ["self"]),
        (faust_aiokafka.Consumer, "ack", ["self", "message"]),
        (faust_aiokafka.Consumer, "on_buffer_full", ["self", "tp"]),
        (faust_aiokafka.Consumer, "on_buffer_drop", ["self", "tp"]),
        (faust_aiokafka.Producer, "_ensure_producer", ["self"]),
        (faust.App, "_new_transport", ["self"]),
        (faust.App, "FlowControlQueue", ["self", "maxsize", "clear_on_resume"]),
        (faust.App, "_crash", ["self", "reason"]),
        (ThrowableQueue, "clear", ["self"]),
    ],
)
def test_the_private_methods_we_override_or_call_keep_their_signature(
    owner: type, name: str, params: list[str]
) -> None:
    assert _params(getattr(owner, name)) == params


@pytest.mark.parametrize(
    "attribute",
    [
        "_acked",
        "_acked_index",
        "_gap",
        "_committed_offset",
        "_unacked_messages",
        "_buffered_partitions",
        "_paused_partitions",
    ],
)
def test_faust_consumer_bookkeeping_is_where_the_commit_rule_reads_it(attribute: str) -> None:
    assert _assigned_in(faust_consumer.Consumer, attribute)


@pytest.mark.parametrize(
    "attribute", ["_fetch_max_bytes", "_fetch_max_wait_ms", "_isolation_level"]
)
def test_aiokafka_reads_the_consumer_settings_we_set_when_it_starts(attribute: str) -> None:
    """Set after the constructor and before start(): start() must be what reads them."""
    assert _assigned_in(aiokafka.AIOKafkaConsumer, attribute)
    assert f"self.{attribute}" in inspect.getsource(aiokafka.AIOKafkaConsumer.start)


def test_the_queue_marks_come_from_the_ratios_mode_uses() -> None:
    """mode pauses at ``maxsize / pressure_high_ratio`` (80%) and resumes at
    ``maxsize * pressure_drop_ratio`` (40%); AgentQueue computes the same from pause_at."""
    high, drop = ThrowableQueue.pressure_high_ratio, ThrowableQueue.pressure_drop_ratio
    assert (high, drop) == (1.25, 0.4)
    queue = AgentQueue(pause_at=100, flow_control=FlowControlEvent())
    assert (queue.pressure_high_size, queue.pressure_drop_size) == (80, 40)


async def test_faust_builds_our_transport_consumer_and_queues(tmp_path: Path) -> None:
    from streams.app import build_app
    from streams.kernel.settings import KafkaSettings
    from streams.worker_settings import WorkerSettings

    app = build_app(WorkerSettings(kafka=KafkaSettings(), data_dir=str(tmp_path)))
    transport = app.transport  # Faust's property, built by our _new_transport
    assert isinstance(transport, KafkaTransport) and transport.Consumer is _Consumer
    consumer = transport.create_consumer(
        callback=_noop, on_partitions_revoked=_noop, on_partitions_assigned=_noop
    )
    assert isinstance(consumer, _Consumer)
    thread = consumer._thread  # built by Faust's ThreadDelegateConsumer from our factory
    thread.thread_loop.close()  # mode's ServiceThread opens its own loop; never started here
    assert isinstance(thread, _ConsumerThread)
    queue = app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    assert isinstance(queue, AgentQueue) and queue.pause_at == 10


async def test_crash_marks_the_app_crashed_with_the_reason(tmp_path: Path) -> None:
    from streams.app import build_app
    from streams.kernel.settings import KafkaSettings
    from streams.worker_settings import WorkerSettings

    app = build_app(WorkerSettings(kafka=KafkaSettings(), data_dir=str(tmp_path)))
    reason = RuntimeError("lane failed")
    hooks.crash(app, reason)
    assert app.crashed and app.crash_reason is reason


def test_the_producer_accessor_reaches_faust_s_aiokafka_producer() -> None:
    producer = faust_aiokafka.Producer.__new__(faust_aiokafka.Producer)
    sentinel = object()
    producer._producer = sentinel  # type: ignore[assignment]
    app = type("App", (), {"producer": producer})()
    assert hooks.kafka_producer(app) is sentinel


def test_the_monitor_keeps_its_collectors_where_the_lean_monitor_reads_them() -> None:
    assert _assigned_in(PrometheusMonitor, "_metrics")
    assert set(PER_EVENT_SERIES) <= set(FaustMetrics._fields)


def test_the_memory_store_drops_revoked_keys_by_the_partitions_we_record() -> None:
    """key_partitions: the parking lot and the dedup horizon enter their own writes where
    Faust's memory store finds the keys of partitions it no longer owns."""
    from faust.stores import memory

    assert _assigned_in(memory.Store, "_key_partition")
    # After a recovery the store drops the keys of partitions no longer active, by this map.
    dropped = inspect.getsource(memory.Store.on_recovery_completed)
    assert "self._key_partition" in dropped
    store = memory.Store.__new__(memory.Store)
    store._key_partition = {b"k": 3}
    assert hooks.key_partitions(store) == {b"k": 3}
    assert hooks.key_partitions({}) is None  # a plain mapping keeps none
