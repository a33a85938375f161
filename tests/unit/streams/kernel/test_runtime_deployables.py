"""The runtime as the deployables use it: health routes on a foreign app, a taken metrics port
refused in one line, the lag monitor and the pipeline gauges as services, the CLI's one
exit-2 rendering and the relay run as a service."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import socket
import time
from collections.abc import Callable

import aiohttp
import psycopg
import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from connectors import cli
from connectors.sink.pipeline_metrics import PipelineGauges
from streams.kernel.runtime.health import HealthEndpoint, add_health_routes
from streams.kernel.runtime.run import EXIT_REFUSED, run_until_signalled
from streams.kernel.runtime.service import ServiceState
from streams.kernel.settings import KafkaSettings, PostgresSettings
from streams.lag_monitor import GroupLag, LagMonitor


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_health_routes_mount_on_an_app_of_its_own_and_a_broken_probe_answers_503() -> None:
    calls = {"n": 0}

    def readiness() -> tuple[bool, str]:
        calls["n"] += 1
        if calls["n"] == 1:
            return True, "ready"
        raise RuntimeError("a bug in the probe")

    app = web.Application()
    app.router.add_get("/own", lambda request: web.Response(text="own route"))
    add_health_routes(app, readiness)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            async with http.get("/own") as reply:
                assert await reply.text() == "own route"
            async with http.get("/healthz") as reply:
                assert reply.status == 200
            async with http.get("/readyz") as reply:
                assert (reply.status, await reply.text()) == (200, "ready\n")
            async with http.get("/readyz") as reply:
                assert reply.status == 503 and "readiness unknown" in await reply.text()
            async with http.get("/metrics") as reply:
                assert "python_info" in await reply.text()
    finally:
        await runner.cleanup()


def test_a_taken_metrics_port_is_a_refused_start_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        endpoint = HealthEndpoint(
            port,
            bind_local=True,
            name="lag monitor",
            port_setting="ZAPSTREAM_LAG_METRICS_PORT",
            may_switch_off=False,
        )
        err = io.StringIO()
        assert run_until_signalled(endpoint, stderr=err) == EXIT_REFUSED
    [line] = err.getvalue().splitlines()
    assert line.startswith(
        f"zapstream: lag monitor health endpoint cannot start: cannot serve "
        f"metrics on 127.0.0.1:{port}"
    ), line
    assert line.endswith(": set ZAPSTREAM_LAG_METRICS_PORT to a free port")
    assert endpoint.state is ServiceState.STOPPED


class ScriptedLagMonitor(LagMonitor):
    """The monitor with its Kafka reading replaced: fails once, then reads nothing."""

    def __init__(self) -> None:
        super().__init__(KafkaSettings(), {"g": ["t"]}, interval_s=0.0)
        self.closed = 0
        self.open = False
        self.outcomes: list[Exception | None] = [KeyError("a bug"), None]

    async def _read_all(self) -> list[GroupLag]:
        self.open = True  # what connecting to Kafka does
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome
        return []

    async def _close_clients(self) -> None:
        if self.open:
            self.closed += 1
        self.open = False


async def test_the_lag_monitor_is_a_service_whose_timer_survives_a_failed_reading() -> None:
    monitor = ScriptedLagMonitor()
    assert monitor.state is ServiceState.CREATED
    async with monitor:
        assert monitor.state is ServiceState.RUNNING
        await _until(lambda: monitor.readings >= 3)
    assert monitor.state is ServiceState.STOPPED
    assert monitor.failed_readings == 1
    # Closed after the failed reading (start afresh) and once more on stop.
    assert monitor.closed == 2 and not monitor.open
    assert monitor.summary().endswith("of 1 groups, 1 failed")


class UnreachableGauges(PipelineGauges):
    """Gauges whose PostgreSQL refuses every connection."""

    async def _open(self) -> psycopg.AsyncConnection:  # type: ignore[type-arg]
        raise psycopg.OperationalError("connection failed: Connection refused")


def _failures() -> float:
    return REGISTRY.get_sample_value("zapstream_pipeline_metrics_failures_total") or 0.0


async def test_the_pipeline_gauges_outage_is_one_line_and_the_timer_keeps_its_rhythm(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _failures()
    gauges = UnreachableGauges(PostgresSettings(), interval_s=0.01)
    with caplog.at_level(logging.INFO, logger="connectors.sink.pipeline_metrics"):
        async with gauges:
            # No backoff: three failed reads within a few intervals.
            await _until(lambda: _failures() >= before + 3, timeout_s=2)
        await gauges.stop()  # idempotent
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert lines[0].startswith("pipeline gauges (PostgreSQL) unavailable"), lines
    assert "Connection refused" in lines[0] and gauges.reads == 0


def test_a_permanent_failure_in_a_command_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.upper().startswith("ZAPSTREAM_")]:
        monkeypatch.delenv(name)
    assert cli.main(["outbox", "restream", "--older-than", "soon"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("zapstream: --older-than: "), lines
