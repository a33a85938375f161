"""Meta templates in MetaCloudClient: the Graph request byte for byte, the template errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import SecretStr

from connectors.gateways.classify import GatewayResponse
from connectors.gateways.meta import TEMPLATE_ERRORS, MetaCloudClient, meta_error
from streams.kernel.errors import PermanentGatewayError
from streams.kernel.ports import TextMessage
from streams.kernel.settings import GatewayKind, GatewaySettings
from streams.kernel.templates import TemplatePaused, TemplateRejected, WindowClosed
from tests.unit.connectors.gateways.fake_gateway import FakeGateway, Reply, Seen

TOKEN = "EAAGmeta-token-0123456789abcdefXYZ"
PHONE = "5521998877665"
PHONE_NUMBER_ID = "106540352242922"
WAMID = "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJDQjZCMzlEQUE4OTJBMTE4RTUA"
TEMPLATE: dict[str, Any] = {
    "name": "order_confirmation",
    "language": {"code": "pt_BR"},
    "components": [
        {
            "type": "header",
            "parameters": [{"type": "image", "image": {"link": "https://cdn.test/p.png"}}],
        },
        {
            "type": "body",
            "parameters": [
                {"type": "text", "text": "Ana Souza"},
                {
                    "type": "currency",
                    "currency": {"fallback_value": "R$ 10,50", "code": "BRL", "amount_1000": 10500},
                },
                {"type": "date_time", "date_time": {"fallback_value": "29/11/2026"}},
            ],
        },
        {
            "type": "button",
            "sub_type": "url",
            "index": "0",
            "parameters": [{"type": "text", "text": "pedido-123"}],
        },
    ],
}


def _settings(url: str) -> GatewaySettings:
    return GatewaySettings(
        kind=GatewayKind.META, meta_graph_url=url, meta_access_token=SecretStr(TOKEN)
    )


def _template_message() -> TextMessage:
    return TextMessage(
        PHONE_NUMBER_ID, PHONE, "[template order_confirmation/pt_BR]", "41-1", TEMPLATE
    )


async def test_template_request_is_the_cloud_api_template_message_byte_for_byte() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json={"messages": [{"id": WAMID, "message_status": "accepted"}]})

    async with FakeGateway(handler) as fake:
        async with MetaCloudClient(_settings(fake.url)) as gw:
            assert gw.sends_templates is True
            accepted = await gw.send_text(_template_message())
    assert accepted.gateway_job_id == WAMID
    (request,) = seen
    assert request.raw_path == f"/v21.0/{PHONE_NUMBER_ID}/messages"
    expected = {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": PHONE,
        "type": "template",
        "template": TEMPLATE,
        "biz_opaque_callback_data": "41-1",
    }
    # The bytes on the wire: compact JSON, keys in this order, the template as given.
    assert request.content == json.dumps(expected, separators=(",", ":")).encode()


def test_a_text_without_template_is_still_a_text() -> None:
    body = MetaCloudClient.request_body(TextMessage(PHONE_NUMBER_ID, PHONE, "oi", "1-1"))
    assert body["type"] == "text" and "template" not in body


def _graph(code: int, message: str, details: str | None = None) -> GatewayResponse:
    error: dict[str, Any] = {"message": message, "type": "OAuthException", "code": code}
    if details is not None:
        error["error_data"] = {"messaging_product": "whatsapp", "details": details}
    return GatewayResponse("POST", 400, "", {}, json.dumps({"error": error}).encode())


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (132000, "the number of parameters does not match the template"),
        (132001, "the template does not exist in this language"),
        (132005, "the template's text is too long once filled in"),
        (132007, "the template's content violates a WhatsApp policy"),
        (132012, "a parameter's format does not match the template"),
        (132016, "the template is disabled (paused too many times)"),
    ],
)
def test_template_errors_are_permanent_with_the_reason(code: int, reason: str) -> None:
    error = meta_error(_graph(code, f"(#{code}) Template error"))
    assert type(error) is TemplateRejected
    assert isinstance(error, PermanentGatewayError) and not error.retriable
    assert error.code == str(code)
    assert f"code {code}" in str(error) and reason in str(error)
    assert TEMPLATE_ERRORS[code] == reason


def test_paused_template_132015_is_its_own_class() -> None:
    error = meta_error(_graph(132015, "(#132015) Template is Paused"))
    assert isinstance(error, TemplatePaused) and isinstance(error, TemplateRejected)
    assert not error.retriable
    assert "the template is paused" in str(error)


def test_re_engagement_131047_is_a_closed_window() -> None:
    details = "Message failed to send because more than 24 hours have passed since the customer"
    error = meta_error(_graph(131047, "(#131047) Re-engagement message", details))
    assert isinstance(error, WindowClosed) and not error.retriable
    assert "code 131047" in str(error) and "window closed" in str(error)


def test_template_errors_on_a_5xx_follow_the_http_status() -> None:
    raw = json.dumps({"error": {"message": "x", "code": 132000}}).encode()
    error = meta_error(GatewayResponse("POST", 503, "", {}, raw))
    assert error is not None and error.retriable


async def test_parameters_meta_echoes_are_redacted() -> None:
    def handler(request: Seen) -> Reply:
        echo = "(#132012) Parameter format does not match: Ana Souza, pedido-123"
        return Reply(400, json={"error": {"message": echo, "code": 132012}})

    async with FakeGateway(handler) as fake:
        async with MetaCloudClient(_settings(fake.url)) as gw:
            with pytest.raises(TemplateRejected) as raised:
                await gw.send_text(_template_message())
    text = str(raised.value)
    assert "Ana Souza" not in text and "pedido-123" not in text
    assert "[redacted]" in text
