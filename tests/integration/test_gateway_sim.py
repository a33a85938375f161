"""The gateway simulator driven by the real clients over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import pathlib
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from pydantic import SecretStr

from connectors.gateways.stackzap import StackZapClient
from connectors.gateways.zapapi import ZapApiClient
from connectors.webhook.signature import verify_signature
from devtools.simulator.gateway_sim import GatewaySimulator, SimConfigError
from streams.kernel.contract import JobStatus
from streams.kernel.errors import (
    PermanentGatewayError,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.kernel.ports import TextMessage
from streams.kernel.runtime.service import ServiceState
from streams.kernel.settings import GatewaySettings

pytestmark = pytest.mark.integration

API_KEY = "sim-key-0123456789"
TOKEN = "sim-token-0123456789"
DEADLINE_S = 10.0
REPO_ROOT = str(pathlib.Path(__file__).resolve().parents[2])


@pytest.fixture
async def sim() -> AsyncIterator[GatewaySimulator]:
    simulator = GatewaySimulator(api_key=API_KEY, token=TOKEN, seed=7, host="127.0.0.1", port=0)
    await simulator.start()
    assert simulator.port > 0
    try:
        yield simulator
    finally:
        await simulator.stop()


def gateway_settings(sim: GatewaySimulator, **overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "stackzap_api_url": sim.url,
        "stackzap_api_key": SecretStr(API_KEY),
        "zap_api_url": sim.url,
        "zap_token": SecretStr(TOKEN),
        "read_timeout_s": 5.0,
    }
    values.update(overrides)
    return GatewaySettings(**values)


@pytest.fixture
async def stackzap(sim: GatewaySimulator) -> AsyncIterator[StackZapClient]:
    async with StackZapClient(gateway_settings(sim)) as client:
        yield client


@pytest.fixture
async def zapapi(sim: GatewaySimulator) -> AsyncIterator[ZapApiClient]:
    async with ZapApiClient(gateway_settings(sim)) as client:
        yield client


def msg(n: int, instance: str = "inst-1") -> TextMessage:
    return TextMessage(
        instance_id=instance, to=f"55119{n:08d}", text=f"message {n}", reference=f"att-{n}"
    )


async def test_accepted_messages_are_recorded_with_reference(
    sim: GatewaySimulator, stackzap: StackZapClient, zapapi: ZapApiClient
) -> None:
    a = await stackzap.send_text(msg(1))
    b = await zapapi.send_text(msg(2, "inst-2"))
    assert a.status is JobStatus.ACCEPTED and a.gateway_status == "queued"
    assert b.status is JobStatus.ACCEPTED
    recorded = [(m.seq, m.api, m.instance, m.to, m.text, m.reference, m.id) for m in sim.messages]
    assert recorded == [
        (1, "stackzap", "inst-1", "5511900000001", "message 1", "att-1", a.gateway_job_id),
        (2, "zapapi", "inst-2", "5511900000002", "message 2", "att-2", b.gateway_job_id),
    ]
    assert sim.messages[0].arrived_at <= sim.messages[1].arrived_at <= time.time()

    async with httpx.AsyncClient(base_url=sim.url) as http:
        everything = (await http.get("/_sim/messages")).json()
        later = (await http.get("/_sim/messages", params={"since": 1})).json()
        stats = (await http.get("/_sim/stats")).json()
    assert [m["reference"] for m in everything] == ["att-1", "att-2"]
    assert [m["seq"] for m in later] == [2]
    assert {"seq", "api", "instance", "to", "text", "reference", "id", "arrived_at"} <= set(
        later[0]
    )
    assert stats["accepted"] == 2
    assert stats["requests"] == 2
    assert stats["by_outcome"] == {"accepted": 2}
    assert stats["by_api"] == {"stackzap": 1, "zapapi": 1}


async def test_bad_credentials_401_are_about_the_instance(sim: GatewaySimulator) -> None:
    from streams.kernel.errors import InstanceUnavailableError

    wrong = gateway_settings(sim, stackzap_api_key=SecretStr("nope"), zap_token=SecretStr("nope"))
    async with StackZapClient(wrong) as stackzap, ZapApiClient(wrong) as zapapi:
        for client in (stackzap, zapapi):
            with pytest.raises(InstanceUnavailableError) as info:
                await client.send_text(msg(1))
            assert info.value.status_code == 401
    missing = gateway_settings(sim, stackzap_api_key=SecretStr(""))
    async with StackZapClient(missing) as stackzap:
        with pytest.raises(InstanceUnavailableError):
            await stackzap.send_text(msg(1))
    assert sim.messages == []
    assert sim.stats()["by_outcome"] == {"unauthorized": 3}


async def test_error_rate_gives_transient_500(
    sim: GatewaySimulator, stackzap: StackZapClient, zapapi: ZapApiClient
) -> None:
    sim.configure(error_rate=1.0)
    for client in (stackzap, zapapi):
        with pytest.raises(TransientGatewayError) as info:
            await client.send_text(msg(1))
        assert info.value.status_code == 500
        assert info.value.retriable
    assert sim.messages == []
    # The listing is not faulted by default, so reconciliation still works.
    assert (await stackzap.list_jobs("inst-1")).items == ()


async def test_rate_limit_gives_transient_with_retry_after(
    sim: GatewaySimulator, stackzap: StackZapClient
) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        resp = await http.post("/_sim/config", json={"rate_limit_rate": 1.0, "retry_after_s": 2})
        assert resp.status_code == 200
        assert resp.json()["rate_limit_rate"] == 1.0
    with pytest.raises(TransientGatewayError) as info:
        await stackzap.send_text(msg(1))
    assert info.value.status_code == 429
    assert info.value.retry_after_s == 2.0
    sim.configure(retry_after_s=0.25)
    with pytest.raises(TransientGatewayError) as info:
        await stackzap.send_text(msg(2))
    assert info.value.retry_after_s == 0.25
    assert sim.messages == []


async def test_outage_answers_503_then_recovers(
    sim: GatewaySimulator, stackzap: StackZapClient
) -> None:
    outage_until = sim.configure(outage_s=1.0).outage_until
    assert outage_until is not None
    with pytest.raises(TransientGatewayError) as info:
        await stackzap.send_text(msg(1))
    assert info.value.status_code == 503
    assert info.value.retry_after_s == 1.0
    with pytest.raises(TransientGatewayError):
        await stackzap.list_jobs("inst-1")  # an outage hits every endpoint

    started = time.monotonic()
    attempts = 1
    while True:
        attempts += 1
        try:
            accepted = await stackzap.send_text(msg(attempts))
            break
        except TransientGatewayError as exc:
            assert exc.status_code == 503
            assert time.monotonic() - started < DEADLINE_S, "outage did not end"
            await asyncio.sleep(0.05)
    assert accepted.status is JobStatus.ACCEPTED
    assert [m.reference for m in sim.messages] == [f"att-{attempts}"]
    assert sim.messages[0].arrived_at >= outage_until
    assert sim.stats()["by_outcome"]["outage"] >= 2


async def test_dropped_response_is_uncertain_but_recorded(
    sim: GatewaySimulator, stackzap: StackZapClient, zapapi: ZapApiClient
) -> None:
    sim.configure(drop_response_rate=1.0)
    with pytest.raises(UncertainGatewayError):
        await stackzap.send_text(msg(1))
    with pytest.raises(UncertainGatewayError):
        await zapapi.send_text(msg(2))
    assert [(m.reference, m.dropped) for m in sim.messages] == [("att-1", True), ("att-2", True)]
    sim.configure(drop_response_rate=0.0)
    # The connection pool recovers: the next send works and finds the dropped one queued.
    await stackzap.send_text(msg(3))
    page = await stackzap.list_jobs("inst-1")
    assert [j.reference for j in page.items] == ["att-1", "att-3"]
    assert sim.stats()["by_outcome"] == {"dropped": 2, "accepted": 1, "listed": 1}


async def test_listing_paginates_and_hides_references(
    sim: GatewaySimulator, stackzap: StackZapClient
) -> None:
    sent = [await stackzap.send_text(msg(n)) for n in range(250)]
    await stackzap.send_text(msg(999, "other-instance"))

    first = await stackzap.list_jobs("inst-1", page_size=100)
    assert (first.page, first.total, first.next_page, len(first.items)) == (1, 250, 2, 100)
    assert first.counts == {"queued": 250}
    assert first.items[0].to == "5511900000000" and first.items[0].text == "message 0"
    pages = [p async for p in stackzap.iter_pages("inst-1", page_size=100)]
    assert [(p.page, len(p.items)) for p in pages] == [(1, 100), (2, 100), (3, 50)]
    jobs = [j async for j in stackzap.iter_jobs("inst-1", page_size=100)]
    assert [j.id for j in jobs] == [s.gateway_job_id for s in sent]
    assert [j.reference for j in jobs] == [f"att-{n}" for n in range(250)]
    assert all(j.status is JobStatus.ACCEPTED and j.created_at for j in jobs)

    sim.configure(hide_references=True)
    hidden = await stackzap.list_jobs("inst-1", page=3, page_size=100)
    assert len(hidden.items) == 50 and hidden.next_page is None
    assert all(j.reference is None for j in hidden.items)

    sim.set_job_status("sent", ids=[s.gateway_job_id or "" for s in sent[:10]])
    only_sent = await stackzap.list_jobs("inst-1", status="sent")
    assert only_sent.total == 10
    assert only_sent.counts == {"queued": 240, "sent": 10}


async def test_unknown_instance_404_is_about_the_instance(
    sim: GatewaySimulator, stackzap: StackZapClient, zapapi: ZapApiClient
) -> None:
    from streams.kernel.errors import InstanceUnavailableError

    sim.configure(reject_instances=["ghost"])
    for client in (stackzap, zapapi):
        with pytest.raises(InstanceUnavailableError, match="unknown instance") as info:
            await client.send_text(msg(1, "ghost"))
        assert info.value.status_code == 404 and info.value.scope == "instance"
    await stackzap.send_text(msg(2, "alive"))
    assert [m.instance for m in sim.messages] == ["alive"]


async def test_unknown_initial_status_is_review(
    sim: GatewaySimulator, stackzap: StackZapClient, zapapi: ZapApiClient
) -> None:
    sim.configure(initial_status="weird")
    for client in (stackzap, zapapi):
        accepted = await client.send_text(msg(1))
        assert accepted.status is JobStatus.REVIEW
        assert accepted.gateway_status == "weird"
    sim.configure(initial_status="failed")
    with pytest.raises(PermanentGatewayError):
        await stackzap.send_text(msg(2))


async def test_id_field_fallbacks_over_http(
    sim: GatewaySimulator, stackzap: StackZapClient, zapapi: ZapApiClient
) -> None:
    sim.configure(id_field="jobId")
    assert (await stackzap.send_text(msg(1))).gateway_job_id == sim.messages[-1].id
    sim.configure(id_field="messageId")
    assert (await zapapi.send_text(msg(2))).gateway_job_id == sim.messages[-1].id


async def test_cancel_queued_then_conflict_once_sent(
    sim: GatewaySimulator, stackzap: StackZapClient
) -> None:
    queued = await stackzap.send_text(msg(1))
    sent = await stackzap.send_text(msg(2))
    assert queued.gateway_job_id and sent.gateway_job_id
    async with httpx.AsyncClient(base_url=sim.url) as http:
        resp = await http.post(
            "/_sim/jobs/status", json={"status": "sent", "ids": [sent.gateway_job_id]}
        )
    assert resp.json() == {"updated": 1}

    assert await stackzap.cancel("inst-1", queued.gateway_job_id) is True
    assert await stackzap.cancel("inst-1", queued.gateway_job_id) is True  # idempotent
    assert await stackzap.cancel("inst-1", sent.gateway_job_id) is False
    with pytest.raises(PermanentGatewayError) as info:
        await stackzap.cancel("inst-1", "no-such-job")
    assert info.value.status_code == 404
    statuses = {j.id: j.status async for j in stackzap.iter_jobs("inst-1")}
    assert statuses == {
        queued.gateway_job_id: JobStatus.CANCELLED,
        sent.gateway_job_id: JobStatus.ACCEPTED,
    }


async def test_faults_are_deterministic_given_a_seed(
    sim: GatewaySimulator, stackzap: StackZapClient
) -> None:
    async def run() -> list[str]:
        outcomes = []
        for n in range(40):
            try:
                await stackzap.send_text(msg(n))
                outcomes.append("ok")
            except TransientGatewayError as exc:
                outcomes.append(str(exc.status_code))
        return outcomes

    async with httpx.AsyncClient(base_url=sim.url) as http:
        config = {"seed": 1234, "error_rate": 0.3, "rate_limit_rate": 0.2, "retry_after_s": 0}
        assert (await http.post("/_sim/config", json=config)).status_code == 200
        first = await run()
        assert (await http.post("/_sim/reset")).status_code == 200
        assert sim.messages == [] and sim.config.error_rate == 0.0
        assert (await http.post("/_sim/config", json=config)).status_code == 200
        second = await run()
    assert first == second
    assert {"ok", "429", "500"} <= set(first)


async def test_config_validation(sim: GatewaySimulator) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        for bad in ({"error_rate": 2}, {"bogus": 1}, {"latency_ms": -1}, {"fault_scope": "x"}):
            resp = await http.post("/_sim/config", json=bad)
            assert resp.status_code == 400, bad
        assert (await http.get("/_sim/config")).json()["error_rate"] == 0.0
    with pytest.raises(SimConfigError):
        sim.configure(error_rate="high")


async def test_latency_and_fault_scope_all(sim: GatewaySimulator, stackzap: StackZapClient) -> None:
    sim.configure(latency_ms=150)
    started = time.monotonic()
    await stackzap.send_text(msg(1))
    assert time.monotonic() - started >= 0.14
    sim.configure(latency_ms=0, error_rate=1.0, fault_scope="all")
    with pytest.raises(TransientGatewayError):
        await stackzap.list_jobs("inst-1")


async def test_read_timeout_against_slow_simulator_is_uncertain(sim: GatewaySimulator) -> None:
    sim.configure(latency_ms=1000)
    async with StackZapClient(gateway_settings(sim, read_timeout_s=0.2)) as client:
        with pytest.raises(UncertainGatewayError):
            await client.send_text(msg(1))


async def test_default_pool_does_not_cap_concurrency(sim: GatewaySimulator) -> None:
    """256 concurrent sends (the worker's default max in flight) are all at the gateway at
    once, not pool-size at a time: at 50 ms, 3,000 msg/s needs ~150 sends in flight.

    Counted where they arrive (the simulator's peak of sends it holds at once), not timed:
    the old default of 32 connections let 32 through, whatever the machine's load. A
    second of latency leaves a busy machine time to get every request out."""
    settings = gateway_settings(sim)
    assert settings.max_connections >= 256
    async with StackZapClient(settings) as client:
        # Open the connections first (at 0 ms), so the figure is about the pool, not about
        # how fast a busy machine accepts 256 new connections.
        await asyncio.gather(*(client.send_text(msg(n)) for n in range(256)))
        sim.configure(latency_ms=1000)
        started = time.monotonic()
        results = await asyncio.gather(*(client.send_text(msg(n)) for n in range(256, 512)))
        elapsed = time.monotonic() - started
    peak = sim.stats()["peak_concurrent_sends"]
    print(f"256 concurrent sends at 1 s latency: {peak} at the gateway at once, {elapsed:.2f} s")
    assert all(r.status is JobStatus.ACCEPTED for r in results)
    assert sim.stats()["accepted"] == 512
    assert peak > 128, f"the pool capped concurrency: {peak} sends at the gateway at once"


async def test_pool_wait_is_transient_and_never_reaches_the_gateway(sim: GatewaySimulator) -> None:
    sim.configure(latency_ms=1000)
    settings = gateway_settings(sim, max_connections=1, pool_timeout_s=0.1, connect_timeout_s=0.1)
    async with StackZapClient(settings) as client:
        holder = asyncio.create_task(client.send_text(msg(1)))
        for _ in range(int(DEADLINE_S / 0.01)):  # poll until the gateway holds it
            if sim.stats()["requests"] >= 1:
                break
            await asyncio.sleep(0.01)
        assert sim.stats()["requests"] == 1
        with pytest.raises(TransientGatewayError, match="PoolTimeoutError"):
            await client.send_text(msg(2))
        assert (await holder).status is JobStatus.ACCEPTED
    assert [m.reference for m in sim.messages] == [msg(1).reference]


async def test_connect_refused_is_transient() -> None:
    simulator = GatewaySimulator()
    await simulator.start()
    url = simulator.url
    await simulator.stop()
    await simulator.stop()  # idempotent
    async with StackZapClient(GatewaySettings(stackzap_api_url=url)) as client:
        with pytest.raises(TransientGatewayError):
            await client.send_text(msg(1))


async def test_the_simulator_is_a_runtime_service() -> None:
    simulator = GatewaySimulator()
    assert simulator.state is ServiceState.CREATED
    async with simulator:
        assert simulator.state is ServiceState.RUNNING
        port = simulator.port
        await simulator.start()  # idempotent: the same server
        assert simulator.port == port
        assert simulator.readiness() == (True, "running")
        async with StackZapClient(GatewaySettings(stackzap_api_url=simulator.url)) as client:
            assert (await client.send_text(msg(1))).status is JobStatus.ACCEPTED
    assert simulator.state is ServiceState.STOPPED
    assert simulator.summary() == "1 requests, 1 messages accepted"
    with pytest.raises(RuntimeError, match="cannot start again"):
        await simulator.start()


async def test_a_port_in_use_fails_the_start_and_leaves_it_stopped() -> None:
    async with GatewaySimulator() as holder:
        taken = GatewaySimulator(port=holder.port)
        with pytest.raises(OSError):
            await taken.start()
        assert taken.state is ServiceState.STOPPED
        await taken.stop()  # idempotent after a failed start


async def test_command_line_entry_point() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devtools.simulator.gateway_sim",
        "--port",
        "0",
        "--api-key",
        API_KEY,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    assert proc.stderr is not None
    log_lines: list[str] = []
    try:
        port = None
        async with asyncio.timeout(DEADLINE_S):
            while port is None:
                line = (await proc.stderr.readline()).decode()
                assert line, f"simulator exited: {''.join(log_lines)}"
                log_lines.append(line)
                if found := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
                    port = int(found.group(1))
        assert API_KEY not in "".join(log_lines)
        url = f"http://127.0.0.1:{port}"
        async with StackZapClient(
            GatewaySettings(stackzap_api_url=url, stackzap_api_key=SecretStr(API_KEY))
        ) as client:
            assert (await client.send_text(msg(1))).status is JobStatus.ACCEPTED
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/_sim/health")).json()["ok"] is True
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(DEADLINE_S):
            rest = await proc.stderr.read()
            code = await proc.wait()
    assert code == 0, "".join(log_lines) + rest.decode()
    assert "5511900000001" not in rest.decode()
    # The runtime's one closing line (run_until_signalled), with the simulator's counts.
    assert re.search(
        r"zapstream gateway-sim stopped after [\d.]+s: 1 requests, 1 messages accepted",
        rest.decode(),
    )


async def test_fail_recipients_answer_503_first_then_accept(
    sim: GatewaySimulator, stackzap: StackZapClient, zapapi: ZapApiClient
) -> None:
    flaky, other = msg(1), msg(2)
    async with httpx.AsyncClient(base_url=sim.url) as http:
        resp = await http.post("/_sim/config", json={"fail_recipients": {flaky.to: 3}})
        assert resp.status_code == 200
        assert resp.json()["fail_recipients"] == {flaky.to: 3}
        for client in (stackzap, zapapi, stackzap):
            with pytest.raises(TransientGatewayError) as info:
                await client.send_text(flaky)
            assert info.value.status_code == 503
            assert info.value.retry_after_s == 0.0
            # Other recipients are unaffected while the flaky one fails.
            assert (await client.send_text(other)).status is JobStatus.ACCEPTED
        assert (await http.get("/_sim/config")).json()["fail_recipients"] == {flaky.to: 0}
        assert (await stackzap.send_text(flaky)).status is JobStatus.ACCEPTED
        assert (await zapapi.send_text(flaky)).status is JobStatus.ACCEPTED
    assert [m.to for m in sim.messages] == [other.to] * 3 + [flaky.to] * 2
    assert sim.stats()["by_outcome"] == {"recipient_failed": 3, "accepted": 5}


async def test_fail_recipients_count_only_requests_that_pass_auth(
    sim: GatewaySimulator, stackzap: StackZapClient
) -> None:
    sim.configure(fail_recipients={msg(1).to: 1})
    wrong = gateway_settings(sim, stackzap_api_key=SecretStr("nope"))
    async with StackZapClient(wrong) as unauthorized:
        with pytest.raises(TransientGatewayError) as refused:  # InstanceUnavailableError
            await unauthorized.send_text(msg(1))
        assert refused.value.scope == "instance"
    assert sim.config.fail_recipients == {msg(1).to: 1}
    with pytest.raises(TransientGatewayError):
        await stackzap.send_text(msg(1))
    await stackzap.send_text(msg(1))
    assert len(sim.messages) == 1


async def test_new_config_keys_are_validated_and_the_secret_masked(sim: GatewaySimulator) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as http:
        for bad in (
            {"fail_recipients": {"5511": -1}},
            {"fail_recipients": {"5511": True}},
            {"fail_recipients": ["5511"]},
            {"callback_url": "ftp://x"},
            {"callback_secret": 5},
            {"callback_statuses": ["sent", ""]},
            {"callback_delay_ms": -1},
        ):
            assert (await http.post("/_sim/config", json=bad)).status_code == 400, bad
        secret = "callback-secret-0123456789"
        resp = await http.post(
            "/_sim/config",
            json={"callback_url": "http://127.0.0.1:1/cb", "callback_secret": secret},
        )
        assert resp.status_code == 200
        shown = (await http.get("/_sim/config")).json()
    assert secret not in resp.text and secret not in str(shown)
    assert shown["callback_url"] == "http://127.0.0.1:1/cb"
    assert shown["callback_statuses"] == ["sent", "delivered", "read"]
    assert shown["callback_delay_ms"] == 50.0
    assert sim.config.callback_secret == secret


class CallbackReceiver:
    """A tiny HTTP server recording the callbacks it gets, answering ``answer``."""

    def __init__(self) -> None:
        self.received: list[tuple[bytes, str | None]] = []
        self.answer = 202
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        self.received.append((await request.read(), request.headers.get("X-Zap-Signature")))
        return web.Response(status=self.answer)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/cb", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/cb"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[CallbackReceiver]:
    r = CallbackReceiver()
    await r.start()
    try:
        yield r
    finally:
        await r.stop()


async def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_callbacks_follow_each_accepted_message_signed_and_in_order(
    sim: GatewaySimulator,
    stackzap: StackZapClient,
    zapapi: ZapApiClient,
    receiver: CallbackReceiver,
) -> None:
    sim.configure(
        callback_url=receiver.url,
        callback_secret="cb-secret",
        callback_statuses=["sent", "delivered"],
        callback_delay_ms=10,
    )
    sim.configure(drop_response_rate=1.0)
    with pytest.raises(UncertainGatewayError):
        await zapapi.send_text(msg(1))  # accepted, answer lost: callbacks still come
    sim.configure(drop_response_rate=0.0)
    b = await stackzap.send_text(msg(2))
    await wait_for(lambda: sim.stats()["callbacks_sent"] == 4, "four callbacks")
    assert sim.stats()["callbacks_failed"] == 0
    bodies = [orjson.loads(raw) for raw, _ in receiver.received]
    gateway = receiver.url.rstrip("/").rsplit("/", 1)[-1]
    assert all(
        verify_signature("cb-secret", raw, sig, gateway=gateway) for raw, sig in receiver.received
    )
    for m in sim.messages:
        mine = [(x["status"], x["reference"]) for x in bodies if x["id"] == m.id]
        assert mine == [("sent", m.reference), ("delivered", m.reference)]
    assert len({x["event_id"] for x in bodies}) == 4
    assert all(abs(x["timestamp"] - time.time()) < 60 for x in bodies)
    # The gateway's own job state moved with its callbacks.
    assert [m.status for m in sim.messages] == ["delivered", "delivered"]
    assert await stackzap.cancel("inst-1", b.gateway_job_id or "") is False


async def test_callback_failures_are_counted_never_raised(
    sim: GatewaySimulator, stackzap: StackZapClient, receiver: CallbackReceiver
) -> None:
    receiver.answer = 500
    sim.configure(callback_url=receiver.url, callback_statuses=["sent"], callback_delay_ms=0)
    await stackzap.send_text(msg(1))
    await wait_for(lambda: sim.stats()["callbacks_failed"] == 1, "a refused callback")
    closed = GatewaySimulator()
    await closed.start()
    dead_url = f"{closed.url}/nowhere"
    await closed.stop()
    sim.configure(callback_url=dead_url)
    await stackzap.send_text(msg(2))
    await wait_for(lambda: sim.stats()["callbacks_failed"] == 2, "an unreachable callback")
    async with httpx.AsyncClient(base_url=sim.url) as http:
        resp = await http.post(
            "/_sim/callbacks/emit", json={"id": sim.messages[0].id, "status": "read"}
        )
        assert resp.status_code == 200
        assert resp.headers["X-Sim-Callback-Status"] == "error"
        sim.configure(callback_url=None)
        resp = await http.post(
            "/_sim/callbacks/emit", json={"id": sim.messages[0].id, "status": "read"}
        )
        assert resp.status_code == 409
    assert sim.stats()["callbacks_sent"] == 0
    assert sim.stats()["callbacks_failed"] == 3
    assert len(sim.messages) == 2


async def test_stop_cancels_pending_callbacks(receiver: CallbackReceiver) -> None:
    simulator = GatewaySimulator()
    await simulator.start()
    simulator.configure(callback_url=receiver.url, callback_delay_ms=60_000)
    async with StackZapClient(GatewaySettings(stackzap_api_url=simulator.url)) as client:
        await client.send_text(msg(1))
    started = time.monotonic()
    await simulator.stop()
    assert time.monotonic() - started < 5
    assert receiver.received == []
    assert simulator.stats()["callbacks_sent"] == 0
