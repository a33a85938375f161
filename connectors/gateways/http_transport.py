"""A lean HTTP/1.1 keep-alive client on ``asyncio.Protocol``: the gateway clients' transport.

Why our own: the worker has a budget of 0.35 ms CPU per message (issue 20) and the
gateway call through aiohttp's client cost 90-150 us of it per request, about a quarter.
The gateways need little of HTTP: one origin, small JSON bodies, HTTP/1.1 keep-alive,
no cookies, no proxies, no redirects. This module is that and nothing more.

What it guarantees, because :mod:`connectors.gateways.classify` relies on it: every
failure is one of three exception families that say how far the request got.

- :class:`NotWrittenError`: nothing of the request left this process (connect refused,
  DNS, TLS handshake or certificate, connect timeout, no free pooled connection within
  ``pool_timeout_s``). Retrying cannot duplicate anything.
- :class:`PossiblyWrittenError`: the request was handed to a connection and may have
  reached the gateway (reset or closed while writing or reading, read timeout, a
  malformed, cut-off or oversize answer, the total safety-net timeout).
- :class:`InvalidRequestError`: our URL or a header is wrong; a retry fails the same way.

Rules the pool keeps (one :class:`_Pool` per origin: scheme, host, port):

- at most ``max_connections`` requests in flight, hence open connections; waiting for a
  free slot is bounded by ``pool_timeout_s``;
- a connection goes back to the pool only when its answer allowed keep-alive and was
  read whole; any failure or cancellation aborts it (never half-used in the pool);
- an idle connection is reused for ``keepalive_s`` (5 s) at most, so one the gateway or
  its load balancer may already have closed is not used for a send, and never when it
  saw end-of-file or unsolicited bytes while idle;
- a request is written at most once per call, except that a ``GET``/``HEAD``/``OPTIONS``
  whose reused connection closed before any byte of the answer is retried once (the
  connection was stale; a listing changes nothing). A send on such a connection fails
  as possibly written: the gateway may have read it before closing.

Timeouts: connect (TCP and TLS) ``connect_timeout_s``; ``read_timeout_s`` of silence
once the request was written; a total deadline from the call's start (default
``pool_timeout_s + connect_timeout_s + 2 * read_timeout_s``) against a gateway
trickling its answer. Answers are identity-encoded (we send no ``Accept-Encoding``);
gzip or deflate is decoded if a server sends it anyway. A body over ``max_body_bytes``
(1 MiB) fails without being read whole.

Measured 2026-12-05 on the 2-core development machine with
``PYTHONPATH=$PWD .venv/bin/python -m devtools.bench.gateway_transport`` (loopback, 100
concurrent keep-alive POSTs of a 130-byte JSON send to an aiohttp server in another process,
10,000 requests a round, the client's CPU per request): this transport through
``send_request`` 44-63 us; aiohttp's ``ClientSession`` 115-121 us (bare, and through the
``send_request`` of commit 51b5ae5 alike).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import enum
import ssl
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Final

import yarl
from multidict import CIMultiDict

KEEPALIVE_S: Final = 5.0
"""An idle connection older than this is closed instead of reused."""
MAX_BODY_BYTES: Final = 1 << 20
"""Largest answer body read (after decoding); gateway answers are a few hundred bytes."""
MAX_HEAD_BYTES: Final = 64 * 1024
"""Largest status line plus headers; more is not an HTTP answer we want."""
_MAX_LINE_BYTES: Final = 8 * 1024
"""Largest chunk-size line or trailer section of a chunked body."""
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_NO_BODY_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_TIMER_SLACK_S: Final = 0.001
"""The event loop may run a timer up to its clock resolution early."""

QueryParams = Mapping[str, str | int] | Sequence[tuple[str, str]]


# --- errors ------------------------------------------------------------------------


class TransportError(Exception):
    """A request failed below HTTP. Messages name the origin, never the path or a value."""


class NotWrittenError(TransportError):
    """Nothing of the request was written: a retry cannot duplicate anything."""


class ConnectError(NotWrittenError):
    """Opening the connection failed: refused, unreachable, DNS, TLS handshake or certificate."""


class ConnectTimeoutError(NotWrittenError):
    """Opening the connection (TCP and TLS) took longer than ``connect_timeout_s``."""


class PoolTimeoutError(NotWrittenError):
    """No pooled connection became free within ``pool_timeout_s``."""


class PossiblyWrittenError(TransportError):
    """The request was handed to a connection: the gateway may have acted on it."""


class ConnectionDroppedError(PossiblyWrittenError):
    """The connection was reset or closed while the request was written or answered.

    ``before_answer``: not one byte of the answer had arrived (on a reused connection,
    the sign of a stale keep-alive connection)."""

    def __init__(self, message: str, *, before_answer: bool) -> None:
        super().__init__(message)
        self.before_answer = before_answer


class ReadTimeoutError(PossiblyWrittenError):
    """The gateway was silent for ``read_timeout_s`` after the request was written."""


class TotalTimeoutError(PossiblyWrittenError):
    """The whole call outlived its total deadline (an answer trickling in)."""


class MalformedResponseError(PossiblyWrittenError):
    """The answer is not HTTP/1.x, is cut off, or cannot be decoded."""


class ResponseTooLargeError(PossiblyWrittenError):
    """The answer's body is larger than ``max_body_bytes``; it was not read whole."""


class InvalidRequestError(TransportError):
    """Our request cannot be sent as given (a header with a line break)."""


class InvalidURLError(InvalidRequestError):
    """The URL is malformed or not ``http``/``https``."""


# --- responses ----------------------------------------------------------------------


class HttpResponse:
    """An answer read whole: status line, headers (case-insensitive), decoded body."""

    __slots__ = ("body", "headers", "keep_alive", "reason", "status")

    def __init__(
        self,
        status: int,
        reason: str,
        headers: CIMultiDict[str],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive

    def __repr__(self) -> str:
        # The body may echo a recipient or a text.
        return f"<HttpResponse {self.status} {self.reason}>"


class _State(enum.IntEnum):
    HEAD = 0
    LENGTH = 1
    CHUNK_SIZE = 2
    CHUNK_DATA = 3
    CHUNK_END = 4
    TRAILER = 5
    UNTIL_CLOSE = 6
    DONE = 7


class ResponseReader:
    """Sans-IO reader of one HTTP/1.x answer: bytes in, :class:`HttpResponse` out.

    :meth:`feed` and :meth:`feed_eof` return the response once it is complete and
    ``None`` while more is needed; they raise :class:`MalformedResponseError` or
    :class:`ResponseTooLargeError`. Framing follows RFC 9112 section 6.3: no body after
    ``HEAD`` or for 1xx/204/304, chunked when ``Transfer-Encoding: chunked``, else
    ``Content-Length``, else until the connection closes (never reused then).
    """

    __slots__ = (
        "_body",
        "_buf",
        "_chunk_left",
        "_headers",
        "_head_request",
        "_keep_alive",
        "_length",
        "_max_body",
        "_reason",
        "_state",
        "_status",
        "started",
    )

    def __init__(self, *, head_request: bool = False, max_body: int = MAX_BODY_BYTES) -> None:
        self._head_request = head_request
        self._max_body = max_body
        self._buf = bytearray()
        self._body = bytearray()
        self._state = _State.HEAD
        self._status = 0
        self._reason = ""
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._keep_alive = False
        self._length = 0
        self._chunk_left = 0
        self.started = False
        """True once any byte of the answer arrived."""

    def feed(self, data: bytes) -> HttpResponse | None:
        self.started = True
        self._buf += data
        if self._state is _State.HEAD and not self._read_head():
            return None
        if self._state is _State.LENGTH:
            return self._read_length()
        if self._state is _State.UNTIL_CLOSE:
            self._take_until_close()
            return None
        if self._state is _State.DONE:
            if self._buf:
                self._keep_alive = False
            return self._response()
        return self._read_chunked()

    def feed_eof(self) -> HttpResponse | None:
        """The peer closed: an until-close body is complete, anything else is cut off."""
        if self._state is _State.UNTIL_CLOSE:
            self._take_until_close()
            self._state = _State.DONE
            return self._response()
        if self._state is _State.DONE:
            return self._response()
        raise MalformedResponseError(f"answer cut off (connection closed in {self._state.name})")

    # --- the head

    def _read_head(self) -> bool:
        """Parse the status line and headers once they are all there; True when parsed."""
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    raise MalformedResponseError("answer head too long")
                return False
            head = bytes(self._buf[:end])
            del self._buf[: end + 4]
            self._parse_head(head)
            if not 100 <= self._status < 200:
                break
            if self._status == 101:
                raise MalformedResponseError("unexpected 101 Switching Protocols")
            # An interim answer (100 Continue): the real one follows.
        self._frame()
        return True

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        code = parts[1] if len(parts) > 1 else ""
        if not parts[0].startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise MalformedResponseError("not an HTTP/1.x status line")
        self._status = int(code)
        self._reason = parts[2] if len(parts) > 2 else ""
        fields = []
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name[-1] in " \t" or name[0] in " \t":
                raise MalformedResponseError("malformed header line")
            fields.append((name, value.strip(" \t")))
        self._headers = headers = CIMultiDict(fields)
        connection = headers.get("Connection", "").lower()
        if parts[0] == "HTTP/1.0":
            self._keep_alive = "keep-alive" in connection
        else:
            self._keep_alive = "close" not in connection

    def _frame(self) -> None:
        """Choose how the body is delimited (RFC 9112 section 6.3)."""
        headers = self._headers
        if self._head_request or self._status in (204, 304):
            self._state = _State.DONE
            return
        coding = headers.get("Transfer-Encoding")
        if coding is not None:
            if coding.strip().lower() != "chunked":
                raise MalformedResponseError("unsupported Transfer-Encoding")
            if "Content-Length" in headers:
                # Both framings: a smuggling pattern; read chunked, never reuse.
                self._keep_alive = False
            self._state = _State.CHUNK_SIZE
            return
        lengths = set(headers.getall("Content-Length", ()))
        if not lengths:
            self._keep_alive = False
            self._state = _State.UNTIL_CLOSE
            return
        value = lengths.pop().strip()
        if lengths or not value.isdigit():
            raise MalformedResponseError("invalid Content-Length")
        self._length = int(value)
        if self._length > self._max_body:
            raise ResponseTooLargeError(f"answer body of {self._length} bytes is too large")
        self._state = _State.LENGTH

    # --- the body

    def _read_length(self) -> HttpResponse | None:
        if len(self._buf) < self._length:
            return None
        self._body = self._buf[: self._length]
        if len(self._buf) > self._length:
            # Bytes after the answer: nothing was asked, so the connection is not clean.
            self._keep_alive = False
        self._buf = bytearray()
        self._state = _State.DONE
        return self._response()

    def _take_until_close(self) -> None:
        self._body += self._buf
        self._buf.clear()
        if len(self._body) > self._max_body:
            raise ResponseTooLargeError("answer body is too large")

    def _read_chunked(self) -> HttpResponse | None:
        step = {
            _State.CHUNK_SIZE: self._chunk_size,
            _State.CHUNK_DATA: self._chunk_data,
            _State.CHUNK_END: self._chunk_end,
            _State.TRAILER: self._trailer,
        }
        while self._state is not _State.DONE:
            if not step[self._state]():
                return None
        if self._buf:
            self._keep_alive = False
        return self._response()

    def _line(self) -> bytes | None:
        end = self._buf.find(b"\r\n")
        if end < 0:
            if len(self._buf) > _MAX_LINE_BYTES:
                raise MalformedResponseError("chunk line too long")
            return None
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        return line

    def _chunk_size(self) -> bool:
        line = self._line()
        if line is None:
            return False
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise MalformedResponseError("invalid chunk size") from None
        if size < 0 or not size_text.isalnum():
            raise MalformedResponseError("invalid chunk size")
        if size == 0:
            self._state = _State.TRAILER
            self._length = 0
            return True
        if len(self._body) + size > self._max_body:
            raise ResponseTooLargeError("answer body is too large")
        self._chunk_left = size
        self._state = _State.CHUNK_DATA
        return True

    def _chunk_data(self) -> bool:
        take = min(self._chunk_left, len(self._buf))
        if take == 0:
            return False
        self._body += self._buf[:take]
        del self._buf[:take]
        self._chunk_left -= take
        if self._chunk_left == 0:
            self._state = _State.CHUNK_END
        return True

    def _chunk_end(self) -> bool:
        if len(self._buf) < 2:
            return False
        if self._buf[:2] != b"\r\n":
            raise MalformedResponseError("chunk not followed by CRLF")
        del self._buf[:2]
        self._state = _State.CHUNK_SIZE
        return True

    def _trailer(self) -> bool:
        """Trailer fields after the last chunk are read and dropped, up to an empty line."""
        line = self._line()
        if line is None:
            return False
        self._length += len(line) + 2
        if self._length > _MAX_LINE_BYTES:
            raise MalformedResponseError("chunked trailer too long")
        if not line:
            self._state = _State.DONE
        return True

    def _response(self) -> HttpResponse:
        return HttpResponse(
            self._status,
            self._reason,
            self._headers,
            _decoded(self._headers.get("Content-Encoding"), self._body, self._max_body),
            self._keep_alive,
        )


def _decoded(coding: str | None, body: bytearray, max_body: int) -> bytes:
    """The body without its content-coding (gzip/deflate), bounded by ``max_body``."""
    if coding is None or coding.strip().lower() in ("", "identity"):
        return bytes(body)
    coding = coding.strip().lower()
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise MalformedResponseError("unsupported Content-Encoding")
    # 47: gzip or zlib header, detected; -15: raw deflate (some servers' "deflate").
    for wbits in (47, -15):
        decoder = zlib.decompressobj(wbits=wbits)
        try:
            out = decoder.decompress(body, max_body + 1)
        except zlib.error:
            continue
        if len(out) > max_body or decoder.unconsumed_tail:
            raise ResponseTooLargeError("decoded answer body is too large")
        if not decoder.eof:
            raise MalformedResponseError("compressed answer body cut off")
        return out
    raise MalformedResponseError("answer body does not decode")


# --- connections ----------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request at a time, answered in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, label: str, max_body: int) -> None:
        self._loop = loop
        self._label = label
        self._max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.answered = 0
        """Answers read whole on this connection; above 0 it is a reused connection."""
        self.idle_since = 0.0
        self.lost: asyncio.Future[None] = loop.create_future()
        self._reader: ResponseReader | None = None
        self._waiter: asyncio.Future[HttpResponse] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._read_timeout_s = 0.0
        self._deadline = 0.0
        self._last_data = 0.0
        self._usable = True

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:
            # Bytes nobody asked for: the connection is out of step; never reuse it.
            self.abort()
            return
        self._last_data = self._loop.time()
        try:
            response = reader.feed(data)
        except TransportError as exc:
            self._fail(exc)
            return
        if response is not None:
            self._finish(response)

    def eof_received(self) -> bool:
        self._usable = False
        self._on_close(None)
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self._usable = False
        self._on_close(exc)
        if not self.lost.done():
            self.lost.set_result(None)

    # --- a request

    @property
    def usable(self) -> bool:
        transport = self.transport
        return self._usable and transport is not None and not transport.is_closing()

    def send(
        self, data: bytes, *, head_request: bool, read_timeout_s: float, deadline: float
    ) -> asyncio.Future[HttpResponse]:
        """Write the request; the future gets the answer or a :class:`TransportError`."""
        assert self.transport is not None and self._reader is None
        self._reader = ResponseReader(head_request=head_request, max_body=self._max_body)
        waiter: asyncio.Future[HttpResponse] = self._loop.create_future()
        self._waiter = waiter
        self._read_timeout_s = read_timeout_s
        self._deadline = deadline
        now = self._last_data = self._loop.time()
        self.transport.write(data)
        self._timer = self._loop.call_at(min(now + read_timeout_s, deadline), self._on_timer)
        return waiter

    def abort(self) -> None:
        """Close now, whatever is buffered; a pending request fails as dropped."""
        self._usable = False
        if self._reader is not None:
            self._fail(
                ConnectionDroppedError(f"{self._label}: connection aborted", before_answer=False)
            )
        if self.transport is not None:
            self.transport.abort()

    def _on_timer(self) -> None:
        self._timer = None
        if self._reader is None:
            return
        now = self._loop.time() + _TIMER_SLACK_S
        if now >= self._deadline:
            self._fail(TotalTimeoutError(f"{self._label}: total timeout"))
            return
        due = self._last_data + self._read_timeout_s
        if now >= due:
            self._fail(
                ReadTimeoutError(
                    f"{self._label}: no answer for {self._read_timeout_s:g} s after the request"
                )
            )
            return
        self._timer = self._loop.call_at(min(due, self._deadline), self._on_timer)

    def _on_close(self, exc: Exception | None) -> None:
        reader = self._reader
        if reader is None:
            return
        try:
            response = reader.feed_eof() if exc is None else None
        except TransportError:
            response = None
        if response is not None:
            self._finish(response)
            return
        reason = f"{type(exc).__name__}: {exc}" if exc is not None else "closed by the peer"
        self._fail(
            ConnectionDroppedError(f"{self._label}: {reason}", before_answer=not reader.started)
        )

    def _finish(self, response: HttpResponse) -> None:
        self._stop_request()
        self.answered += 1
        if not response.keep_alive:
            self._usable = False
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: TransportError) -> None:
        self._stop_request()
        self._usable = False
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def _stop_request(self) -> None:
        self._reader = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# --- the pool -------------------------------------------------------------------------


class _Origin:
    """Where a URL's requests go, parsed once: the pool key, the ``Host`` header, TLS."""

    __slots__ = ("authorization", "host", "host_header", "key", "label", "port", "tls")

    def __init__(self, url: yarl.URL) -> None:
        scheme = url.scheme
        host = url.raw_host
        if scheme not in ("http", "https"):
            raise InvalidURLError(f"not an http(s) URL (scheme {scheme!r})")
        if not host:
            raise InvalidURLError("URL without a host")
        port = url.port
        assert port is not None  # http and https have default ports
        self.tls = scheme == "https"
        self.host = host
        self.port = port
        self.key = (scheme, host, port)
        self.host_header = url.host_port_subcomponent or host
        self.label = f"{scheme}://{self.host_header}"
        self.authorization: str | None = None
        if url.raw_user:
            # user:password@host, as aiohttp honoured it: HTTP Basic.
            pair = f"{url.user or ''}:{url.password or ''}".encode()
            self.authorization = "Basic " + base64.b64encode(pair).decode("ascii")


@lru_cache(maxsize=512)
def _parse(url: str) -> tuple[_Origin, str]:
    """The origin and the request target (path and query, quoted) of a URL string."""
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError) as exc:
        raise InvalidURLError(f"malformed URL: {type(exc).__name__}") from None
    return _Origin(parsed), parsed.raw_path_qs or "/"


def _target(url: str, params: QueryParams | None) -> tuple[_Origin, str]:
    if not params:
        return _parse(url)
    origin, _ = _parse(url)
    try:
        with_query = yarl.URL(url).extend_query(params)
    except (ValueError, TypeError) as exc:
        raise InvalidURLError(f"invalid query: {type(exc).__name__}") from None
    return origin, with_query.raw_path_qs


class _Pool:
    """Keep-alive connections to one origin; at most ``max_connections`` in use or idle."""

    def __init__(self, origin: _Origin, transport: HttpTransport) -> None:
        self._origin = origin
        self._owner = transport
        self._slots = asyncio.Semaphore(transport.max_connections)
        self._idle: collections.deque[_Connection] = collections.deque()
        self.connections: set[_Connection] = set()

    async def exchange(self, data: bytes, method: str, deadline: float) -> HttpResponse:
        """Send ``data`` on a pooled or new connection and read the answer."""
        await self._acquire_slot()
        try:
            return await self._exchange(data, method, deadline)
        finally:
            self._slots.release()

    async def _acquire_slot(self) -> None:
        if not self._slots.locked():
            await self._slots.acquire()
            return
        try:
            async with asyncio.timeout(self._owner.pool_timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise PoolTimeoutError(
                f"{self._origin.label}: no free connection within "
                f"{self._owner.pool_timeout_s:g} s ({self._owner.max_connections} in use)"
            ) from None

    async def _exchange(self, data: bytes, method: str, deadline: float) -> HttpResponse:
        retried = False
        while True:
            conn = self._take_idle() or await self._connect()
            reused = conn.answered > 0
            try:
                response = await conn.send(
                    data,
                    head_request=method == "HEAD",
                    read_timeout_s=self._owner.read_timeout_s,
                    deadline=deadline,
                )
            except ConnectionDroppedError as exc:
                self._discard(conn)
                if reused and exc.before_answer and method in _SAFE_METHODS and not retried:
                    retried = True  # a stale keep-alive connection; a listing is asked again
                    continue
                raise
            except BaseException:
                # Cancelled or failed mid-request: never back into the pool.
                self._discard(conn)
                raise
            self._put_back(conn)
            return response

    def _take_idle(self) -> _Connection | None:
        """The most recently used idle connection still fit for a request."""
        idle = self._idle
        if not idle:
            return None
        now = self._owner.clock()
        keepalive_s = self._owner.keepalive_s
        while idle and now - idle[0].idle_since >= keepalive_s:
            self._discard(idle.popleft())
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            self._discard(conn)
        return None

    async def _connect(self) -> _Connection:
        origin = self._origin
        loop = asyncio.get_running_loop()
        tls = self._owner.tls_context() if origin.tls else None
        try:
            async with asyncio.timeout(self._owner.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, origin.label, self._owner.max_body_bytes),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls is not None else None,
                )
        except TimeoutError:
            raise ConnectTimeoutError(
                f"{origin.label}: connect took over {self._owner.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:  # refused, unreachable, DNS (gaierror), ssl.SSLError
            raise ConnectError(f"{origin.label}: {type(exc).__name__}: {exc}") from exc
        self.connections.add(conn)
        return conn

    def _put_back(self, conn: _Connection) -> None:
        if self._owner.closed or not conn.usable:
            self._discard(conn)
            return
        conn.idle_since = self._owner.clock()
        self._idle.append(conn)

    def _discard(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        conn.abort()

    @property
    def idle_count(self) -> int:
        return sum(1 for conn in self._idle if conn.usable)


class HttpTransport:
    """HTTP/1.1 requests over keep-alive connection pools, one pool per origin.

    Owned by one gateway client from start to stop: :meth:`close` (idempotent) closes
    every connection, in use or idle. ``default_headers`` go on every request (a
    request's own header of the same name wins). ``clock`` (monotonic seconds) decides
    keep-alive expiry; tests inject one.
    """

    def __init__(
        self,
        *,
        max_connections: int = 100,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 15.0,
        pool_timeout_s: float = 5.0,
        total_timeout_s: float | None = None,
        keepalive_s: float = KEEPALIVE_S,
        max_body_bytes: int = MAX_BODY_BYTES,
        default_headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.pool_timeout_s = pool_timeout_s
        self.total_timeout_s = (
            total_timeout_s
            if total_timeout_s is not None
            else pool_timeout_s + connect_timeout_s + 2 * read_timeout_s
        )
        self.keepalive_s = keepalive_s
        self.max_body_bytes = max_body_bytes
        self.clock = clock
        self.closed = False
        self._ssl_context = ssl_context
        self._defaults = {"user-agent": ("User-Agent", "zapstream")}
        for name, value in (default_headers or {}).items():
            _check_header(name, value)
            self._defaults[name.lower()] = (name, value)
        self._default_names = frozenset(self._defaults)
        self._default_block = "".join(f"{n}: {v}\r\n" for n, v in self._defaults.values())
        self._pools: dict[tuple[str, str, int], _Pool] = {}

    def tls_context(self) -> ssl.SSLContext:
        """Certificate verification and hostname checks on; built on first ``https`` use."""
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        params: QueryParams | None = None,
    ) -> HttpResponse:
        """Send one request and read its answer whole; raises :class:`TransportError`."""
        if self.closed:
            raise RuntimeError("HttpTransport is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.total_timeout_s
        method = method.upper()
        origin, target = _target(url, params)
        data = self._encode(method, target, origin, headers, body)
        pool = self._pools.get(origin.key)
        if pool is None:
            pool = self._pools[origin.key] = _Pool(origin, self)
        return await pool.exchange(data, method, deadline)

    def _encode(
        self,
        method: str,
        target: str,
        origin: _Origin,
        headers: Mapping[str, str] | None,
        body: bytes | None,
    ) -> bytes:
        defaults = self._default_block
        own = ""
        if headers:
            own = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
            # One CR and one LF per line: more means a name or value holds a line break.
            count = len(headers)
            if own.count("\n") != count or own.count("\r") != count or "\0" in own:
                for name, value in headers.items():
                    _check_header(name, value)
            if not all(headers):
                raise InvalidRequestError("a header without a name")
            if not self._default_names.isdisjoint(name.lower() for name in headers):
                # The request's own header wins over a default of the same name.
                names = {name.lower() for name in headers}
                defaults = "".join(
                    f"{name}: {value}\r\n"
                    for key, (name, value) in self._defaults.items()
                    if key not in names
                )
        if origin.authorization:
            own += f"Authorization: {origin.authorization}\r\n"
        if body is not None or method not in _NO_BODY_METHODS:
            own += f"Content-Length: {len(body) if body else 0}\r\n"
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n{defaults}{own}\r\n"
        ).encode()
        return head + body if body else head

    def idle_connections(self) -> int:
        """Idle pooled connections still fit for reuse (for tests and diagnostics)."""
        return sum(pool.idle_count for pool in self._pools.values())

    def open_connections(self) -> int:
        """Connections in use or idle across origins (for tests and diagnostics)."""
        return sum(len(pool.connections) for pool in self._pools.values())

    async def close(self) -> None:
        """Close every connection (idempotent); requests still in flight fail as dropped."""
        if self.closed:
            return
        self.closed = True
        conns = [conn for pool in self._pools.values() for conn in pool.connections]
        for pool in self._pools.values():
            pool.connections.clear()
        for conn in conns:
            conn.abort()
        lost = [conn.lost for conn in conns if not conn.lost.done()]
        if lost:
            # Let the transports release their sockets before the loop may close.
            await asyncio.wait(lost, timeout=1.0)

    async def __aenter__(self) -> HttpTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _check_header(name: str, value: str) -> None:
    """A line break in a header would split the request (header injection)."""
    if _has_break(name) or _has_break(value) or not name:
        # The value may be a key or a token: only the name is said.
        raise InvalidRequestError(f"header {name.strip()[:40]!r} has a line break")


def _has_break(text: str) -> bool:
    return "\r" in text or "\n" in text or "\0" in text
