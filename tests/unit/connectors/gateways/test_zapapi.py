"""ZapApiClient against a scripted gateway on loopback: request shape, parsing and errors."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from connectors.gateways.factory import build_gateway
from connectors.gateways.zapapi import ZapApiClient
from streams.kernel.contract import JobStatus
from streams.kernel.errors import (
    InstanceUnavailableError,
    PermanentGatewayError,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.kernel.ports import TextMessage
from streams.kernel.settings import GatewayKind, GatewaySettings
from tests.unit.connectors.gateways.fake_gateway import (
    FakeGateway,
    Fault,
    Handler,
    Reply,
    Seen,
    answer,
    closed_port_url,
    failing,
)

TOKEN = "zap-token-0123456789abcdef"
PHONE = "5521998877665"
TEXT = "Pedido 123 confirmado"


def settings(**overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "kind": GatewayKind.ZAPAPI,
        "zap_api_url": "http://zap.test:9000",
        "zap_token": SecretStr(TOKEN),
    }
    values.update(overrides)
    return GatewaySettings(**values)


@contextlib.asynccontextmanager
async def client(handler: Handler, **overrides: Any) -> AsyncIterator[ZapApiClient]:
    """A started client pointed at a fake gateway."""
    async with FakeGateway(handler) as fake:
        overrides.setdefault("zap_api_url", fake.url)
        async with ZapApiClient(settings(**overrides)) as gw:
            yield gw


def message(reference: str = "att-1") -> TextMessage:
    return TextMessage(instance_id="inst-9", to=PHONE, text=TEXT, reference=reference)


async def test_send_request_shape() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json={"id": "m-1", "status": "queued"})

    async with client(handler) as gw:
        accepted = await gw.send_text(message("att-7"))

    assert (accepted.gateway_job_id, accepted.gateway_status) == ("m-1", "queued")
    assert accepted.status is JobStatus.ACCEPTED
    (request,) = seen
    assert request.method == "POST"
    assert request.raw_path == "/v1/instances/inst-9/messages"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Idempotency-Key"] == "att-7"
    assert "x-api-key" not in request.headers
    assert json.loads(request.content) == {"type": "text", "to": PHONE, "text": TEXT}


@pytest.mark.parametrize(
    ("body", "job_id", "status"),
    [
        ({"id": "a", "status": "queued"}, "a", JobStatus.ACCEPTED),
        ({"messageId": "b", "status": "SERVER_ACK"}, "b", JobStatus.ACCEPTED),
        ({"messageId": "c", "status": "delivery_ack"}, "c", JobStatus.DELIVERED),
        ({"id": "d", "status": "weird"}, "d", JobStatus.REVIEW),
        ({"id": "e"}, "e", JobStatus.REVIEW),
        (None, None, JobStatus.REVIEW),
    ],
)
async def test_send_parses_id_and_label(body: Any, job_id: str | None, status: JobStatus) -> None:
    async with client(answer(200, body)) as gw:
        accepted = await gw.send_text(message())
    assert accepted.gateway_job_id == job_id
    assert accepted.status is status


@pytest.mark.parametrize("label", ["failed", "error"])
async def test_failed_label_is_permanent(label: str) -> None:
    async with client(answer(200, {"id": "x", "status": label})) as gw:
        with pytest.raises(PermanentGatewayError):
            await gw.send_text(message())


async def test_no_authorization_header_when_token_unset() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json={"id": "m", "status": "queued"})

    async with client(handler, zap_token=SecretStr("")) as gw:
        await gw.send_text(message())
    assert "authorization" not in seen[0].headers


FAST = {"read_timeout_s": 0.2, "connect_timeout_s": 0.2, "pool_timeout_s": 0.05}


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (Fault.STALL, UncertainGatewayError),
        (Fault.DISCONNECT, UncertainGatewayError),
        (Fault.CUT_BODY, UncertainGatewayError),
    ],
)
async def test_transport_errors_classified(fault: Fault, expected: type[Exception]) -> None:
    async with client(failing(fault), **FAST) as gw:
        with pytest.raises(expected):
            await gw.send_text(message())


async def test_connection_refused_is_transient() -> None:
    async with client(answer(200, {}), zap_api_url=closed_port_url(), **FAST) as gw:
        with pytest.raises(TransientGatewayError):
            await gw.send_text(message())


async def test_429_retry_after() -> None:
    async with client(answer(429, {"message": "slow down"}, {"Retry-After": "5"})) as gw:
        with pytest.raises(TransientGatewayError) as info:
            await gw.send_text(message())
    assert info.value.retry_after_s == 5.0
    assert "slow down" in str(info.value)


@pytest.mark.parametrize("status", [500, 503])
async def test_5xx_transient(status: int) -> None:
    async with client(answer(status, {"message": "oops"})) as gw:
        with pytest.raises(TransientGatewayError) as info:
            await gw.send_text(message())
    assert info.value.status_code == status


@pytest.mark.parametrize("status", [502, 504])
async def test_proxy_5xx_on_a_send_is_uncertain(status: int) -> None:
    async with client(answer(status, {"message": "bad gateway"})) as gw:
        with pytest.raises(UncertainGatewayError) as info:
            await gw.send_text(message())
    assert info.value.status_code == status


async def test_401_pauses_the_instance_and_masks_token() -> None:
    body = {"message": f"token {TOKEN} is not valid for {PHONE}", "code": 401}
    async with client(answer(401, body)) as gw:
        with pytest.raises(InstanceUnavailableError) as info:
            await gw.send_text(message())
    assert info.value.status_code == 401 and info.value.scope == "instance"
    assert TOKEN not in str(info.value)
    assert PHONE not in str(info.value)
    assert "is not valid" in str(info.value)


async def test_lifecycle() -> None:
    async with FakeGateway(answer(200, {"id": "m", "status": "queued"})) as fake:
        gw = ZapApiClient(settings(zap_api_url=fake.url))
        with pytest.raises(RuntimeError, match="not started"):
            await gw.send_text(message())
        async with gw:
            await gw.send_text(message())
        await gw.stop()


def test_factory_builds_zapapi() -> None:
    gw = build_gateway(settings())
    assert isinstance(gw, ZapApiClient)
    assert gw.name == "zapapi"
