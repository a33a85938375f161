"""Meta's webhook pieces: X-Hub-Signature-256, the verify-token handshake, notification parsing.

No network; bodies are built here in the shape Meta documents.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import orjson
import pytest

from connectors.webhook.meta import (
    MalformedMetaCallback,
    handshake_challenge,
    parse_notification,
)
from connectors.webhook.signature import (
    HubSignatureCheck,
    check_hub_signature,
    check_verify_token,
    sign_hub,
)

SECRET = "meta-app-secret-0123456789"
PHONE = "5521998877665"
WAMID = "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJDQjZCMzlEQUE4OTJBMTE4RTUA"


def notification(*statuses: dict[str, Any], field: str = "messages") -> dict[str, Any]:
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": "102290129340398",
                "changes": [
                    {
                        "field": field,
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {
                                "display_phone_number": "15550783881",
                                "phone_number_id": "106540352242922",
                            },
                            "statuses": list(statuses),
                        },
                    }
                ],
            }
        ],
    }


def status(label: str = "delivered", **extra: Any) -> dict[str, Any]:
    return {
        "id": WAMID,
        "status": label,
        "timestamp": "1750263773",
        "recipient_id": PHONE,
        "biz_opaque_callback_data": "41-2",
        **extra,
    }


# --- X-Hub-Signature-256 -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "body"),
    [("Jefe", b"what do ya want for nothing?"), ("key", b'{"object":"x"}')],
)
def test_sign_hub_is_hmac_sha256_of_the_raw_body(key: str, body: bytes) -> None:
    expected = hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
    assert sign_hub(key, body) == "sha256=" + expected


def test_rfc4231_case_2() -> None:
    digest = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert sign_hub("Jefe", b"what do ya want for nothing?") == "sha256=" + digest


def test_a_valid_signature_verifies_and_accepts_upper_case_hex() -> None:
    body = orjson.dumps(notification(status()))
    header = sign_hub(SECRET, body)
    assert check_hub_signature(SECRET, body, header) is HubSignatureCheck.VALID
    upper = "sha256=" + header.removeprefix("sha256=").upper()
    assert check_hub_signature(SECRET, body, upper) is HubSignatureCheck.VALID


@pytest.mark.parametrize(
    ("secret", "header", "expected"),
    [
        ("", "sha256=" + "0" * 64, HubSignatureCheck.NO_SECRET),
        (SECRET, None, HubSignatureCheck.MISSING),
        (SECRET, "  ", HubSignatureCheck.MISSING),
        (SECRET, "sha1=abc", HubSignatureCheck.MALFORMED),
        (SECRET, "sha256=abc", HubSignatureCheck.MALFORMED),
        (SECRET, "t=1,v1=" + "0" * 64, HubSignatureCheck.MALFORMED),
        (SECRET, "sha256=" + "0" * 64, HubSignatureCheck.MISMATCH),
    ],
)
def test_refusals(secret: str, header: str | None, expected: HubSignatureCheck) -> None:
    assert check_hub_signature(secret, b"{}", header) is expected


def test_a_changed_body_or_another_secret_does_not_verify() -> None:
    body = orjson.dumps(notification(status("delivered")))
    header = sign_hub(SECRET, body)
    forged = body.replace(b"delivered", b"read")
    assert check_hub_signature(SECRET, forged, header) is HubSignatureCheck.MISMATCH
    assert check_hub_signature("other", body, header) is HubSignatureCheck.MISMATCH


# --- the subscription handshake ------------------------------------------------------------


def test_handshake_reads_subscribe_requests_only() -> None:
    query = {"hub.mode": "subscribe", "hub.verify_token": "tok", "hub.challenge": "1158201444"}
    assert handshake_challenge(query) == ("tok", "1158201444")
    assert handshake_challenge({**query, "hub.mode": "unsubscribe"}) == (None, None)
    assert handshake_challenge({}) == (None, None)


@pytest.mark.parametrize(
    ("configured", "offered", "ok"),
    [("tok", "tok", True), ("tok", "tok2", False), ("tok", None, False), ("", "", False)],
)
def test_verify_token(configured: str, offered: str | None, ok: bool) -> None:
    assert check_verify_token(configured, offered) is ok


# --- notification bodies -------------------------------------------------------------------


def test_status_fields() -> None:
    parsed = parse_notification(orjson.dumps(notification(status("read"))))
    assert parsed.ignored == 0
    (item,) = parsed.statuses
    assert (item.wamid, item.status, item.reference) == (WAMID, "read", "41-2")
    assert item.phone_number_id == "106540352242922"
    assert item.timestamp == "1750263773"
    assert item.reason is None
    assert PHONE not in repr(item)


def test_several_statuses_and_entries() -> None:
    body = notification(status("sent"), status("delivered", id="wamid.B"))
    body["entry"].append(notification(status("read", id="wamid.C"))["entry"][0])
    parsed = parse_notification(orjson.dumps(body))
    assert [(s.wamid, s.status) for s in parsed.statuses] == [
        (WAMID, "sent"),
        ("wamid.B", "delivered"),
        ("wamid.C", "read"),
    ]


def test_failed_status_carries_the_masked_reason() -> None:
    errors = [
        {
            "code": 131026,
            "title": "Message undeliverable",
            "message": "Message undeliverable",
            "error_data": {"details": f"Recipient {PHONE} is not on WhatsApp"},
            "href": "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/",
        }
    ]
    parsed = parse_notification(orjson.dumps(notification(status("failed", errors=errors))))
    (item,) = parsed.statuses
    assert item.status == "failed"
    assert item.reason is not None
    assert item.reason.startswith("131026 Message undeliverable")
    assert "not on WhatsApp" in item.reason
    assert PHONE not in item.reason


def test_status_without_reference_is_still_a_status() -> None:
    plain = status()
    del plain["biz_opaque_callback_data"]
    (item,) = parse_notification(orjson.dumps(notification(plain))).statuses
    assert item.reference is None


def test_inbound_messages_and_other_fields_are_ignored_not_errors() -> None:
    inbound = notification()
    value = inbound["entry"][0]["changes"][0]["value"]
    del value["statuses"]
    value["messages"] = [{"from": PHONE, "id": "wamid.IN", "type": "text"}]
    parsed = parse_notification(orjson.dumps(inbound))
    assert (parsed.statuses, parsed.ignored) == ((), 1)
    other = parse_notification(orjson.dumps(notification(status(), field="account_update")))
    assert (other.statuses, other.ignored) == ((), 1)


def test_dead_letter_record_masks_the_recipient() -> None:
    (item,) = parse_notification(orjson.dumps(notification(status()))).statuses
    record = item.dead_letter_record()
    assert record["id"] == WAMID and record["biz_opaque_callback_data"] == "41-2"
    assert PHONE not in orjson.dumps(record).decode()


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        orjson.dumps({"object": "page", "entry": []}),
        orjson.dumps({"object": "whatsapp_business_account"}),
        orjson.dumps({"object": "whatsapp_business_account", "entry": [{"id": "1"}]}),
        orjson.dumps(notification({"status": "read"})),
        orjson.dumps(notification({"id": WAMID})),
        orjson.dumps(notification(status(biz_opaque_callback_data=7))),
    ],
)
def test_malformed_bodies(raw: bytes) -> None:
    with pytest.raises(MalformedMetaCallback):
        parse_notification(raw)
