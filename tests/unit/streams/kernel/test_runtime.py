"""The service runtime: lifecycle states, the signal runner, timers, backoff, outage log, health."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import random
import signal
import socket

import aiohttp
import pytest

from streams.kernel.errors import Failure
from streams.kernel.failures import StartRefused
from streams.kernel.runtime.backoff import Backoff
from streams.kernel.runtime.health import HealthEndpoint
from streams.kernel.runtime.outage import OutageLog, share_one_line
from streams.kernel.runtime.periodic import Periodic
from streams.kernel.runtime.run import EXIT_REFUSED, run_until_signalled
from streams.kernel.runtime.service import Service, ServiceState


class Recorder(Service):
    """A service that writes what happens to it into a shared journal."""

    def __init__(self, name: str, journal: list[str], *, fail_start: bool = False) -> None:
        super().__init__(name=name)
        self.journal = journal
        self.fail_start = fail_start
        self.seen: list[ServiceState] = []

    async def on_start(self) -> None:
        self.seen.append(self.state)
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.journal.append(f"start {self.name}")

    async def on_stop(self) -> None:
        self.seen.append(self.state)
        self.journal.append(f"stop {self.name}")


async def test_states_move_forward_and_start_stop_are_idempotent() -> None:
    service = Recorder("top", [])
    assert service.state is ServiceState.CREATED
    await service.start()
    await service.start()
    assert service.state is ServiceState.RUNNING and service.readiness() == (True, "running")
    await service.stop()
    await service.stop()
    assert service.state is ServiceState.STOPPED
    assert service.seen == [ServiceState.STARTING, ServiceState.DRAINING]
    assert service.journal == ["start top", "stop top"]
    assert service.readiness() == (False, "stopped")
    with pytest.raises(RuntimeError, match="cannot start again"):
        await service.start()


async def test_children_start_after_and_stop_before_their_parent() -> None:
    journal: list[str] = []
    top = Recorder("top", journal)
    top.add_child(Recorder("a", journal))
    top.add_child(Recorder("b", journal))
    async with top:
        assert journal == ["start top", "start a", "start b"]
    assert journal == ["start top", "start a", "start b", "stop b", "stop a", "stop top"]


async def test_a_failed_start_stops_what_it_started_and_raises() -> None:
    journal: list[str] = []
    top = Recorder("top", journal)
    top.add_child(Recorder("a", journal))
    top.add_child(Recorder("b", journal, fail_start=True))
    with pytest.raises(RuntimeError, match="b cannot start"):
        await top.start()
    # b's own on_stop runs too: it may have opened something before it failed.
    assert journal == ["start top", "start a", "stop b", "stop a", "stop top"]
    assert top.state is ServiceState.STOPPED


class Draining(Service):
    """Runs until asked to stop, then takes ``drain_s`` to finish."""

    name = "drainer"

    def __init__(self, drain_s: float) -> None:
        super().__init__()
        self.drain_s = drain_s
        self.finished = False

    async def on_start(self) -> None:
        # The signal arrives once the service runs: the runner's handlers are in place.
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

    async def run(self) -> None:
        await self.wait_stop_requested()
        await asyncio.sleep(self.drain_s)
        self.finished = True

    def summary(self) -> str:
        return f"finished={self.finished}"


def test_sigterm_drains_and_ends_with_one_closing_line(caplog: pytest.LogCaptureFixture) -> None:
    service = Draining(drain_s=0.05)
    with caplog.at_level(logging.INFO, logger="zapstream"):
        assert run_until_signalled(service, drain_s=5) == 0
    assert service.finished and service.state is ServiceState.STOPPED
    closing = [r.getMessage() for r in caplog.records if "stopped after" in r.getMessage()]
    assert len(closing) == 1 and closing[0].startswith("zapstream drainer stopped after")
    assert closing[0].endswith("finished=True")


def test_a_drain_past_its_bound_is_cut_short(caplog: pytest.LogCaptureFixture) -> None:
    service = Draining(drain_s=60)
    with caplog.at_level(logging.WARNING, logger="zapstream"):
        assert run_until_signalled(service, drain_s=0.1) == 0
    assert not service.finished and service.state is ServiceState.STOPPED
    assert any("did not drain within" in r.getMessage() for r in caplog.records)


class Refused(Service):
    name = "relay"

    async def on_start(self) -> None:
        raise StartRefused("wal_level is replica", hint="set wal_level=logical and restart")


def test_a_refused_start_is_one_line_and_exit_2() -> None:
    err = io.StringIO()
    assert run_until_signalled(Refused(), stderr=err) == EXIT_REFUSED
    lines = err.getvalue().splitlines()
    assert lines == [
        "zapstream: relay cannot start: wal_level is replica: set wal_level=logical and restart"
    ]


def test_a_transient_failure_at_start_is_not_a_refusal() -> None:
    class Away(Service):
        async def on_start(self) -> None:
            raise Failure("connection refused", dependency="kafka", retriable=True)

    with pytest.raises(Failure, match="connection refused"):
        run_until_signalled(Away())


async def test_periodic_backs_off_after_failures_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes = [OSError("refused"), OSError("refused"), None, None]
    calls = asyncio.Event()

    async def job() -> None:
        outcome = outcomes.pop(0) if outcomes else None
        if not outcomes:
            calls.set()
        if outcome is not None:
            raise outcome

    timer = Periodic("probe", 0.0, job, retry_s=0.001, max_retry_s=0.004)
    assert [timer.backoff.next_delay_s() for _ in range(4)] == [0.001, 0.002, 0.004, 0.004]
    timer.backoff.reset()
    with caplog.at_level(logging.INFO):
        async with timer:
            await asyncio.wait_for(calls.wait(), 5)
    assert timer.state is ServiceState.STOPPED and timer.failures == 0 and timer.runs >= 4
    text = caplog.text
    assert text.count("probe unavailable") == 1 and text.count("probe available again") == 1


async def test_periodic_logs_a_bug_once_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0
    enough = asyncio.Event()

    async def job() -> None:
        nonlocal runs
        runs += 1
        if runs >= 3:
            enough.set()
        raise KeyError("bug")

    with caplog.at_level(logging.ERROR):
        async with Periodic("buggy", 0.0, job, retry_s=0.001, max_retry_s=0.001):
            await asyncio.wait_for(enough.wait(), 5)
    errors = [r for r in caplog.records if "buggy failed" in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info is not None


def test_outage_log_once_each_way_quiet_and_flapping(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    quiet = [False]
    ended: list[float] = []
    outage = OutageLog(
        "Kafka",
        logging.getLogger("t"),
        quiet=lambda: quiet[0],
        flap_window_s=60,
        on_end=ended.append,
        clock=lambda: now[0],
    )
    with caplog.at_level(logging.INFO, logger="t"):
        outage.failed("refused", delay_s=1.0)
        outage.failed(ConnectionRefusedError("again"))
        now[0] = 5.0
        outage.recovered()
        now[0] = 10.0  # flapping: within 60 s of the recovery line
        outage.failed("refused")
        outage.recovered()
        now[0] = 100.0
        quiet[0] = True  # another line already says it
        outage.failed("refused")
        outage.recovered()
        quiet[0] = False
        outage.failed("broker gone")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "Kafka unavailable, retrying with backoff (next try in 1.0s): refused",
        "Kafka available again after 5.0s and 2 failed attempts",
        "Kafka unavailable, retrying with backoff: broker gone",
    ]
    assert outage.outages == 4 and ended == [5.0, 0.0, 0.0]


def _relay_outages(now: list[float]) -> tuple[OutageLog, OutageLog]:
    """The relay's replication and slot-metrics outages, sharing one line, on a fake clock."""
    log = logging.getLogger("t")
    stream = OutageLog("PostgreSQL", log, clock=lambda: now[0])
    metrics = OutageLog("PostgreSQL (slot metrics)", log, clock=lambda: now[0])
    share_one_line(stream, metrics, window_s=60)
    return stream, metrics


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_outages_sharing_one_line_log_only_the_first_to_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    stream, metrics = _relay_outages(now)
    with caplog.at_level(logging.INFO, logger="t"):
        stream.failed("connection lost")  # the primary died: the stream notices first
        metrics.failed("connection lost")
        metrics.recovered()
        stream.recovered()
        now[0] = 30.0  # an idle connection fails at its next use, after the recovery: quiet
        metrics.failed("connection lost")
        metrics.recovered()
        now[0] = 100.0
        metrics.failed("statement timeout")  # alone this time: its own line
        stream.failed("connection lost")
        metrics.recovered()
    assert _messages(caplog) == [
        "PostgreSQL unavailable, retrying with backoff: connection lost",
        "PostgreSQL available again after 0.0s and 1 failed attempts",
        "PostgreSQL (slot metrics) unavailable, retrying with backoff: statement timeout",
        "PostgreSQL (slot metrics) available again after 0.0s and 1 failed attempts",
    ]
    assert (stream.outages, metrics.outages) == (2, 3)  # counted, if quiet


def test_a_quiet_shared_outage_that_outlasts_the_announced_one_is_announced_late(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The slot metrics notice first and recover; the replication connection, quiet since it
    failed meanwhile, stays down: an operator must still hear of it, once."""
    now = [0.0]
    stream, metrics = _relay_outages(now)
    with caplog.at_level(logging.INFO, logger="t"):
        metrics.failed("hung")
        now[0] = 1.0
        stream.failed("connection lost")  # quiet: the metrics' line says it
        now[0] = 5.0
        metrics.recovered()
        now[0] = 30.0
        stream.failed("connection refused")  # still within the window of that recovery
        now[0] = 70.0
        stream.failed("connection refused")  # the window passed: said now, once
        now[0] = 80.0
        stream.failed("connection refused")
        stream.recovered()
    assert _messages(caplog) == [
        "PostgreSQL (slot metrics) unavailable, retrying with backoff: hung",
        "PostgreSQL (slot metrics) available again after 5.0s and 1 failed attempts",
        "PostgreSQL unavailable for 69s, retrying with backoff: connection refused",
        "PostgreSQL available again after 79.0s and 4 failed attempts",
    ]


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    backoff = Backoff(initial_s=1, max_s=4, rng=random.Random(7))
    delays = [backoff.next_delay_s() for _ in range(5)]
    for delay, cap in zip(delays, (1, 2, 4, 4, 4), strict=True):
        assert cap / 2 <= delay <= cap
    backoff.reset()
    assert backoff.next_delay_s() <= 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_health_endpoint_serves_three_paths_and_closes() -> None:
    state = {"ready": (False, "standby")}
    port = _free_port()
    endpoint = HealthEndpoint(port, bind_local=True, readiness=lambda: state["ready"], name="t")
    async with endpoint, aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{port}"
        async with http.get(f"{base}/healthz") as reply:
            assert reply.status == 200
        async with http.get(f"{base}/readyz") as reply:
            assert (reply.status, (await reply.text()).strip()) == (503, "standby")
        state["ready"] = (True, "streaming")
        async with http.get(f"{base}/readyz") as reply:
            assert reply.status == 200
        async with http.get(f"{base}/metrics") as reply:
            assert "zapstream_timer_errors_total" in await reply.text()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


async def test_a_crash_on_bug_timer_waits_out_outages_and_raises_a_bug_from_run() -> None:
    outcomes: list[Exception | None] = [OSError("refused"), None, ValueError("broken invariant")]

    async def job() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    timer = Periodic("retries", 0.0, job, retry_s=0.001, max_retry_s=0.001, crash_on_bug=True)
    async with timer:
        with pytest.raises(ValueError, match="broken invariant"):
            await asyncio.wait_for(timer.run(), 5)
    assert outcomes == [] and timer.runs == 2 and timer.outage.outages == 1


async def test_health_endpoint_closes_an_idle_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp keeps an idle keep-alive connection for an hour unless told otherwise."""
    import streams.kernel.runtime.health as health

    monkeypatch.setattr(health, "IDLE_CONNECTION_TIMEOUT_S", 0.3)
    port = _free_port()
    async with HealthEndpoint(port, bind_local=True, name="t"):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            # The server, not the client, ends the idle connection: read until EOF.
            await asyncio.wait_for(reader.read(), timeout=10)
            assert reader.at_eof()
        finally:
            writer.close()
