"""The transport -> gateway error tree table, Retry-After parsing and masking."""

from __future__ import annotations

import email.utils
import http
from collections.abc import AsyncIterator

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from connectors.gateways.classify import (
    MAX_REASON_CHARS,
    GatewayResponse,
    classify_exception,
    error_for_response,
    error_reason,
    mask_secret,
    mask_text,
    parse_retry_after,
    send_request,
)
from connectors.gateways.http_transport import (
    ConnectError,
    ConnectionDroppedError,
    ConnectTimeoutError,
    HttpTransport,
    InvalidRequestError,
    InvalidURLError,
    MalformedResponseError,
    PoolTimeoutError,
    ReadTimeoutError,
    ResponseTooLargeError,
    TotalTimeoutError,
    TransportError,
)
from connectors.outbox.recipients import mask_phone
from streams.kernel.errors import (
    InstanceUnavailableError,
    PermanentGatewayError,
    RateLimitedError,
    TransientGatewayError,
    UncertainGatewayError,
)
from tests.unit.connectors.gateways.fake_gateway import (
    FakeGateway,
    Fault,
    Reply,
    Seen,
    answer,
    closed_port_url,
    failing,
)

REQUEST = "POST"
LISTING = "GET"
NOW = 1_700_000_000.0
PHRASES = {s.value: s.phrase for s in http.HTTPStatus}


def response(
    status: int,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    request: str = REQUEST,
) -> GatewayResponse:
    return GatewayResponse(
        method=request,
        status_code=status,
        reason_phrase=PHRASES.get(status, ""),
        headers=CIMultiDictProxy(CIMultiDict(headers or {})),
        content=body,
    )


# --- exceptions -------------------------------------------------------------------


CONNECT_FAILED = [
    ConnectError("http://gw.test: ConnectionRefusedError: [Errno 111] Connection refused"),
    ConnectError("https://gw.test: gaierror: [Errno -2] Name or service not known"),
    ConnectError("https://gw.test: SSLCertVerificationError: certificate verify failed"),
    ConnectTimeoutError("https://gw.test: connect took over 5 s"),
    PoolTimeoutError("https://gw.test: no free connection within 5 s (256 in use)"),
]
"""Raised before the request was written: connect failed, or the pool/connect budget ran out."""

AFTER_WRITTEN = [
    ReadTimeoutError("https://gw.test: no answer for 15 s after the request"),
    ConnectionDroppedError("https://gw.test: closed by the peer", before_answer=True),
    ConnectionDroppedError("https://gw.test: ConnectionResetError: reset", before_answer=False),
    MalformedResponseError("not an HTTP/1.x status line"),
    MalformedResponseError("answer cut off (connection closed in LENGTH)"),
    ResponseTooLargeError("answer body of 99999999 bytes is too large"),
    TotalTimeoutError("https://gw.test: total timeout"),
]
"""Raised once the request was (or may have been) written."""


@pytest.mark.parametrize("exc", CONNECT_FAILED, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_connect_failures_are_transient(exc: BaseException, method: str) -> None:
    err = classify_exception(exc, gateway="stackzap", method=method)
    assert type(err) is TransientGatewayError
    assert err.retriable
    assert err.status_code is None
    assert str(err).startswith(f"stackzap: {type(exc).__name__}: ")


@pytest.mark.parametrize("exc", AFTER_WRITTEN, ids=lambda e: type(e).__name__)
def test_failures_after_the_request_was_written_are_uncertain_on_a_send(
    exc: BaseException,
) -> None:
    err = classify_exception(exc, gateway="stackzap")
    assert type(err) is UncertainGatewayError
    assert not err.retriable
    assert err.status_code is None
    assert str(err).startswith("stackzap: ")


@pytest.mark.parametrize(
    "exc",
    [
        InvalidURLError("malformed URL: ValueError"),
        InvalidURLError("not an http(s) URL (scheme 'ftp')"),
        InvalidRequestError("header 'X-API-Key' has a line break"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_wrong_url_is_permanent(exc: BaseException) -> None:
    err = classify_exception(exc, gateway="g")
    assert type(err) is PermanentGatewayError
    assert not err.retriable


def test_exception_message_masks_sensitive_values() -> None:
    exc = ConnectionDroppedError(
        "peer said 5511987654321 hello world secret-key-123", before_answer=False
    )
    err = classify_exception(exc, gateway="zapapi", sensitive=("hello world", "secret-key-123"))
    assert "5511987654321" not in str(err)
    assert "hello world" not in str(err)
    assert "secret-key-123" not in str(err)
    assert "55*******4321" in str(err)


@pytest.mark.parametrize("exc", AFTER_WRITTEN + CONNECT_FAILED, ids=lambda e: type(e).__name__)
def test_a_failed_listing_is_transient_never_uncertain(exc: BaseException) -> None:
    err = classify_exception(exc, gateway="g", method="GET")
    assert isinstance(err, TransientGatewayError)
    assert not isinstance(err, UncertainGatewayError)


@pytest.fixture
async def session() -> AsyncIterator[HttpTransport]:
    """A transport with short timeouts, closed after the test."""
    async with HttpTransport(
        connect_timeout_s=0.2, read_timeout_s=0.2, pool_timeout_s=0.2, total_timeout_s=2.0
    ) as transport:
        yield transport


@pytest.mark.parametrize("fault", [Fault.STALL, Fault.DISCONNECT, Fault.CUT_BODY, Fault.GARBAGE])
async def test_send_request_after_written_get_is_transient_post_uncertain(
    fault: Fault, session: HttpTransport
) -> None:
    """Real sockets: each way a written request can fail, on a listing and on a send."""
    async with FakeGateway(failing(fault)) as fake:
        with pytest.raises(TransientGatewayError):
            await send_request(session, "GET", f"{fake.url}/x", gateway="g")
        with pytest.raises(UncertainGatewayError) as info:
            await send_request(session, "POST", f"{fake.url}/x", gateway="g", json_body={})
        assert isinstance(info.value.__cause__, TransportError)
        # A GET may be asked again once on a stale connection; a POST is written once.
        assert [s.method for s in fake.seen].count("POST") == 1


# --- responses --------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 202, 204])
def test_2xx_is_not_an_error(status: int) -> None:
    assert error_for_response(response(status), gateway="g") is None


@pytest.mark.parametrize("status", [500, 503, 408])
def test_gateway_5xx_and_408_on_a_send_are_transient(status: int) -> None:
    err = error_for_response(response(status, b'{"error":"down"}'), gateway="g")
    assert isinstance(err, TransientGatewayError)
    assert not isinstance(err, InstanceUnavailableError)
    assert err.retriable
    assert err.status_code == status
    assert err.retry_after_s is None
    assert "down" in str(err)


@pytest.mark.parametrize("status", [502, 504, 501, 520, 524, 599])
def test_proxy_5xx_on_a_send_is_uncertain(status: int) -> None:
    """A proxy may answer 502/504 after the upstream accepted: reconcile, never blind resend."""
    err = error_for_response(response(status, b'{"error":"bad gateway"}'), gateway="g")
    assert isinstance(err, UncertainGatewayError)
    assert not err.retriable
    assert err.status_code == status


@pytest.mark.parametrize("status", [500, 502, 503, 504, 599])
def test_any_5xx_on_a_listing_is_transient(status: int) -> None:
    err = error_for_response(response(status, request=LISTING), gateway="g")
    assert isinstance(err, TransientGatewayError)


def test_method_argument_overrides_the_request() -> None:
    err = error_for_response(response(502), gateway="g", method="GET")
    assert isinstance(err, TransientGatewayError)


@pytest.mark.parametrize(
    ("status", "body", "what"),
    [
        (401, b'{"error":"unauthorized"}', "refused credentials"),
        (403, b'{"message":"forbidden"}', "refused credentials"),
        (404, b'{"error":"unknown instance"}', "unknown instance"),
        (404, b'{"message":"Instance not found","code":404}', "unknown instance"),
    ],
)
def test_auth_and_unknown_instance_are_about_the_instance(
    status: int, body: bytes, what: str
) -> None:
    for request in (REQUEST, LISTING):
        err = error_for_response(response(status, body, request=request), gateway="g")
        assert isinstance(err, InstanceUnavailableError)
        assert isinstance(err, TransientGatewayError)  # callers that do not know it retry
        assert err.retriable and err.scope == "instance"
        assert err.status_code == status
        assert what in str(err)


def test_instance_error_never_carries_the_key() -> None:
    key = "sk-live-0123456789abcdef"
    err = error_for_response(
        response(401, f'{{"error":"bad key {key}"}}'.encode()), gateway="g", sensitive=(key,)
    )
    assert isinstance(err, InstanceUnavailableError)
    assert key not in str(err)


def test_404_unknown_job_stays_permanent() -> None:
    err = error_for_response(response(404, b'{"error":"unknown job"}'), gateway="g")
    assert isinstance(err, PermanentGatewayError) and err.scope == "message"


@pytest.mark.parametrize("status", [429, 503])
def test_429_and_503_honour_retry_after_seconds(status: int) -> None:
    err = error_for_response(response(status, headers={"Retry-After": "7"}), gateway="g", now=NOW)
    assert isinstance(err, TransientGatewayError)
    assert err.status_code == status
    assert err.retry_after_s == 7.0


def test_429_retry_after_http_date() -> None:
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    err = error_for_response(response(429, headers={"Retry-After": date}), gateway="g", now=NOW)
    assert isinstance(err, TransientGatewayError)
    assert err.retry_after_s == pytest.approx(30.0)


def test_429_without_retry_after() -> None:
    err = error_for_response(response(429), gateway="g")
    assert isinstance(err, TransientGatewayError)
    assert err.retry_after_s is None


def test_429_is_the_instance_rate_limit_and_503_is_not() -> None:
    limited = error_for_response(response(429, headers={"Retry-After": "2"}), gateway="g")
    assert isinstance(limited, RateLimitedError) and limited.limit == "instance"
    unavailable = error_for_response(response(503, headers={"Retry-After": "2"}), gateway="g")
    assert not isinstance(unavailable, RateLimitedError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("0", 0.0),
        ("120", 120.0),
        (" 3 ", 3.0),
        ("1.5", 1.5),
        ("-1", None),
        ("nan", None),
        ("inf", None),
        ("soon", None),
        (email.utils.formatdate(NOW - 60, usegmt=True), 0.0),
        (email.utils.formatdate(NOW + 90, usegmt=True), 90.0),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    result = parse_retry_after(value, now=NOW)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


@pytest.mark.parametrize("status", [400, 404, 409, 410, 413, 418, 422, 301, 302])
def test_other_4xx_and_3xx_are_permanent(status: int) -> None:
    err = error_for_response(response(status, b'{"error":"invalid recipient"}'), gateway="g")
    assert isinstance(err, PermanentGatewayError)
    assert not err.retriable
    assert err.status_code == status
    assert "invalid recipient" in str(err)
    assert f"HTTP {status}" in str(err)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"error": "bad to"}', "bad to"),
        (b'{"message": "bad to", "code": 400}', "bad to"),
        (b'{"error": {"code": 7, "message": "nested"}}', "nested"),
        (b'{"detail": [{"loc": ["to"], "msg": "field required"}]}', "field required"),
        (b'"just a string"', "just a string"),
        (b"<html>Bad   Gateway</html>", "<html>Bad Gateway</html>"),
        (b"", "Unprocessable Entity"),
    ],
)
def test_error_reason_shapes(body: bytes, reason: str) -> None:
    assert error_reason(response(422, body)) == reason


def test_error_reason_truncated_and_masked() -> None:
    body = (
        b'{"error": "recipient 5511987654321 rejected text Ola mundo segredo ' + b"x" * 500 + b'"}'
    )
    reason = error_reason(response(400, body), sensitive=("Ola mundo segredo",))
    assert len(reason) == MAX_REASON_CHARS
    assert reason.endswith("...")
    assert "5511987654321" not in reason
    assert "55*******4321" in reason
    assert "Ola mundo segredo" not in reason


TEXT_2FA = "Your code is 482913.\nDo not share it."


@pytest.mark.parametrize(
    "body",
    [
        # The text echoed in a JSON message (decoded: real newline), in a non-JSON body
        # JSON-escaped, and with its whitespace collapsed by the gateway.
        orjson.dumps({"error": f"bad template for text {TEXT_2FA}"}),
        b'<html>rejected "Your code is 482913.\\nDo not share it."</html>',
        b"rejected: Your code is 482913. Do not share it.",
    ],
)
def test_a_multi_line_text_echoed_back_never_reaches_the_reason(body: bytes) -> None:
    reason = error_reason(response(400, body), sensitive=(TEXT_2FA,))
    assert "482913" not in reason and "[redacted]" in reason, reason


# --- masking ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phone", "masked"),
    [
        ("5511987654321", "55*******4321"),
        ("+5511987654321", "+5********4321"),
        ("551198765", "55*****65"),
        ("1415555267", "14******67"),  # a 10-digit number: six digits hidden, not two
        ("12345678", "******78"),
        ("12", "**"),
        ("", ""),
    ],
)
def test_mask_phone(phone: str, masked: str) -> None:
    assert mask_phone(phone) == masked


def test_mask_secret() -> None:
    assert mask_secret("") == ""
    assert mask_secret("short") == "***"
    assert mask_secret("sk_live_0123456789abcdef") == "***cdef"


def test_mask_text_redacts_and_masks_digit_runs() -> None:
    text = "to 5511987654321 from key abcdefgh with 1234 and hi"
    masked = mask_text(text, ("abcdefgh", "hi"))
    assert masked == "to 55*******4321 from key [redacted] with 1234 and hi"


# --- send_request ------------------------------------------------------------------


async def test_send_request_raises_classified_and_chains(session: HttpTransport) -> None:
    with pytest.raises(TransientGatewayError) as info:
        await send_request(session, "POST", f"{closed_port_url()}/x", gateway="g", json_body={})
    assert isinstance(info.value.__cause__, ConnectError)


async def test_send_request_returns_2xx_and_sends_json(session: HttpTransport) -> None:
    async with FakeGateway(answer(200, {"ok": True}, {"Retry-After": "3"})) as fake:
        resp = await send_request(session, "POST", f"{fake.url}/x", gateway="g", json_body={"a": 1})
    assert resp.status_code == 200
    assert resp.content == b'{"ok":true}'
    assert resp.headers["retry-after"] == "3"  # case-insensitive
    seen: Seen = fake.seen[0]
    assert seen.headers["content-type"] == "application/json"
    assert seen.content == b'{"a":1}'


async def test_send_request_classifies_answers_with_their_body(session: HttpTransport) -> None:
    body = b'{"error": "slow down 5511987654321"}'
    async with FakeGateway(lambda _: Reply(429, body=body, headers={"Retry-After": "2"})) as fake:
        with pytest.raises(TransientGatewayError) as info:
            await send_request(session, "POST", f"{fake.url}/x", gateway="g", json_body={})
    assert info.value.status_code == 429
    assert info.value.retry_after_s == 2.0
    assert "slow down 55*******4321" in str(info.value)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (503, b'{"error":"instance disconnected"}'),
        (400, b'{"message":"You are not connected.","code":400}'),
        (409, b'{"error":"no session for this instance"}'),
    ],
)
def test_a_disconnected_instance_is_the_instance_not_the_message(status: int, body: bytes) -> None:
    err = error_for_response(response(status, body), gateway="g")
    assert isinstance(err, InstanceUnavailableError) and err.scope == "instance"
    assert "disconnected" in str(err)


def test_a_plain_503_is_still_transient_for_the_message() -> None:
    err = error_for_response(response(503, b'{"error":"service unavailable"}'), gateway="g")
    assert type(err) is TransientGatewayError


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("invalid number +55 11 98765-4321 sent", "invalid number 55*******4321 sent"),
        ("recipient (11) 98765-4321 blocked", "recipient 11*******21 blocked"),
        ("55-11-98765-4321.", "55*******4321."),
        ("at 2026-12-04 21:30:02 to 5511987654321", "at 2026-12-04 21:30:02 to 55*******4321"),
        ("since 2026-12-04 5511987654321", "since 2026-12-04 55*******4321"),
        ("HTTP 503 after 30 s, 10.0.0.12:8080", "HTTP 503 after 30 s, 10.0.0.12:8080"),
    ],
)
def test_mask_text_masks_numbers_written_with_separators(text: str, masked: str) -> None:
    assert mask_text(text) == masked
