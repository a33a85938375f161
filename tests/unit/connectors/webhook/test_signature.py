"""Callback signatures (signature.py), and the intake's references and dedup keys (no network)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from connectors.webhook.intake import masked_body, parse_reference, receipt_event_id
from connectors.webhook.signature import sign, verify_signature

# RFC 4231 test case 2 and the classic "quick brown fox" vector.
VECTORS = [
    (
        "Jefe",
        b"what do ya want for nothing?",
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
    ),
    (
        "key",
        b"The quick brown fox jumps over the lazy dog",
        "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8",
    ),
]


@pytest.mark.parametrize(("secret", "body", "digest"), VECTORS)
def test_sign_matches_known_hmac_sha256_vectors(secret: str, body: bytes, digest: str) -> None:
    assert sign(secret, body) == f"sha256={digest}"
    assert verify_signature(secret, body, f"sha256={digest}")


def test_sign_is_hmac_of_the_raw_bytes() -> None:
    body = b'{"id":"g-1","status":"read"}'
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert sign("s3cret", body) == "sha256=" + expected
    # Same JSON, other bytes: another signature (we never re-serialise before verifying).
    assert sign("s3cret", b'{"status":"read","id":"g-1"}') != sign("s3cret", body)


def test_tampered_body_is_rejected() -> None:
    body = b'{"id":"g-1","status":"sent"}'
    header = sign("s3cret", body)
    assert verify_signature("s3cret", body, header)
    assert not verify_signature("s3cret", b'{"id":"g-1","status":"read"}', header)
    assert not verify_signature("s3cret", body + b" ", header)


def test_wrong_secret_is_rejected() -> None:
    body = b'{"id":"g-1","status":"sent"}'
    assert not verify_signature("other", body, sign("s3cret", body))


def test_missing_prefix_or_header_is_rejected() -> None:
    body = b'{"id":"g-1","status":"sent"}'
    bare = sign("s3cret", body).removeprefix("sha256=")
    assert not verify_signature("s3cret", body, bare)
    assert not verify_signature("s3cret", body, "sha1=" + bare)
    assert not verify_signature("s3cret", body, None)
    assert not verify_signature("s3cret", body, "")


def test_empty_secret_verifies_nothing() -> None:
    body = b"{}"
    # Even a "correct" signature under the empty key: an unconfigured intake accepts nothing.
    assert not verify_signature("", body, sign("", body))


@pytest.mark.parametrize(
    ("reference", "job_id"),
    [
        ("42-1", 42),
        ("7-12", 7),
        (" 9-3 ", 9),
        (None, None),
        ("", None),
        ("42", None),
        ("abc-1", None),
        ("42-x", None),
        ("-1", None),
        ("0-1", None),
        ("order-42-1", None),
        (f"{2**63}-1", None),
    ],
)
def test_parse_reference(reference: str | None, job_id: int | None) -> None:
    assert parse_reference(reference) == job_id


def test_event_id_digest_is_stable_and_label_case_insensitive() -> None:
    a = receipt_event_id("zapapi", "g-1", "DELIVERED")
    assert a == receipt_event_id("zapapi", "g-1", "delivered")
    assert a == hashlib.sha256(b"zapapi:g-1:delivered").hexdigest()[:32]
    assert len(a) == 32
    assert a != receipt_event_id("stackzap", "g-1", "delivered")
    assert a != receipt_event_id("zapapi", "g-1", "read")


def test_masked_body_hides_recipients_only() -> None:
    body = {"id": "g-1", "status": "failed", "to": "5511987654321", "phone": 5}
    masked = masked_body(body)
    assert masked == {"id": "g-1", "status": "failed", "to": "5511*****4321", "phone": 5}
    assert body["to"] == "5511987654321"  # the caller's dict is untouched
