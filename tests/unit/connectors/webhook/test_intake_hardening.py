"""The intake binds receipts to their job and bounds what it accepts (issue 18, findings 2, 8).

Pure parts of :mod:`connectors.webhook.intake`, :mod:`connectors.webhook.limits`,
:mod:`streams.kernel.runtime.throttled_log` and the webhook settings; no network."""

from __future__ import annotations

import logging

import orjson
import pytest
from pydantic import SecretStr, ValidationError

from connectors.webhook.intake import MalformedCallback, _callback_fields, _Job, unbound_because
from connectors.webhook.meta import MalformedMetaCallback, parse_notification
from connectors.webhook.settings import WebhookSettings
from streams.kernel.attempt_reference import ReferenceKey
from streams.kernel.runtime.throttled_log import ThrottledLog
from streams.kernel.settings import GatewayKind, GatewaySettings

KEY = ReferenceKey("the deployment's reference key, 32+ chars")
JOB = _Job(7, "k", "inst-1", "c")
"""Job 7 of instance ``inst-1``."""


def test_a_tagged_reference_must_verify_for_the_path_gateway_and_the_jobs_instance() -> None:
    mine = KEY.reference("stackzap", "inst-1", 7, 1)
    assert unbound_because(GatewayKind.STACKZAP, JOB, mine, None, KEY) is None
    # The same callback replayed to the ZAP API's path.
    replayed = unbound_because(GatewayKind.ZAPAPI, JOB, mine, None, KEY)
    assert replayed is not None and replayed[0] == "bad_reference"
    for forged in (
        KEY.reference("stackzap", "inst-2", 7, 1),
        ReferenceKey("another deployment's key, 32+ chars").reference("stackzap", "inst-1", 7, 1),
        "7-1-" + "f" * 24,
    ):
        why = unbound_because(GatewayKind.STACKZAP, JOB, forged, None, KEY)
        assert why is not None and why[0] == "bad_reference", forged
    other_job = unbound_because(GatewayKind.STACKZAP, JOB, "8-1", None, KEY)
    assert other_job is not None and other_job[0] == "other_job"
    # Legacy and missing references are the worker's to bind (by gateway job id).
    assert unbound_because(GatewayKind.STACKZAP, JOB, "7-1", None, KEY) is None
    assert unbound_because(GatewayKind.STACKZAP, JOB, None, None, KEY) is None


def test_a_meta_status_must_name_the_jobs_phone_number_id() -> None:
    ref = KEY.reference("meta", "inst-1", 7, 1)
    assert unbound_because(GatewayKind.META, JOB, ref, "inst-1", KEY) is None
    for other in ("106540352242922", None):
        why = unbound_because(GatewayKind.META, JOB, ref, other, KEY)
        assert why is not None and why[0] == "other_phone_number"


def _nested(depth: int) -> dict[str, object]:
    value: object = "x"
    for _ in range(depth):
        value = {"a": value}
    return {"id": "g-1", "status": "read", "extra": value}


def test_a_deeply_nested_callback_is_refused_with_its_reason() -> None:
    """254+ levels answered 500 for ever (orjson cannot encode the dead-letter copy)."""
    raw = orjson.dumps(_nested(30))
    assert _callback_fields(raw)[1:3] == ("g-1", "read")
    deep = b'{"id":"g-1","status":"read","x":' + b"[" * 300 + b"]" * 300 + b"}"
    with pytest.raises(MalformedCallback, match="nested deeper than 32"):
        _callback_fields(deep)
    meta = (
        b'{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"messages",'
        b'"value":{"x":' + b"[" * 300 + b"]" * 300 + b"}}]}]}"
    )
    with pytest.raises(MalformedMetaCallback, match="nested deeper than 32"):
        parse_notification(meta)


@pytest.mark.parametrize(
    ("field", "length"),
    [("event_id", 129), ("status", 65), ("reference", 129), ("id", 257)],
)
def test_ids_longer_than_their_caps_are_refused(field: str, length: int) -> None:
    body = {"id": "g-1", "status": "read", "reference": "7-1", "event_id": "e-1"}
    assert _callback_fields(orjson.dumps(body))
    body[field] = "9" * length
    with pytest.raises(MalformedCallback, match=f"'{field}' longer than"):
        _callback_fields(orjson.dumps(body))


def test_meta_references_longer_than_the_cap_are_refused() -> None:
    status = {"id": "wamid.1", "status": "read", "biz_opaque_callback_data": "7" * 129}
    body = {
        "object": "whatsapp_business_account",
        "entry": [{"changes": [{"field": "messages", "value": {"statuses": [status]}}]}],
    }
    with pytest.raises(MalformedMetaCallback, match="'biz_opaque_callback_data' longer than"):
        parse_notification(orjson.dumps(body))


def test_refusals_are_logged_once_per_window_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    rejections = ThrottledLog(logging.getLogger("t"), window_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t"):
        logged = [
            rejections.note(("stackzap", "unauthorized"), "refused stackzap callback: mismatch")
            for _ in range(500)
        ]
        now[0] = 61.0
        logged.append(
            rejections.note(("stackzap", "unauthorized"), "refused stackzap callback: mismatch")
        )
        logged.append(
            rejections.note(("zapapi", "malformed"), "refused zapapi callback: body is not JSON")
        )
    assert logged.count(True) == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "and 499 more like it" in lines[1]


def test_a_webhook_secret_shorter_than_32_characters_is_refused() -> None:
    with pytest.raises(ValidationError, match="ZAPSTREAM_WEBHOOK_SECRET is shorter than 32"):
        WebhookSettings(secret=SecretStr("dev-webhook-secret"))
    with pytest.raises(ValidationError, match="ZAPSTREAM_WEBHOOK_SECRET is not set"):
        WebhookSettings(secret=SecretStr(""))
    assert WebhookSettings(secret=SecretStr("x" * 32)).secret.get_secret_value() == "x" * 32
    # Meta signs with META_APP_SECRET: the X-Zap secret may stay empty there.
    meta = WebhookSettings(secret=SecretStr(""), gateway=GatewaySettings(kind=GatewayKind.META))
    assert meta.secret.get_secret_value() == ""
