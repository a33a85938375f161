"""The worker's Faust monitor keeps Faust's offset series and drops its per-event work."""

from __future__ import annotations

from pathlib import Path

from faust.types import TP
from prometheus_client import CollectorRegistry

from streams.app import build_app
from streams.faust_adapter.monitor import LeanPrometheusMonitor, setup_lean_prometheus
from streams.kernel.settings import KafkaSettings
from streams.worker_settings import WorkerSettings


def _series(registry: CollectorRegistry) -> dict[str, float]:
    return {s.name: s.value for m in registry.collect() for s in m.samples}


def test_per_event_series_are_gone_and_offset_series_stay(tmp_path: Path) -> None:
    app = build_app(WorkerSettings(kafka=KafkaSettings(), data_dir=str(tmp_path), app_id="lean"))
    registry = CollectorRegistry()
    setup_lean_prometheus(app, registry=registry)

    assert isinstance(app.monitor, LeanPrometheusMonitor)
    families = {m.name for m in registry.collect()}
    assert "lean_messages_received" not in families
    assert "lean_active_messages" not in families
    assert "lean_total_active_events" not in families
    assert "lean_topic_partition_offset_commited" in families
    assert "lean_topic_partition_end_offset" in families

    tp = TP("zapstream.intents", 3)
    app.monitor.on_tp_commit({tp: 41})
    app.monitor.track_tp_end_offset(tp, 57)
    series = _series(registry)
    committed = [v for k, v in series.items() if k.startswith("lean_topic_partition_offset_c")]
    ended = [v for k, v in series.items() if k.startswith("lean_topic_partition_end_offset")]
    assert committed == [41.0]
    assert ended == [57.0]


def test_per_message_hooks_leave_every_series_alone(tmp_path: Path) -> None:
    app = build_app(WorkerSettings(kafka=KafkaSettings(), data_dir=str(tmp_path), app_id="lean2"))
    registry = CollectorRegistry()
    setup_lean_prometheus(app, registry=registry)
    before = _series(registry)

    class _Message:
        pass

    message = _Message()
    tp = TP("zapstream.intents", 0)
    app.monitor.on_message_in(tp, 5, message)  # type: ignore[arg-type]
    app.monitor.on_message_out(tp, 5, message)  # type: ignore[arg-type]

    assert _series(registry) == before
    assert not hasattr(message, "time_in")  # Faust's base monitor would stamp it
