"""Timestamped callback signatures (signature.py), the intake's references and dedup keys.

No network; the clock is passed in."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from connectors.webhook.intake import dead_letter_record, parse_reference, receipt_event_id
from connectors.webhook.signature import (
    SignatureCheck,
    check_signature,
    sign,
    signed_payload,
    verify_signature,
)

T = 1_767_225_600
WORKED_EXAMPLE_V2 = "4faeac64faf2364b7c335d2278cca9aeb720ee0b95a575d761768fc81724ddea"
"""A fixed signing time; ``now`` is passed explicitly so nothing depends on the clock."""

G = "stackzap"
"""The gateway of the webhook path every callback here is POSTed to."""

# RFC 4231 test case 2 and the classic "quick brown fox" vector, as "<t>.<gateway>.<body>" payloads:
# the HMAC must be of exactly these bytes.
VECTORS = [
    ("Jefe", b"what do ya want for nothing?"),
    ("key", b"The quick brown fox jumps over the lazy dog"),
]


def _hmac(secret: str, payload: bytes) -> str:
    return hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()


@pytest.mark.parametrize(("secret", "body"), VECTORS)
def test_sign_is_hmac_of_timestamp_gateway_and_body(secret: str, body: bytes) -> None:
    header = sign(secret, body, gateway=G, timestamp=T)
    assert header == f"t={T},v2={_hmac(secret, f'{T}.{G}.'.encode() + body)}"
    assert signed_payload(T, G, body) == f"{T}.{G}.".encode() + body
    assert verify_signature(secret, body, header, gateway=G, now=T)


def test_the_same_signed_bytes_are_refused_on_another_gateways_path() -> None:
    """Issue 18, finding 2: v1 signed "<t>.<body>", so a StackZap callback replayed to
    /v1/webhooks/zapapi verified there too."""
    body = b'{"id":"g-1","status":"read","reference":"7-1"}'
    header = sign("s3cret", body, gateway="stackzap", timestamp=T)
    assert check_signature("s3cret", body, header, gateway="stackzap", now=T) is (
        SignatureCheck.VALID
    )
    assert check_signature("s3cret", body, header, gateway="zapapi", now=T) is (
        SignatureCheck.MISMATCH
    )
    # The old v1 scheme (no gateway) is refused, even correct, with the reason.
    v1 = f"t={T},v1={_hmac('s3cret', f'{T}.'.encode() + body)}"
    assert check_signature("s3cret", body, v1, gateway="stackzap", now=T) is (
        SignatureCheck.UNBOUND
    )


def test_rfc4231_vector_through_the_payload() -> None:
    # HMAC-SHA256("Jefe", "what do ya want for nothing?") is RFC 4231's test case 2:
    # the primitive is the standard one, only the payload is prefixed.
    assert _hmac("Jefe", b"what do ya want for nothing?") == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )


def test_the_documented_worked_example() -> None:
    # connectors/webhook/intake.py's docstring shows this header to gateway implementers.
    header = sign("s3cret", b'{"id":"g-1","status":"read"}', gateway=G, timestamp=1767225600)
    assert header == f"t=1767225600,v2={WORKED_EXAMPLE_V2}"


def test_sign_uses_the_raw_bytes_and_the_clock_by_default() -> None:
    body = b'{"id":"g-1","status":"read"}'
    assert sign("s3cret", body, gateway=G, timestamp=T) != sign(
        "s3cret", b'{"status":"read","id":"g-1"}', gateway=G, timestamp=T
    )
    header = sign("s3cret", body, gateway=G)
    assert check_signature("s3cret", body, header, gateway=G) is SignatureCheck.VALID


def test_tampered_body_or_timestamp_is_rejected() -> None:
    body = b'{"id":"g-1","status":"sent"}'
    header = sign("s3cret", body, gateway=G, timestamp=T)
    assert check_signature("s3cret", body, header, gateway=G, now=T) is SignatureCheck.VALID
    for other in (b'{"id":"g-1","status":"read"}', body + b" "):
        assert check_signature("s3cret", other, header, gateway=G, now=T) is SignatureCheck.MISMATCH
    # Moving the timestamp forward (to pass the window) breaks the signature.
    moved = header.replace(f"t={T}", f"t={T + 1000}")
    assert (
        check_signature("s3cret", body, moved, gateway=G, now=T + 1000) is SignatureCheck.MISMATCH
    )


def test_wrong_secret_is_rejected() -> None:
    body = b'{"id":"g-1","status":"sent"}'
    header = sign("s3cret", body, gateway=G, timestamp=T)
    assert check_signature("other", body, header, gateway=G, now=T) is SignatureCheck.MISMATCH


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [
        (0, SignatureCheck.VALID),
        (300, SignatureCheck.VALID),
        (301, SignatureCheck.EXPIRED),
        (86_400, SignatureCheck.EXPIRED),
        (-30, SignatureCheck.VALID),
        (-31, SignatureCheck.FUTURE),
    ],
)
def test_replay_window_and_clock_skew(age_s: int, expected: SignatureCheck) -> None:
    body = b'{"id":"g-1","status":"failed"}'
    header = sign("s3cret", body, gateway=G, timestamp=T - age_s)
    assert (
        check_signature("s3cret", body, header, gateway=G, now=T, window_s=300, skew_s=30)
        is expected
    )


def test_rotation_any_v2_may_match_and_unknown_keys_are_ignored() -> None:
    body = b"{}"
    good = sign("s3cret", body, gateway=G, timestamp=T).split("v2=")[1]
    header = f"t={T}, v2={'0' * 64}, v0=legacy, v1={'0' * 64}, v2={good}"
    assert verify_signature("s3cret", body, header, gateway=G, now=T)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, SignatureCheck.MISSING),
        ("", SignatureCheck.MISSING),
        ("sha256=" + "0" * 64, SignatureCheck.LEGACY),
        ("0" * 64, SignatureCheck.MALFORMED),
        (f"t={T}", SignatureCheck.MALFORMED),
        ("v2=" + "0" * 64, SignatureCheck.MALFORMED),
        (f"t=-{T},v2=" + "0" * 64, SignatureCheck.MALFORMED),
        (f"t={T}.5,v2=" + "0" * 64, SignatureCheck.MALFORMED),
        (f"t={T},t={T},v2=" + "0" * 64, SignatureCheck.MALFORMED),
        ("t=1" + "0" * 20 + ",v2=" + "0" * 64, SignatureCheck.MALFORMED),
        (f"t={T},v1=" + "0" * 64, SignatureCheck.UNBOUND),
    ],
)
def test_missing_legacy_or_malformed_headers_are_rejected(
    header: str | None, expected: SignatureCheck
) -> None:
    assert check_signature("s3cret", b"{}", header, gateway=G, now=T) is expected


def test_the_old_untimestamped_scheme_is_refused_even_when_correct() -> None:
    body = b'{"id":"g-1","status":"read"}'
    legacy = "sha256=" + _hmac("s3cret", body)
    assert check_signature("s3cret", body, legacy, gateway=G, now=T) is SignatureCheck.LEGACY


def test_empty_secret_verifies_nothing() -> None:
    body = b"{}"
    # Even a "correct" signature under the empty key: an unconfigured intake accepts nothing.
    header = sign("", body, gateway=G, timestamp=T)
    assert check_signature("", body, header, gateway=G, now=T) is SignatureCheck.NO_SECRET


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


def test_dead_letter_record_keeps_allow_listed_scalars_only() -> None:
    """Issue 18, finding 8: the dead-letter copy kept nested recipients and texts in clear."""
    body = {
        "id": "g-1",
        "status": "failed",
        "reference": "7-1",
        "event_id": "e" * 500,
        "timestamp": 1767225600,
        "to": "5511987654321",
        "message": {"to": "5511987654321", "text": "Your code is 482913"},
        "data": [{"phone": "5511987654321"}],
    }
    record = dead_letter_record("stackzap", body)
    assert record == {
        "gateway": "stackzap",
        "id": "g-1",
        "status": "failed",
        "reference": "7-1",
        "event_id": "e" * 128,
        "timestamp": 1767225600,
    }
    nested = dead_letter_record("zapapi", {"id": {"to": "5511987654321"}, "status": ["x"]})
    assert nested["id"] is None and nested["status"] is None
    assert "5511987654321" not in repr(record) + repr(nested)


def test_a_signer_upgrading_from_v1_may_send_both_entries() -> None:
    """The documented upgrade path: ``v1`` beside ``v2`` is ignored, ``v2`` is checked."""

    secret, body, t = "u" * 32, b'{"id":"g-1","status":"read"}', 1767225600
    v1 = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    both = f"t={t},v1={v1},{sign(secret, body, gateway='stackzap', timestamp=t)[len(f't={t},') :]}"
    assert check_signature(secret, body, both, gateway="stackzap", now=t) is SignatureCheck.VALID
    # Replayed to another gateway's path, the v1 entry beside it does not help.
    assert check_signature(secret, body, both, gateway="zapapi", now=t) is SignatureCheck.MISMATCH
