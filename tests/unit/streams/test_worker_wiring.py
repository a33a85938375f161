"""build_worker_app passes collaborators at construction: nothing is set on an object after
it was built, and what depends on something built later reads it when called."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from streams import worker
from streams.kernel.contract import ControlAction, ControlChanged, ControlKind
from streams.kernel.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.kernel.settings import KafkaSettings
from streams.worker_service import WorkerService
from streams.worker_settings import WorkerSettings


class _Gateway:
    name = "stub"
    url_setting = "ZAP_API_URL"

    async def send_text(self, message: TextMessage) -> SendAccepted:
        raise AssertionError("nothing is sent here")

    async def list_for_reconciliation(
        self, instance_id: str, *, references: Sequence[str] = (), **_: object
    ) -> list[ListedJob] | None:
        return []

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        return CancelOutcome.UNSUPPORTED

    async def probe_configuration(self, instance_id: str) -> str:
        return "fine"

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    # Faust's Prometheus collectors go to the default registry once per process (the
    # prefix test builds a worker app too): not what these tests are about.
    monkeypatch.setattr(worker, "setup_lean_prometheus", lambda app: None)
    settings = WorkerSettings(
        kafka=KafkaSettings(partitions=4),
        data_dir=str(tmp_path),
        start_probe=False,
        lag_monitor=False,
    )
    return worker.build_worker_app(settings, _Gateway())  # type: ignore[arg-type]


def test_the_pauses_count_what_the_parking_lot_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, dispatcher = _build(tmp_path, monkeypatch)
    lot, pauses = dispatcher.parking, dispatcher.processor.pauses
    lot._per_instance["shop"] = 7  # what parking 7 of shop's messages leaves in the index
    lot._built = True
    assert pauses.waiting("shop") == 7 == lot.waiting("shop")


def test_an_operators_resume_slows_the_instances_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, dispatcher = _build(tmp_path, monkeypatch)
    processor = dispatcher.processor
    started: list[str] = []
    processor.pacer.slow_start = lambda instance, now: started.append(instance)  # a spy

    def control(action: ControlAction) -> ControlChanged:
        return ControlChanged(
            kind=ControlKind.INSTANCE,
            target="shop",
            action=action,
            reason="maintenance",
            actor="ops",
            at=None,
            control_id=1,
        )

    processor.controls.apply(control(ControlAction.PAUSE), 1.0)
    processor.controls.apply(control(ControlAction.RESUME), 2.0)
    assert started == ["shop"]


def test_the_worker_service_starts_first_and_answers_readyz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, _ = _build(tmp_path, monkeypatch)
    assert isinstance(app.resources[0], WorkerService)
    assert app.resources[0].readiness() == (False, "created")
