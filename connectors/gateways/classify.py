"""Map transport outcomes onto the gateway error tree, once, at the edge.

Every gateway client sends through :func:`send_request`, which turns transport
exceptions and non-2xx answers into :class:`~streams.kernel.errors.PermanentGatewayError`,
:class:`~streams.kernel.errors.TransientGatewayError`,
:class:`~streams.kernel.errors.UncertainGatewayError` or
:class:`~streams.kernel.errors.InstanceUnavailableError`. Callers look at ``retriable``
and ``scope`` and never at transport types; a 2xx comes back as a
:class:`GatewayResponse` whose body is already read.

The rule depends on whether the request can have an effect. A ``GET`` (listing)
or ``HEAD`` never changes anything at the gateway; every other method (a send, a
cancel) may.

Transport exceptions (:mod:`connectors.gateways.http_transport`), by how far the
request got:

- :class:`~connectors.gateways.http_transport.NotWrittenError`: ``ConnectError``
  (refused, unreachable, DNS, TLS handshake and certificate),
  ``ConnectTimeoutError`` (``connect_timeout_s``) and ``PoolTimeoutError`` (no free
  pooled connection within ``pool_timeout_s``): nothing was written, so it is
  **transient**.
- :class:`~connectors.gateways.http_transport.PossiblyWrittenError`:
  ``ReadTimeoutError`` (``read_timeout_s`` of silence; the timer starts once the
  request was handed to the connection), ``ConnectionDroppedError`` (reset or closed
  while writing or reading), ``MalformedResponseError`` (not HTTP, cut off or
  undecodable), ``ResponseTooLargeError`` and ``TotalTimeoutError`` (the safety net,
  which cannot tell the phase apart): the gateway may have acted, **uncertain** on a
  send. The transport never resends a send on a dropped keep-alive connection (only
  a ``GET``/``HEAD`` whose reused connection closed before any byte of the answer is
  asked again, once), so a send is written at most once per call.
- :class:`~connectors.gateways.http_transport.InvalidRequestError` (``InvalidURLError``:
  malformed or not http(s); a header with a line break): our request is wrong, a
  retry fails the same way: **permanent**.
- On a ``GET`` every timeout, reset and cut-off is **transient** (a failed
  listing changed nothing).

HTTP answers:

- On a route that exists whenever the base URL is right (a send, a listing: the
  client passes ``url_setting``), a redirect, a 405, or a 404 whose message names
  no recipient or resource (``404: Not Found``, ``Cannot POST /api/v1/...``) means
  our base URL or route is wrong, not the message: **gateway misconfigured**
  (:class:`~streams.kernel.errors.GatewayMisconfigured`, an instance error naming the
  setting). The worker pauses the instance instead of failing its queue. A 404
  naming a recipient, a job or the instance keeps its meaning below.
- 401 and 403 (the gateway refused our credentials) and 404 whose message says
  the *instance* is unknown are about the instance, not the message:
  **instance unavailable** (transient, ``scope="instance"``). Nothing was sent;
  every other message of the instance would fail the same way, so the worker
  pauses the instance and probes it until an operator fixes the key.
- an answer saying the instance is disconnected (400/409/503 whose message says
  "disconnected", "not connected" or "no session": the phone lost its WhatsApp
  session) is **instance unavailable** too: paused and probed, nothing spent.
- 429 is **rate limited** (transient, ``limit="instance"``): the instance's
  throughput; the worker slows the instance down instead of spending the
  message's attempts. 429 and 503 carry ``Retry-After`` (delay-seconds,
  fractional accepted, or an HTTP date); 503 and 408 (the gateway gave up reading
  the request) are **transient**.
- 500 is **transient**: it is the gateway application's own answer, and the
  gateways we speak to answer it only when they did not enqueue the message.
- 502, 504 and every other 5xx on a send are **uncertain**: they come from a
  proxy or load balancer in front of the gateway (bad gateway, upstream
  timeout, Cloudflare-style 52x), which may answer after the upstream accepted
  the message. Resending with a new ``Idempotency-Key`` would duplicate it, so
  the caller reconciles through the listing first. On a ``GET`` they are
  **transient**.
- Every other 4xx (400, 404, 409, 422, ...) is **permanent**, with the gateway's
  error message, truncated and masked, as the reason. A 3xx elsewhere is
  permanent as well: we do not follow redirects, so it means a misconfigured
  base URL (on a send or listing route it is *gateway misconfigured*, above).

Error messages never carry a full phone number, message text, API key or token:
digit runs that look like phone numbers are masked and the caller passes the
request's sensitive values to be redacted wherever the gateway echoed them.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
from multidict import CIMultiDictProxy

from connectors.gateways.http_transport import (
    HttpTransport,
    InvalidRequestError,
    NotWrittenError,
    QueryParams,
    TransportError,
)
from connectors.outbox.recipients import mask_phone
from streams.kernel.errors import (
    GatewayError,
    GatewayMisconfigured,
    InstanceUnavailableError,
    PermanentGatewayError,
    RateLimitedError,
    TransientGatewayError,
    UncertainGatewayError,
    names_a_resource,
    without_paths,
)

MAX_REASON_CHARS = 200
"""Longest gateway error message kept in an exception (after masking)."""

TRANSPORT_EXCEPTIONS: tuple[type[BaseException], ...] = (TransportError,)
"""What a request through the transport may raise besides cancellation; all classified here."""

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that never change anything at the gateway: a failure is never uncertain."""

_INSTANCE_STATUSES = frozenset({401, 403})
_TRANSIENT_5XX_ON_SEND = frozenset({500, 503})
"""The gateway application's own 5xx: it did not enqueue the message."""

# Phone numbers in E.164 or local form, possibly with a leading "+": 8 to 15 digits.
_PHONE_RE = re.compile(r"\+?\d{8,15}")
_WRITTEN_PHONE_RE = re.compile(r"\+?\(?\d[\d ()\-]{6,24}\d", re.ASCII)
"""A number as people write it: ``+55 11 98765-4321``, ``(11) 98765-4321``."""
_ISO_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}(?!\d)", re.ASCII)


# --- masking --------------------------------------------------------------------


def mask_secret(secret: str) -> str:
    """``***`` plus, for long secrets only, the last four characters to tell keys apart."""
    if not secret:
        return ""
    if len(secret) >= 16:
        return "***" + secret[-4:]
    return "***"


def mask_text(text: str, sensitive: Iterable[str] = ()) -> str:
    """Redact every ``sensitive`` value and mask phone-like digit runs in ``text``.

    A gateway may echo a value as it was sent, JSON-escaped (``\\n`` for a newline, with
    or without ``\\u`` escapes) or with its whitespace collapsed: each form is redacted.
    """
    for value in sensitive:
        # Very short values (a one-letter message) would redact half the sentence.
        if len(value) < 3:
            continue
        forms = {
            value,
            " ".join(value.split()),
            orjson.dumps(value).decode()[1:-1],
            json.dumps(value)[1:-1],
        }
        for form in sorted(forms, key=len, reverse=True):
            if len(form) >= 3:
                text = text.replace(form, "[redacted]")
    return _WRITTEN_PHONE_RE.sub(_mask_written_phone, text)


def _mask_written_phone(match: re.Match[str]) -> str:
    """A written number (10 to 15 digits with separators, 8 to 15 without) masked as its
    digits; anything else the pattern caught (a date and time, a longer run) keeps its
    text with each run of 8 to 15 digits in it masked."""
    written = match.group(0)
    digits = "".join(c for c in written if c.isdigit())
    separated = len(digits) != len(written.lstrip("+"))
    if (10 if separated else 8) <= len(digits) <= 15 and not _ISO_DATE_RE.search(written):
        return mask_phone(digits)
    return _PHONE_RE.sub(lambda m: mask_phone(m.group(0)), written)


# --- Retry-After -------------------------------------------------------------------


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header, or ``None`` when absent or invalid.

    Accepts delay-seconds (fractions too, which our simulator sends) and HTTP dates;
    a date in the past gives ``0.0``.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # HTTP dates are always GMT; parsedate_to_datetime leaves "-0000" naive.
        when = when.replace(tzinfo=datetime.UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


# --- classification -----------------------------------------------------------------


def is_safe_method(method: str) -> bool:
    """True for a request that cannot change anything at the gateway (a listing)."""
    return method.upper() in _SAFE_METHODS


def classify_exception(
    exc: BaseException, *, gateway: str, sensitive: Iterable[str] = (), method: str = "POST"
) -> GatewayError:
    """The error-tree class for an exception the transport raised while sending a request."""
    detail = mask_text(str(exc) or type(exc).__name__, sensitive)[:MAX_REASON_CHARS]
    message = f"{gateway}: {type(exc).__name__}: {detail}"
    if isinstance(exc, NotWrittenError):
        # Nothing was written: the connection was never obtained.
        return TransientGatewayError(message)
    if isinstance(exc, InvalidRequestError):
        # Our own URL or header is wrong: a retry fails the same way.
        return PermanentGatewayError(message)
    if is_safe_method(method):
        # A listing that timed out or was cut off changed nothing: ask again later.
        return TransientGatewayError(message)
    # Everything else happens once the connection was ours and the request may have
    # been written (read timeout, reset, disconnect, cut-off or malformed answer, the
    # total safety-net timeout): the gateway may have acted on it.
    return UncertainGatewayError(message)


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayResponse:
    """A gateway's answer, read whole: what classification and the clients look at.

    ``headers`` is case-insensitive (a ``multidict.CIMultiDictProxy``). The body is
    never in ``repr``: it may echo a recipient or a text.
    """

    method: str
    status_code: int
    reason_phrase: str
    headers: Mapping[str, str] = dataclasses.field(repr=False)
    content: bytes = dataclasses.field(repr=False)


def _unknown_instance(status: int, reason: str) -> bool:
    # "instance" in a path the gateway echoes back (``Cannot POST /v1/instances/...``) is
    # the route, not an answer about the instance.
    return status == 404 and "instance" in without_paths(reason).lower()


_ROUTE_STATUSES = frozenset({404, 405})
"""On a route that exists whenever the base URL is right, these say the route is not there."""


def _wrong_route(status: int, reason: str) -> bool:
    """A redirect, 405, or a 404 that names no recipient or resource: the base URL or the
    route is wrong (``ZAP_API_URL=https://host/api`` posts to ``/api/v1/...``)."""
    if 300 <= status < 400:
        return True
    return status in _ROUTE_STATUSES and not names_a_resource(reason)


_DISCONNECTED = re.compile(r"disconnected|not connected|no session", re.IGNORECASE)


def _disconnected(status: int, reason: str) -> bool:
    """The gateway says the instance's phone lost its WhatsApp session: nothing was sent."""
    return status in (400, 409, 503) and bool(_DISCONNECTED.search(reason))


def error_for_response(
    response: GatewayResponse,
    *,
    gateway: str,
    sensitive: Iterable[str] = (),
    now: float | None = None,
    method: str | None = None,
    url_setting: str | None = None,
) -> GatewayError | None:
    """``None`` for a 2xx answer, else the error-tree class for the status code.

    ``method`` defaults to the request's. ``url_setting``: the request went to a route
    that always exists when the base URL is right (a send, a listing), named by this
    setting; a redirect, a 405 or a 404 naming no resource there is
    :class:`~streams.kernel.errors.GatewayMisconfigured` instead of permanent.
    """
    status = response.status_code
    if 200 <= status < 300:
        return None
    if method is None:
        method = response.method
    reason = error_reason(response, sensitive)
    message = f"{gateway}: HTTP {status}: {reason}" if reason else f"{gateway}: HTTP {status}"
    if status in _INSTANCE_STATUSES or _unknown_instance(status, reason):
        what = "unknown instance" if status == 404 else "gateway refused credentials"
        return InstanceUnavailableError(f"{message} ({what})", status_code=status)
    if _disconnected(status, reason):
        return InstanceUnavailableError(f"{message} (instance disconnected)", status_code=status)
    if url_setting is not None and _wrong_route(status, reason):
        return GatewayMisconfigured(
            f"{message} (no such route: the base URL or the path is wrong, check {url_setting})",
            setting=url_setting,
            status_code=status,
        )
    retry_after_s = parse_retry_after(response.headers.get("Retry-After"), now=now)
    if status == 429:
        # The instance's throughput: the worker slows the instance down (streams.pacing).
        return RateLimitedError(
            message, limit="instance", status_code=status, retry_after_s=retry_after_s
        )
    if status in (503, 408):
        return TransientGatewayError(message, status_code=status, retry_after_s=retry_after_s)
    if status >= 500:
        if is_safe_method(method) or status in _TRANSIENT_5XX_ON_SEND:
            return TransientGatewayError(message, status_code=status, retry_after_s=retry_after_s)
        # A proxy's answer: the upstream may have accepted the message before it failed.
        return UncertainGatewayError(message, status_code=status)
    return PermanentGatewayError(message, status_code=status)


def error_reason(response: GatewayResponse, sensitive: Iterable[str] = ()) -> str:
    """The gateway's own error message from a response body, masked and truncated."""
    raw = response.content
    if not raw:
        return response.reason_phrase
    text: str | None = None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw[: MAX_REASON_CHARS * 4].decode("utf-8", errors="replace")
    else:
        text = _message_from_json(body)
        if text is None:
            text = raw[: MAX_REASON_CHARS * 4].decode("utf-8", errors="replace")
    # Redacted before the whitespace is collapsed: a multi-line text echoed back must match.
    masked = " ".join(mask_text(text, sensitive).split())
    if len(masked) > MAX_REASON_CHARS:
        masked = masked[: MAX_REASON_CHARS - 3] + "..."
    return masked


def _message_from_json(body: Any) -> str | None:
    if isinstance(body, str):
        return body
    if not isinstance(body, Mapping):
        return None
    for key in ("error", "message", "detail", "error_description", "reason"):
        value = body.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, Mapping):
            nested = _message_from_json(value)
            if nested:
                return nested
        if isinstance(value, list) and value:
            # pydantic/FastAPI style: {"detail": [{"msg": ...}, ...]}
            first = value[0]
            if isinstance(first, Mapping):
                msg = first.get("msg") or first.get("message")
                if isinstance(msg, str):
                    return msg
            elif isinstance(first, str):
                return first
    return None


async def send_request(
    session: HttpTransport,
    method: str,
    url: str,
    *,
    gateway: str,
    sensitive: Iterable[str] = (),
    headers: Mapping[str, str] | None = None,
    json_body: Any = None,
    params: QueryParams | None = None,
    error_for: Callable[[GatewayResponse], GatewayError | None] | None = None,
    url_setting: str | None = None,
) -> GatewayResponse:
    """Send one request and return its 2xx answer, or raise a classified :class:`GatewayError`.

    The only place gateway clients catch transport exceptions. The body is read
    inside the request, so a reset or timeout while reading it is classified
    like one before the status line. ``error_for`` replaces :func:`error_for_response`
    for an API whose error bodies say more than the status (Meta's Graph error codes);
    it returns ``None`` for a 2xx and falls back to :func:`error_for_response` itself.
    ``url_setting``: see :func:`error_for_response` (a route that must exist).
    """
    content = orjson.dumps(json_body) if json_body is not None else None
    request_headers = dict(headers) if headers else {}
    if content is not None:
        request_headers["Content-Type"] = "application/json"
    try:
        raw = await session.request(
            method, url, headers=request_headers, body=content, params=params
        )
    except TRANSPORT_EXCEPTIONS as exc:
        raise classify_exception(exc, gateway=gateway, sensitive=sensitive, method=method) from exc
    response = GatewayResponse(
        method=method,
        status_code=raw.status,
        reason_phrase=raw.reason,
        headers=CIMultiDictProxy(raw.headers),
        content=raw.body,
    )
    if error_for is not None:
        error = error_for(response)
    else:
        error = error_for_response(
            response, gateway=gateway, sensitive=sensitive, method=method, url_setting=url_setting
        )
    if error is not None:
        raise error
    return response


def json_object(response: GatewayResponse) -> dict[str, Any] | None:
    """The response body as a JSON object, or ``None`` when it is not one."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None
