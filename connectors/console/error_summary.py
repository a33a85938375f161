"""A job's errors as the console shows them to whoever may not read message texts.

A gateway's error message is stored (redacted: :mod:`connectors.gateways.classify`) in
``last_error`` and in the job's event and attempt reasons. Redaction matches the text
the worker sent; a gateway that rewrites it (translates, quotes a part, pads it) can
still echo some of it back. Only admins may read texts, so viewers and operators see
each such error cut down to what cannot hold one (:func:`error_summary`):

- the pipeline's own words before the gateway's part (``gave up after 3 attempts``);
- the gateway's name, the HTTP status, Meta's error code (``code 131026/2494010``), the
  exception class (``ServerDisconnectedError``), a receipt's label and code;
- the gateway's message only when it is one of :data:`ALLOWED_MESSAGES` (HTTP reason
  phrases and a few fixed sentences), else ``[message hidden: admins see it]``;
- the pipeline's own explanation in parentheses at the end (``(instance disconnected)``).

A reason without a gateway's part (``expired at ...``, an operator's reprocess reason)
is the pipeline's own wording and is shown whole. Admins see everything.
"""

from __future__ import annotations

import http
import re

__all__ = ["ALLOWED_MESSAGES", "HIDDEN", "error_summary"]

HIDDEN = "[message hidden: admins see it]"

ALLOWED_MESSAGES = frozenset(
    {status.phrase.lower() for status in http.HTTPStatus}
    | {
        "server disconnected",
        "connection reset by peer",
        "connection refused",
        "timeout",
        "invalid recipient",
        "invalid phone number",
        "number not registered",
        "recipient not on whatsapp",
        "message undeliverable",
        "message expired",
        "rate limit hit",
        "re-engagement message",
        "instance not found",
        "instance disconnected",
    }
)
"""Gateway messages shown to everyone (compared lower-cased, without a final stop)."""

_GATEWAY = re.compile(r"\b(zapapi|stackzap|meta|http): ")
_RECEIPT = re.compile(r"receipt ('[A-Za-z_]{1,32}')(?:: |$)")
_HTTP = re.compile(r"HTTP (\d{3})(?:: |$)")
_META_CODE = re.compile(r"code (\d{1,9}(?:/\d{1,9})?)(?:: |$)")
_LEADING_CODE = re.compile(r"(\d{1,9})(?: |$)")
_EXCEPTION = re.compile(r"([A-Z][A-Za-z]{0,60}(?:Error|Exception|Timeout))(?:: |$)")
_FBTRACE = re.compile(r"\s*\(fbtrace_id [^)]*\)")
_OWN_SUFFIXES = (
    "(gateway refused credentials)",
    "(unknown instance)",
    "(instance disconnected)",
    "(business account in maintenance)",
    "(unknown phone number id)",
)
"""The explanations :mod:`connectors.gateways` appends to a gateway's message."""


def _message(rest: str) -> list[str]:
    """What of a gateway's message a non-admin sees: allow-listed text, our own suffix."""
    rest = _FBTRACE.sub("", rest).strip()
    suffix = next((s for s in _OWN_SUFFIXES if rest.endswith(s)), None)
    if suffix is not None:
        rest = rest[: -len(suffix)].strip()
    parts = []
    if rest:
        allowed = rest.rstrip(".").strip().lower() in ALLOWED_MESSAGES
        parts.append(rest if allowed else HIDDEN)
    return [" ".join([*parts, suffix])] if suffix else parts


def _gateway_part(rest: str) -> list[str]:
    """``zapapi: HTTP 400: ...`` as its name, status, code or exception, and message."""
    parts = []
    for pattern in (_HTTP, _META_CODE, _EXCEPTION):
        found = pattern.match(rest)
        if found is not None:
            parts.append(found.group(0).removesuffix(": "))
            rest = rest[found.end() :]
    return parts + _message(rest)


def _receipt_part(rest: str) -> list[str]:
    """A receipt's reason (Meta's ``131026 Message undeliverable: ...``): code, message."""
    found = _LEADING_CODE.match(rest)
    parts = []
    if found is not None:
        parts.append(found.group(1))
        rest = rest[found.end() :]
    title, _, _details = rest.partition(":")
    return parts + _message(title) if title.strip() else parts


def error_summary(text: str | None) -> str | None:
    """``text`` (a ``last_error`` or an event's reason) as a non-admin may see it."""
    if not text:
        return text
    receipt = _RECEIPT.match(text)
    if receipt is not None:
        # First: a receipt's reason is all the gateway's (a "meta: " inside is its too).
        parts = [f"receipt {receipt.group(1)}", *_receipt_part(text[receipt.end() :])]
        return ": ".join(parts)
    gateway = _GATEWAY.search(text)
    if gateway is not None:
        lead = text[: gateway.start()]
        parts = [gateway.group(1), *_gateway_part(text[gateway.end() :])]
        return lead + ": ".join(parts)
    return text
