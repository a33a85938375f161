"""A byte-level HTTP/1.1 server on 127.0.0.1 for the transport's tests.

:mod:`fake_gateway` answers like a well-behaved aiohttp app; the transport's own tests
need what such an app will not do on request: answer in chunks split across writes,
close a kept-alive connection right after reading a request, trickle bytes, stream a
body that never ends, speak TLS with a certificate of our own. Each connection runs
``respond(request, connection)`` for every request it reads; ``respond`` writes the
answer itself and returns False to close the connection. Every connection and request
is recorded, so a test can count what reached the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import Awaitable, Callable


@dataclasses.dataclass(frozen=True)
class RawRequest:
    """One request as the server read it (header names lower-cased)."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    connection: int
    """Index of the connection it came on (0: the first accepted)."""


@dataclasses.dataclass(eq=False)
class ServerConnection:
    index: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    requests: int = 0
    closed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set once the connection ended (either side closed it)."""

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def wait_for_close(self) -> bool:
        """Stall until the client closes (reads and drops anything it sends); False."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(4096):
                pass
        return False


Respond = Callable[[RawRequest, ServerConnection], Awaitable[bool]]


def answer(status: int = 200, body: bytes = b"{}", headers: dict[str, str] | None = None) -> bytes:
    """An HTTP/1.1 answer with ``Content-Length`` (unless ``headers`` frame it otherwise)."""
    fields = {"Content-Length": str(len(body)), **(headers or {})}
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return head.encode("latin-1") + b"\r\n" + body


def replying(data: bytes = answer(), *, keep: bool = True) -> Respond:
    """Answer every request with ``data``; ``keep``: leave the connection open."""

    async def respond(request: RawRequest, conn: ServerConnection) -> bool:
        await conn.send(data)
        return keep

    return respond


async def _read_request(reader: asyncio.StreamReader, index: int) -> RawRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RawRequest(method, target, headers, body, index)


class RawServer:
    """The server; ``url`` once started (``https://localhost:port`` with ``tls``)."""

    def __init__(self, respond: Respond, *, tls: ssl.SSLContext | None = None) -> None:
        self.respond = respond
        self.tls = tls
        self.url = ""
        self.connections: list[ServerConnection] = []
        self.requests: list[RawRequest] = []
        self.request_seen = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        conn = ServerConnection(len(self.connections), reader, writer)
        self.connections.append(conn)
        try:
            while True:
                request = await _read_request(reader, conn.index)
                if request is None:
                    break
                self.requests.append(request)
                conn.requests += 1
                self.request_seen.set()
                if not await self.respond(request, conn):
                    break
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()
            conn.closed.set()

    async def wait_for_requests(self, count: int, timeout_s: float = 5.0) -> None:
        """Until ``count`` requests were read (polls the record, bounded)."""
        async with asyncio.timeout(timeout_s):
            while len(self.requests) < count:
                self.request_seen.clear()
                await self.request_seen.wait()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"https://localhost:{port}" if self.tls else f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for conn in self.connections:
            conn.writer.close()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5.0)
        await self._server.wait_closed()
