"""The worker keeps the runtime's contract under Faust: readiness, and one closing line."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from streams.health import add_health_pages, readiness
from streams.kernel.runtime.run import closing_line
from streams.kernel.runtime.service import Service
from streams.worker_service import WorkerService, WorkerTally


def test_the_tally_reads_as_one_line() -> None:
    tally = WorkerTally()
    assert tally.summary() == "0 intents, 0 receipts, 0 commands, 0 poison records"
    tally.intents.update({"ACCEPTED": 1200, "parked": 3, "duplicate": 1})
    tally.receipts, tally.commands, tally.poison = 2400, 2, 1
    assert tally.summary() == (
        "1,204 intents (1,200 ACCEPTED, 3 parked, 1 duplicate), 2,400 receipts, "
        "2 commands, 1 poison records"
    )


async def test_ready_only_while_running_and_streaming() -> None:
    streaming: list[tuple[bool, str]] = [(False, "rebalancing")]
    service = WorkerService(WorkerTally(), streaming=lambda: streaming[-1])
    assert service.readiness() == (False, "created")
    await service.start()
    assert service.readiness() == (False, "rebalancing")
    streaming.append((True, "streaming"))
    assert service.readiness() == (True, "streaming")
    await service.stop()
    assert service.readiness() == (False, "stopped")


async def test_stopping_logs_one_closing_line_in_the_runtime_format(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = iter([100.0, 112.5])
    tally = WorkerTally()
    tally.intents["ACCEPTED"] = 5
    service = WorkerService(tally, streaming=lambda: (True, "streaming"), clock=lambda: next(clock))
    caplog.set_level(logging.INFO, logger="zapstream")
    async with service:
        pass
    await service.stop()  # idempotent: still one line
    lines = [r.getMessage() for r in caplog.records if r.name == "zapstream"]
    assert lines == [closing_line(service, 12.5)]
    assert lines[0] == (
        "zapstream worker stopped after 12.5s: 5 intents (5 ACCEPTED), 0 receipts, "
        "0 commands, 0 poison records"
    )
    assert isinstance(service, Service)


def _app(**kw: Any) -> SimpleNamespace:
    consumer = SimpleNamespace(started=True, flow_active=kw.get("flow_active", True))
    return SimpleNamespace(consumer=consumer, rebalancing=False, in_recovery=False)


def test_the_apps_readiness_in_the_runtime_contract() -> None:
    assert readiness(_app()) == (True, "streaming")
    assert readiness(_app(flow_active=False)) == (False, "flow stopped")


class _Web:
    def text(self, body: str, status: int = 200) -> tuple[int, str]:
        return status, body


class _Pages:
    """Faust's ``app.page(path)(view)``, recorded."""

    def __init__(self) -> None:
        self.views: dict[str, Any] = {}

    def page(self, path: str) -> Any:
        def register(view: Any) -> Any:
            self.views[path] = view
            return view

        return register


@pytest.mark.parametrize(
    ("ready", "expected"),
    [((True, "streaming"), (200, "streaming\n")), ((False, "rebalancing"), (503, "rebalancing\n"))],
)
async def test_readyz_answers_like_the_runtime_health_endpoint(
    ready: tuple[bool, str], expected: tuple[int, str]
) -> None:
    pages = _Pages()
    add_health_pages(pages, lambda: ready)
    assert await pages.views["/readyz"](_Web(), None) == expected
    assert await pages.views["/healthz"](_Web(), None) == (200, "ok\n")
