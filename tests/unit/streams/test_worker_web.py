"""The worker's web port serves our health and metrics paths, never Faust's table pages."""

from __future__ import annotations

from pathlib import Path

from streams.app import build_app
from streams.kernel.settings import KafkaSettings
from streams.worker_settings import WorkerSettings


def test_faust_table_and_router_pages_are_not_served(tmp_path: Path) -> None:
    app = build_app(WorkerSettings(kafka=KafkaSettings(), data_dir=str(tmp_path), app_id="web"))
    # Faust's web server mounts the blueprints its settings enable (faust.web.base.Web).
    mounted = [prefix for prefix, _ in app.web._enabled_blueprints()]
    assert "/table" not in mounted and "/router" not in mounted, mounted
