"""A wrong configuration is not a message failure: base URL normalisation, route 404s, probes.

Every client against a scripted gateway on loopback: a base URL with the version the
client adds itself still reaches the right path; a 404 naming no resource on the send
or listing route is :class:`GatewayMisconfigured` naming the setting (the worker
pauses instead of failing the queue); ``probe_configuration`` tells a wrong route, a
refused key and an unreadable listing from a working gateway, sending nothing.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from pydantic import SecretStr

from connectors.gateways.classify import GatewayResponse, error_for_response
from connectors.gateways.factory import build_gateway
from connectors.gateways.http_client import HttpGatewayClient, normalise_base_url
from streams.kernel.errors import (
    GatewayMisconfigured,
    InstanceUnavailableError,
    ListingUnreadable,
    PermanentGatewayError,
    TransientGatewayError,
    names_a_resource,
)
from streams.kernel.ports import TextMessage
from streams.kernel.settings import GatewayKind, GatewaySettings
from tests.unit.connectors.gateways.fake_gateway import (
    FakeGateway,
    Handler,
    Reply,
    Seen,
    closed_port_url,
)

SECRET = "key-0123456789abcdefXYZ"
PHONE = "5521998877665"
V1 = re.compile(r"/v1$", re.IGNORECASE)


def settings(kind: GatewayKind, url: str, **overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "kind": kind,
        "stackzap_api_url": url,
        "stackzap_api_key": SecretStr(SECRET),
        "zap_api_url": url,
        "zap_token": SecretStr(SECRET),
        "meta_graph_url": url,
        "meta_access_token": SecretStr(SECRET),
    }
    values.update(overrides)
    return GatewaySettings(**values)


def message() -> TextMessage:
    return TextMessage("inst-1", PHONE, "Pedido 123 confirmado", "7-1")


def response(status: int, body: bytes = b"", method: str = "POST") -> GatewayResponse:
    return GatewayResponse(method, status, "Not Found", {}, body)


# --- base URLs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected", "dropped"),
    [
        ("https://api.zap-api.tech", "https://api.zap-api.tech", None),
        ("https://api.zap-api.tech/", "https://api.zap-api.tech", "a trailing '/'"),
        ("https://api.zap-api.tech/v1", "https://api.zap-api.tech", "a trailing '/v1'"),
        (
            "https://api.zap-api.tech/v1/",
            "https://api.zap-api.tech",
            "a trailing '/' and a trailing '/v1'",
        ),
        ("https://host/gw/V1", "https://host/gw", "a trailing '/V1'"),
        ("https://host/gw", "https://host/gw", None),
        ("https://host/v10", "https://host/v10", None),
        ("http://v1", "http://v1", None),
    ],
)
def test_base_url_loses_the_version_the_client_adds(
    given: str, expected: str, dropped: str | None
) -> None:
    assert normalise_base_url(given, V1) == (expected, dropped)


@pytest.mark.parametrize(
    ("kind", "suffix", "path"),
    [
        (GatewayKind.ZAPAPI, "/v1", "/v1/instances/inst-1/messages"),
        (GatewayKind.ZAPAPI, "/v1/", "/v1/instances/inst-1/messages"),
        (GatewayKind.STACKZAP, "/v1", "/v1/instances/inst-1/send-queue/text"),
        (GatewayKind.META, "/v19.0", "/v21.0/inst-1/messages"),
        (GatewayKind.META, "/", "/v21.0/inst-1/messages"),
    ],
)
async def test_a_base_url_as_the_article_writes_it_reaches_the_send_route(
    kind: GatewayKind, suffix: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        if kind is GatewayKind.META:
            return Reply(200, json={"messages": [{"id": "wamid.1"}]})
        return Reply(200, json={"id": "m-1", "status": "queued"})

    caplog.set_level(logging.INFO)
    async with FakeGateway(handler) as fake:
        gateway = build_gateway(settings(kind, fake.url + suffix))
        async with gateway:
            await gateway.send_text(message())
    assert [r.path for r in seen] == [path]
    assert SECRET not in caplog.text
    if suffix != "/":
        assert isinstance(gateway, HttpGatewayClient)
        (note,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert gateway.url_setting in note and suffix.rstrip("/") in note


# --- classification ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, b"404: Not Found"),
        (404, b'{"detail": "Not Found"}'),
        (404, b"Cannot POST /api/v1/instances/inst-1/messages"),
        (404, b""),
        (405, b"Method Not Allowed"),
        (301, b""),
        (302, b"<html>moved</html>"),
    ],
)
def test_no_such_route_is_a_configuration_fault_naming_the_setting(
    status: int, body: bytes
) -> None:
    err = error_for_response(response(status, body), gateway="zapapi", url_setting="ZAP_API_URL")
    assert isinstance(err, GatewayMisconfigured)
    assert isinstance(err, InstanceUnavailableError) and err.retriable, "waits, never FAILED"
    assert err.setting == "ZAP_API_URL" and "ZAP_API_URL" in str(err)
    assert err.status_code == status


@pytest.mark.parametrize(
    "body",
    [
        b'{"error": "recipient not found"}',
        b'{"message": "number 5521998877665 is not on WhatsApp"}',
        b'{"error": "unknown job"}',
        b'{"error": "contact does not exist"}',
    ],
)
def test_a_404_naming_a_resource_stays_the_messages_failure(body: bytes) -> None:
    err = error_for_response(response(404, body), gateway="g", url_setting="ZAP_API_URL")
    assert type(err) is PermanentGatewayError
    assert PHONE not in str(err)


def test_a_404_naming_the_instance_is_the_instance_not_the_route() -> None:
    err = error_for_response(
        response(404, b'{"error": "unknown instance"}'), gateway="g", url_setting="ZAP_API_URL"
    )
    assert isinstance(err, InstanceUnavailableError)
    assert not isinstance(err, GatewayMisconfigured)


def test_without_a_route_setting_a_404_stays_permanent() -> None:
    err = error_for_response(response(404, b"404: Not Found"), gateway="g")
    assert type(err) is PermanentGatewayError


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("invalid recipient", True),
        ("Phone number not registered", True),
        ("unknown job", True),
        ("404: Not Found", False),
        ("Cannot POST /v1/instances/x/messages", False),
        ("route https://h/v1/chats/x not found", False),
        ("type must be 'text'", False),
    ],
)
def test_names_a_resource(reason: str, expected: bool) -> None:
    assert names_a_resource(reason) is expected


@pytest.mark.parametrize("kind", [GatewayKind.ZAPAPI, GatewayKind.STACKZAP, GatewayKind.META])
async def test_a_wrong_base_url_fails_the_send_as_misconfigured(kind: GatewayKind) -> None:
    def handler(request: Seen) -> Reply:
        return Reply(404, body=b"404: Not Found")

    async with FakeGateway(handler) as fake:
        async with build_gateway(settings(kind, fake.url + "/wrong")) as gateway:
            with pytest.raises(GatewayMisconfigured) as info:
                await gateway.send_text(message())
    assert isinstance(gateway, HttpGatewayClient)
    assert info.value.setting == gateway.url_setting
    assert PHONE not in str(info.value) and SECRET not in str(info.value)


async def test_a_wrong_stackzap_base_url_fails_the_listing_as_misconfigured() -> None:
    def handler(request: Seen) -> Reply:
        return Reply(404, body=b"404: Not Found")

    async with FakeGateway(handler) as fake:
        async with build_gateway(settings(GatewayKind.STACKZAP, fake.url + "/x")) as gateway:
            with pytest.raises(GatewayMisconfigured) as info:
                await gateway.list_for_reconciliation("inst-1", references=["7-1"])
    assert info.value.setting == "STACKZAP_API_URL"


# --- probes -----------------------------------------------------------------------------


def zapapi_like(request: Seen) -> Reply:
    """A ZAP API on /v1/instances/{i}/messages: 422 on an empty body, 404 anywhere else."""
    if not re.fullmatch(r"/v1/instances/[^/]+/messages", request.path):
        return Reply(404, body=b"404: Not Found")
    if request.headers.get("Authorization") != f"Bearer {SECRET}":
        return Reply(401, json={"message": "unauthorized"})
    if request.content in (b"", b"{}"):
        return Reply(422, json={"message": "type must be 'text'"})
    return Reply(200, json={"id": "m-1", "status": "queued"})


async def test_zapapi_probe_posts_an_empty_body_and_a_422_proves_the_route() -> None:
    async with FakeGateway(zapapi_like) as fake:
        async with build_gateway(settings(GatewayKind.ZAPAPI, fake.url + "/v1")) as gateway:
            detail = await gateway.probe_configuration("inst-1")
        (seen,) = fake.seen
    assert "422" in detail
    assert seen.method == "POST" and seen.path == "/v1/instances/inst-1/messages"
    assert seen.content == b"{}" and "Idempotency-Key" not in seen.headers


async def test_zapapi_probe_tells_a_wrong_base_url_and_a_wrong_token() -> None:
    async with FakeGateway(zapapi_like) as fake:
        async with build_gateway(settings(GatewayKind.ZAPAPI, fake.url + "/api")) as gateway:
            with pytest.raises(GatewayMisconfigured) as wrong:
                await gateway.probe_configuration("inst-1")
        bad_token = settings(GatewayKind.ZAPAPI, fake.url, zap_token=SecretStr("x" * 20))
        async with build_gateway(bad_token) as gateway:
            with pytest.raises(InstanceUnavailableError) as refused:
                await gateway.probe_configuration("inst-1")
    assert wrong.value.setting == "ZAP_API_URL"
    assert refused.value.status_code == 401 and not isinstance(refused.value, GatewayMisconfigured)


async def test_zapapi_probe_of_an_unreachable_gateway_is_transient() -> None:
    async with build_gateway(settings(GatewayKind.ZAPAPI, closed_port_url())) as gateway:
        with pytest.raises(TransientGatewayError) as info:
            await gateway.probe_configuration("inst-1")
    assert not isinstance(info.value, InstanceUnavailableError)


def listing(body: Any) -> Handler:
    def handler(request: Seen) -> Reply:
        if not re.fullmatch(r"/v1/instances/[^/]+/send-queue", request.path):
            return Reply(404, body=b"404: Not Found")
        return Reply(200, json=body)

    return handler


async def test_stackzap_probe_asks_one_listing_page() -> None:
    body = {"jobs": [{"id": "j1", "ref": "7-1", "status": "queued"}], "counts": {"queued": 1}}
    async with FakeGateway(listing(body)) as fake:
        async with build_gateway(settings(GatewayKind.STACKZAP, fake.url)) as gateway:
            detail = await gateway.probe_configuration("inst-1")
        (seen,) = fake.seen
    assert "parses" in detail
    assert seen.method == "GET" and seen.params.get("page_size") == "1"
    assert seen.headers["X-API-Key"] == SECRET


async def test_stackzap_probe_tells_an_unreadable_listing_and_a_wrong_base_url() -> None:
    async with FakeGateway(listing({"total": 3})) as fake:
        async with build_gateway(settings(GatewayKind.STACKZAP, fake.url)) as gateway:
            with pytest.raises(ListingUnreadable):
                await gateway.probe_configuration("inst-1")
        async with build_gateway(settings(GatewayKind.STACKZAP, fake.url + "/sz")) as gateway:
            with pytest.raises(GatewayMisconfigured) as wrong:
                await gateway.probe_configuration("inst-1")
    assert wrong.value.setting == "STACKZAP_API_URL"


async def test_meta_probe_reads_the_phone_number_node() -> None:
    def graph(request: Seen) -> Reply:
        if request.path == "/v21.0/106540352242922" and request.method == "GET":
            return Reply(200, json={"id": "106540352242922"})
        if request.path.startswith("/v21.0/"):
            return Reply(
                400,
                json={"error": {"code": 100, "error_subcode": 33, "message": "does not exist"}},
            )
        return Reply(404, body=b"404: Not Found")

    async with FakeGateway(graph) as fake:
        async with build_gateway(settings(GatewayKind.META, fake.url + "/v21.0")) as gateway:
            detail = await gateway.probe_configuration("106540352242922")
            with pytest.raises(InstanceUnavailableError) as unknown:
                await gateway.probe_configuration("999")
        async with build_gateway(settings(GatewayKind.META, fake.url + "/graph")) as gateway:
            with pytest.raises(GatewayMisconfigured) as wrong:
                await gateway.probe_configuration("106540352242922")
        seen = fake.seen
    assert "106540352242922" in detail
    assert "unknown phone number id" in str(unknown.value)
    assert wrong.value.setting == "META_GRAPH_URL"
    assert all(r.method == "GET" for r in seen), "a probe never sends"
