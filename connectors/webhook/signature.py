"""The callback signature, timestamped and bound to the gateway's path.

The header (``X-Zap-Signature`` by default) carries a Unix timestamp and one or
more HMAC-SHA256 signatures, in the style of Stripe's ``Stripe-Signature``::

    X-Zap-Signature: t=1767225600,v2=<64 lower-case hex digits>

- ``t``: when the gateway signed, in whole seconds since the Unix epoch (UTC),
  decimal digits only.
- ``v2``: lower-case hex of ``HMAC-SHA256(secret, "<t>" + "." + "<gateway>" + "." +
  raw body)``, where ``<t>`` is exactly the digits of ``t``, ``<gateway>`` the last
  segment of the webhook path the callback is POSTed to (``stackzap`` for
  ``/v1/webhooks/stackzap``, ``zapapi``) and the raw body is the request's bytes as
  sent (never re-serialised JSON). Several ``v2=`` entries may be given (while a
  secret is rotated); one matching is enough.
- Entries are separated by ``,``, whitespace around them is ignored; unknown keys
  are ignored (room for a later ``v3``).

A callback is accepted only when a ``v2`` matches *and* ``t`` is within the
replay window: at most ``window_s`` seconds old and at most ``skew_s`` seconds in
the future (clocks differ a little). Refused: the first scheme (``sha256=<hex>`` of
the body alone: no timestamp, replayable forever) and ``v1`` (``"<t>." + body``:
it does not name the gateway, so the same signed bytes verified on every gateway's
path).

Meta's Cloud API signs its webhooks its own way (``X-Hub-Signature-256:
sha256=<hex HMAC-SHA256(app secret, raw body)>``, no timestamp): see
:func:`check_hub_signature`; its subscription handshake compares a verify token
(:func:`check_verify_token`).

Shared by the intake, which verifies it, and by anything that signs callbacks
(the gateway simulator, tests). Pure: standard library only.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import time

SIGNATURE_VERSION = "v2"
UNBOUND_VERSION = "v1"
"""The refused scheme without the gateway: recognised only to say why it is refused."""
LEGACY_PREFIX = "sha256="
"""The refused, untimestamped scheme: recognised only to say why it is refused."""
DEFAULT_WINDOW_S = 300.0
DEFAULT_SKEW_S = 30.0
_MAX_TIMESTAMP_DIGITS = 12


class SignatureCheck(enum.StrEnum):
    """The outcome of :func:`check_signature`; everything but ``VALID`` is a 401."""

    VALID = "valid"
    NO_SECRET = "no secret configured"
    MISSING = "no signature header"
    MALFORMED = "signature header is not t=<unix seconds>,v2=<hex>"
    LEGACY = "untimestamped sha256= signature (the t=,v2= scheme is required)"
    UNBOUND = "v1 signature does not cover the gateway (the t=,v2= scheme is required)"
    MISMATCH = "signature mismatch"
    EXPIRED = "timestamp older than the replay window"
    FUTURE = "timestamp in the future beyond the allowed clock skew"


def signed_payload(timestamp: int, gateway: str, body: bytes) -> bytes:
    """What is signed: ``b"<timestamp>.<gateway>." + body``."""
    return f"{timestamp}.{gateway}.".encode() + body


def _digest(secret: str, timestamp: int, gateway: str, body: bytes) -> str:
    payload = signed_payload(timestamp, gateway, body)
    return hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, *, gateway: str, timestamp: int | None = None) -> str:
    """The header value for ``body`` POSTed to ``/v1/webhooks/<gateway>``:
    ``t=<timestamp>,v2=<hex>`` (``timestamp`` default: now)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},{SIGNATURE_VERSION}={_digest(secret, t, gateway, body)}"


def _parse(header: str) -> tuple[int, list[str], bool] | None:
    """``(t, [v2 signatures], any v1)`` or ``None`` when the header does not have that shape."""
    timestamp: int | None = None
    signatures: list[str] = []
    unbound = False
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            return None
        key, value = key.strip(), value.strip()
        if key == "t":
            if timestamp is not None or not value.isdigit():
                return None
            if not value.isascii() or len(value) > _MAX_TIMESTAMP_DIGITS:
                return None
            timestamp = int(value)
        elif key == SIGNATURE_VERSION:
            signatures.append(value)
        elif key == UNBOUND_VERSION:
            unbound = True
    if timestamp is None or not (signatures or unbound):
        return None
    return timestamp, signatures, unbound


def check_signature(
    secret: str,
    body: bytes,
    header: str | None,
    *,
    gateway: str,
    now: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    skew_s: float = DEFAULT_SKEW_S,
) -> SignatureCheck:
    """Whether ``header`` signs ``body`` POSTed to ``gateway``'s path under ``secret`` within
    the replay window, and why not.

    An empty secret verifies nothing: an unconfigured intake must not accept
    callbacks anyone could sign. Comparisons are constant-time.
    """
    if not secret:
        return SignatureCheck.NO_SECRET
    if header is None or not header.strip():
        return SignatureCheck.MISSING
    if header.strip().startswith(LEGACY_PREFIX):
        return SignatureCheck.LEGACY
    parsed = _parse(header)
    if parsed is None:
        return SignatureCheck.MALFORMED
    timestamp, signatures, unbound = parsed
    if not signatures and unbound:
        return SignatureCheck.UNBOUND
    expected = _digest(secret, timestamp, gateway, body).encode()
    # Every candidate is compared, so the time taken does not tell which one matched.
    matched = False
    for candidate in signatures:
        matched |= hmac.compare_digest(candidate.lower().encode(), expected)
    if not matched:
        return SignatureCheck.MISMATCH
    clock = time.time() if now is None else now
    if timestamp < clock - window_s:
        return SignatureCheck.EXPIRED
    if timestamp > clock + skew_s:
        return SignatureCheck.FUTURE
    return SignatureCheck.VALID


def verify_signature(
    secret: str,
    body: bytes,
    header: str | None,
    *,
    gateway: str,
    now: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    skew_s: float = DEFAULT_SKEW_S,
) -> bool:
    """:func:`check_signature` is ``VALID``."""
    check = check_signature(
        secret, body, header, gateway=gateway, now=now, window_s=window_s, skew_s=skew_s
    )
    return check is SignatureCheck.VALID


# --- Meta (WhatsApp Cloud API) ------------------------------------------------------------

HUB_SIGNATURE_HEADER = "X-Hub-Signature-256"
"""Meta's header: ``sha256=<hex HMAC-SHA256(app secret, raw body)>``, no timestamp."""
HUB_PREFIX = "sha256="


class HubSignatureCheck(enum.StrEnum):
    """The outcome of :func:`check_hub_signature`; everything but ``VALID`` is a 401."""

    VALID = "valid"
    NO_SECRET = "no app secret configured"
    MISSING = "no X-Hub-Signature-256 header"
    MALFORMED = "signature header is not sha256=<64 hex digits>"
    MISMATCH = "signature mismatch"


def sign_hub(app_secret: str, body: bytes) -> str:
    """Meta's header value for ``body``: ``sha256=<hex HMAC-SHA256(app_secret, body)>``."""
    return HUB_PREFIX + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def check_hub_signature(app_secret: str, body: bytes, header: str | None) -> HubSignatureCheck:
    """Whether ``header`` (``X-Hub-Signature-256``) signs the raw ``body`` under ``app_secret``.

    Meta signs the body alone, without a timestamp, so a captured callback verifies
    forever; the intake relies on what a replay can do instead (a status it published
    recently is not published again; the same event id, dropped as a duplicate by the
    worker; a receipt binds only to its job's number and attempt and never moves a job
    backwards). The header is only accepted on Meta's path, and Meta's app secret is not
    the other gateways' secret. An empty secret verifies nothing. The comparison is
    constant-time.
    """
    if not app_secret:
        return HubSignatureCheck.NO_SECRET
    if header is None or not header.strip():
        return HubSignatureCheck.MISSING
    value = header.strip()
    if not value.lower().startswith(HUB_PREFIX):
        return HubSignatureCheck.MALFORMED
    candidate = value[len(HUB_PREFIX) :].strip().lower()
    if len(candidate) != 64 or not candidate.isascii():
        return HubSignatureCheck.MALFORMED
    expected = sign_hub(app_secret, body)[len(HUB_PREFIX) :]
    if not hmac.compare_digest(candidate.encode(), expected.encode()):
        return HubSignatureCheck.MISMATCH
    return HubSignatureCheck.VALID


def check_verify_token(configured: str, offered: str | None) -> bool:
    """The subscription handshake's ``hub.verify_token`` matches (constant-time; empty never)."""
    if not configured or offered is None:
        return False
    return hmac.compare_digest(configured.encode(), offered.encode())
