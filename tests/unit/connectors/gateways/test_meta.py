"""MetaCloudClient against a scripted Graph API on loopback: request shape, error table, masking."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from connectors.gateways.classify import GatewayResponse
from connectors.gateways.factory import build_gateway
from connectors.gateways.meta import MetaCloudClient, meta_error
from streams.kernel.contract import JobStatus
from streams.kernel.errors import (
    GatewayError,
    InstanceUnavailableError,
    PermanentGatewayError,
    RateLimitedError,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.kernel.ports import CancelOutcome, TextMessage
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

TOKEN = "EAAGmeta-token-0123456789abcdefXYZ"
PHONE = "5521998877665"
PHONE_NUMBER_ID = "106540352242922"
TEXT = "Pedido 123 confirmado"
WAMID = "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJDQjZCMzlEQUE4OTJBMTE4RTUA"


def settings(**overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "kind": GatewayKind.META,
        "meta_graph_url": "http://graph.test:9000",
        "meta_access_token": SecretStr(TOKEN),
    }
    values.update(overrides)
    return GatewaySettings(**values)


@contextlib.asynccontextmanager
async def client(handler: Handler, **overrides: Any) -> AsyncIterator[MetaCloudClient]:
    async with FakeGateway(handler) as fake:
        overrides.setdefault("meta_graph_url", fake.url)
        async with MetaCloudClient(settings(**overrides)) as gw:
            yield gw


def message(reference: str = "41-2", to: str = PHONE) -> TextMessage:
    return TextMessage(instance_id=PHONE_NUMBER_ID, to=to, text=TEXT, reference=reference)


def accepted_body(wamid: str = WAMID, **extra: Any) -> dict[str, Any]:
    return {
        "messaging_product": "whatsapp",
        "contacts": [{"input": PHONE, "wa_id": PHONE}],
        "messages": [{"id": wamid, **extra}],
    }


def graph_error(code: int, message: str = "error", subcode: int | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {
        "message": message,
        "type": "OAuthException",
        "code": code,
        "fbtrace_id": "AbCdEfGh123",
    }
    if subcode is not None:
        error["error_subcode"] = subcode
    return {"error": error}


# --- the request -----------------------------------------------------------------------


async def test_send_request_shape_and_accepted_answer() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json=accepted_body())

    async with client(handler) as gw:
        accepted = await gw.send_text(message("41-2"))

    assert accepted.gateway_job_id == WAMID
    assert accepted.gateway_status == "accepted"
    assert accepted.status is JobStatus.ACCEPTED
    (request,) = seen
    assert request.method == "POST"
    assert request.raw_path == f"/v21.0/{PHONE_NUMBER_ID}/messages"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Content-Type"] == "application/json"
    assert "Idempotency-Key" not in request.headers
    assert json.loads(request.content) == {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": PHONE,
        "type": "text",
        "text": {"body": TEXT},
        "biz_opaque_callback_data": "41-2",
    }


async def test_api_version_and_base_url_are_configurable() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json=accepted_body())

    async with client(handler, meta_api_version="v23.0") as gw:
        await gw.send_text(message())
    assert seen[0].raw_path == f"/v23.0/{PHONE_NUMBER_ID}/messages"


@pytest.mark.parametrize(
    ("to", "sent"),
    [("5521998877665", "5521998877665"), ("5521998877665@s.whatsapp.net", "5521998877665")],
)
async def test_recipient_is_sent_as_digits(to: str, sent: str) -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json=accepted_body())

    async with client(handler) as gw:
        await gw.send_text(message(to=to))
    assert json.loads(seen[0].content)["to"] == sent


async def test_group_recipient_is_permanent_and_never_sent() -> None:
    fake_handler = answer(200, accepted_body())
    async with FakeGateway(fake_handler) as fake:
        async with MetaCloudClient(settings(meta_graph_url=fake.url)) as gw:
            with pytest.raises(PermanentGatewayError, match="group"):
                await gw.send_text(message(to="120363041234567890@g.us"))
        assert fake.seen == []


@pytest.mark.parametrize(
    ("body", "wamid", "label", "status"),
    [
        (accepted_body(), WAMID, "accepted", JobStatus.ACCEPTED),
        (accepted_body(message_status="accepted"), WAMID, "accepted", JobStatus.ACCEPTED),
        (
            accepted_body(message_status="held_for_quality_assessment"),
            WAMID,
            "held_for_quality_assessment",
            JobStatus.ACCEPTED,
        ),
        (accepted_body(message_status="paused"), WAMID, "paused", JobStatus.REVIEW),
        ({"messages": []}, None, "accepted", JobStatus.ACCEPTED),
    ],
)
async def test_send_parses_wamid_and_message_status(
    body: Any, wamid: str | None, label: str, status: JobStatus
) -> None:
    async with client(answer(200, body)) as gw:
        accepted = await gw.send_text(message())
    assert (accepted.gateway_job_id, accepted.gateway_status, accepted.status) == (
        wamid,
        label,
        status,
    )


async def test_no_listing_and_no_cancel() -> None:
    async with client(answer(200, accepted_body())) as gw:
        assert await gw.list_for_reconciliation(PHONE_NUMBER_ID, references=["41-2"]) is None
        assert await gw.cancel_job(PHONE_NUMBER_ID, WAMID) is CancelOutcome.UNSUPPORTED


def test_factory_builds_meta() -> None:
    gw = build_gateway(settings())
    assert isinstance(gw, MetaCloudClient)
    assert gw.name == "meta"


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZAPSTREAM_GATEWAY", "meta")
    monkeypatch.setenv("META_GRAPH_URL", "http://sim:8088")
    monkeypatch.setenv("META_API_VERSION", "v22.0")
    monkeypatch.setenv("META_ACCESS_TOKEN", TOKEN)
    monkeypatch.setenv("META_APP_SECRET", "app-secret")
    monkeypatch.setenv("META_VERIFY_TOKEN", "verify-me")
    s = GatewaySettings()
    assert s.kind is GatewayKind.META
    assert (s.meta_graph_url, s.meta_api_version) == ("http://sim:8088", "v22.0")
    assert s.meta_access_token.get_secret_value() == TOKEN
    assert s.meta_app_secret.get_secret_value() == "app-secret"
    assert s.meta_verify_token.get_secret_value() == "verify-me"
    assert TOKEN not in repr(s) and "app-secret" not in repr(s)
    # The other gateways' defaults did not move.
    assert GatewaySettings(kind=GatewayKind.STACKZAP).stackzap_api_url == "http://127.0.0.1:8088"


def test_api_version_must_look_like_one() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        settings(meta_api_version="21")


# --- the error table ---------------------------------------------------------------------


def response(status: int, body: Any, headers: dict[str, str] | None = None) -> GatewayResponse:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return GatewayResponse("POST", status, "", headers or {}, raw)


@pytest.mark.parametrize(
    ("status", "code", "expected", "limit", "retry_after_s"),
    [
        (400, 130429, RateLimitedError, "instance", 1.0),
        (429, 130429, RateLimitedError, "instance", 1.0),
        (400, 80007, RateLimitedError, "instance", 1.0),
        (400, 4, RateLimitedError, "instance", 1.0),
        (400, 131056, RateLimitedError, "recipient", 6.0),
    ],
)
def test_rate_limits(
    status: int, code: int, expected: type[GatewayError], limit: str, retry_after_s: float
) -> None:
    error = meta_error(response(status, graph_error(code, "(#130429) Rate limit hit")))
    assert type(error) is expected
    assert isinstance(error, RateLimitedError)
    assert error.limit == limit
    assert error.retry_after_s == retry_after_s
    assert error.retriable and error.scope == "message"
    assert error.status_code == status


def test_throughput_limit_honours_retry_after() -> None:
    error = meta_error(response(429, graph_error(130429), {"Retry-After": "3"}))
    assert isinstance(error, RateLimitedError) and error.retry_after_s == 3.0


@pytest.mark.parametrize(
    ("code", "subcode"),
    [(131026, None), (100, None), (100, 2494010), (131049, None), (131051, None)],
)
def test_permanent_codes(code: int, subcode: int | None) -> None:
    error = meta_error(response(400, graph_error(code, "Message undeliverable", subcode)))
    assert type(error) is PermanentGatewayError
    assert not error.retriable
    assert f"code {code}" in str(error)
    if subcode is not None:
        assert f"{code}/{subcode}" in str(error)
    assert "fbtrace_id AbCdEfGh123" in str(error)


def test_marketing_limit_131049_is_failed_with_the_reason() -> None:
    body = graph_error(131049, "This message was not delivered to maintain healthy ecosystem")
    error = meta_error(response(400, body))
    assert isinstance(error, PermanentGatewayError)
    assert "healthy ecosystem" in str(error)


def test_maintenance_131057_pauses_the_number_with_a_wait() -> None:
    error = meta_error(response(400, graph_error(131057, "Account in maintenance mode")))
    assert isinstance(error, InstanceUnavailableError)
    assert isinstance(error, TransientGatewayError) and error.retriable
    assert error.scope == "instance"
    assert error.retry_after_s == 60.0


@pytest.mark.parametrize(
    ("status", "code"),
    [(401, 190), (400, 190), (401, 0), (403, 10), (403, 200), (400, 131031), (400, 133010)],
)
def test_credentials_and_account_codes_pause_the_number(status: int, code: int) -> None:
    body = graph_error(code, f"Error validating access token {TOKEN}")
    error = meta_error(response(status, body), sensitive=(TOKEN,))
    assert isinstance(error, InstanceUnavailableError)
    assert error.scope == "instance"
    assert TOKEN not in str(error)


def test_unknown_phone_number_id_pauses_the_number() -> None:
    body = graph_error(100, "Unsupported post request. Object with ID '1' does not exist", 33)
    error = meta_error(response(400, body))
    assert isinstance(error, InstanceUnavailableError)
    assert "unknown phone number id" in str(error)


@pytest.mark.parametrize("status", [401, 403])
def test_401_403_without_a_graph_body_pause_the_number(status: int) -> None:
    assert isinstance(meta_error(response(status, b"nope")), InstanceUnavailableError)


def test_unknown_code_on_401_is_about_credentials() -> None:
    assert isinstance(meta_error(response(401, graph_error(12345))), InstanceUnavailableError)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (500, graph_error(131000, "Something went wrong"), TransientGatewayError),
        (503, graph_error(2, "Service temporarily unavailable"), TransientGatewayError),
        (502, graph_error(131000), UncertainGatewayError),
        (504, b"<html>gateway timeout</html>", UncertainGatewayError),
        (500, b"", TransientGatewayError),
        (400, graph_error(1, "Invalid request or possible server error"), PermanentGatewayError),
        (400, {"unexpected": True}, PermanentGatewayError),
    ],
)
def test_everything_else_goes_through_the_shared_classification(
    status: int, body: Any, expected: type[GatewayError]
) -> None:
    error = meta_error(response(status, body))
    assert type(error) is expected
    assert error is not None and error.status_code == status


@pytest.mark.parametrize(
    ("body", "headers", "retry_after_s"),
    [
        ({"error": {"message": "no code"}}, None, 1.0),
        (b"Too Many Requests", {"Retry-After": "2"}, 2.0),
        (graph_error(613, "Calls to this api have exceeded the rate limit"), None, 1.0),
    ],
)
def test_any_429_is_the_numbers_rate(
    body: Any, headers: dict[str, str] | None, retry_after_s: float
) -> None:
    error = meta_error(response(429, body, headers))
    assert isinstance(error, RateLimitedError)
    assert (error.limit, error.retry_after_s, error.status_code) == ("instance", retry_after_s, 429)


def test_2xx_is_not_an_error() -> None:
    assert meta_error(response(200, accepted_body())) is None


def test_error_message_masks_recipient_text_and_token() -> None:
    body = graph_error(131026, f"could not send {TEXT!r} to +{PHONE} with {TOKEN}")
    body["error"]["error_data"] = {"messaging_product": "whatsapp", "details": f"to {PHONE}"}
    error = meta_error(response(400, body), sensitive=(PHONE, TEXT, TOKEN))
    text = str(error)
    assert PHONE not in text and TEXT not in text and TOKEN not in text
    assert "could not send" in text


# --- the error table through the client (the real socket path) ----------------------------


async def test_client_maps_a_graph_error_answer() -> None:
    async with client(answer(400, graph_error(131056, "pair rate limit hit"))) as gw:
        with pytest.raises(RateLimitedError) as info:
            await gw.send_text(message())
    assert info.value.limit == "recipient"
    assert info.value.retry_after_s == 6.0


async def test_client_masks_what_meta_echoes(caplog: pytest.LogCaptureFixture) -> None:
    body = graph_error(100, f"Invalid parameter to={PHONE} body={TEXT} token={TOKEN}")
    caplog.set_level(logging.DEBUG)
    async with client(answer(400, body)) as gw:
        with pytest.raises(PermanentGatewayError) as info:
            await gw.send_text(message())
    for secret in (PHONE, TEXT, TOKEN):
        assert secret not in str(info.value)
        assert secret not in caplog.text


FAST = {"read_timeout_s": 0.2, "connect_timeout_s": 0.2, "pool_timeout_s": 0.05}


@pytest.mark.parametrize("fault", [Fault.STALL, Fault.DISCONNECT, Fault.CUT_BODY, Fault.GARBAGE])
async def test_failures_after_the_request_was_written_are_uncertain(fault: Fault) -> None:
    async with client(failing(fault), **FAST) as gw:
        with pytest.raises(UncertainGatewayError):
            await gw.send_text(message())


async def test_connection_refused_is_transient() -> None:
    async with client(answer(200, {}), meta_graph_url=closed_port_url(), **FAST) as gw:
        with pytest.raises(TransientGatewayError) as info:
            await gw.send_text(message())
    assert not isinstance(info.value, UncertainGatewayError | RateLimitedError)


async def test_no_authorization_header_when_token_unset() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json=accepted_body())

    async with client(handler, meta_access_token=SecretStr("")) as gw:
        await gw.send_text(message())
    assert "authorization" not in seen[0].headers


async def test_started_log_line_never_shows_the_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with client(answer(200, accepted_body())) as gw:
        await gw.send_text(message())
    assert "meta client started" in caplog.text
    assert TOKEN not in caplog.text


def test_the_user_stopped_marketing_131050_is_an_opt_out_not_a_plain_failure() -> None:
    from streams.kernel.errors import RecipientOptedOut

    body = graph_error(
        131050,
        "Unable to deliver the message. This recipient has chosen to stop receiving marketing "
        "messages on WhatsApp from your business",
    )
    error = meta_error(response(400, body))
    assert isinstance(error, RecipientOptedOut) and isinstance(error, PermanentGatewayError)
    assert not error.retriable
    assert "code 131050" in str(error) and "opted out" in str(error)
