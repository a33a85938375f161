"""A scripted HTTP gateway on 127.0.0.1 for the gateway clients' tests.

The clients own a real connection pool, so their tests talk to a real
socket on loopback: a tiny aiohttp app whose every request goes to a handler
``(Seen) -> Reply | Fault``. :class:`Fault` reproduces how far a request got
before it failed (answer never comes, connection dropped after the request was
read, answer cut off, not HTTP at all), which is what the classification is
about. Each server starts in a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDictProxy, MultiDictProxy

STALL_MAX_S = 5.0
"""A stalled answer gives up after this long (the clients' read timeouts are far shorter)."""


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request as the gateway received it."""

    method: str
    raw_path: str
    """Path and query exactly as sent (percent-escapes kept)."""
    params: MultiDictProxy[str]
    headers: CIMultiDictProxy[str]
    content: bytes

    @property
    def path(self) -> str:
        return self.raw_path.split("?", 1)[0]


@dataclasses.dataclass(frozen=True)
class Reply:
    """An HTTP answer: ``json`` is encoded unless ``body`` (raw bytes) is given."""

    status: int = 200
    json: Any = None
    body: bytes | None = None
    headers: dict[str, str] | None = None


class Fault(enum.Enum):
    STALL = "stall"
    """Read the request, never answer (the client's read timeout fires)."""
    DISCONNECT = "disconnect"
    """Read the request, close the connection without a status line."""
    CUT_BODY = "cut_body"
    """Answer 200 with ``Content-Length: 100``, send 8 bytes, close."""
    GARBAGE = "garbage"
    """Answer bytes that are not HTTP, then close."""


Handler = Callable[[Seen], "Reply | Fault"]


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Handler:
    """A handler answering every request the same way (``bytes`` are sent raw)."""

    def handler(request: Seen) -> Reply:
        if isinstance(body, bytes):
            return Reply(status, body=body, headers=headers)
        return Reply(status, json=body, headers=headers)

    return handler


def failing(fault: Fault) -> Handler:
    def handler(request: Seen) -> Fault:
        return fault

    return handler


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class FakeGateway:
    """The scripted server; ``url`` once started. Records every request in ``seen``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[Seen] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        content = await request.read()
        seen = Seen(request.method, request.raw_path, request.query, request.headers, content)
        self.seen.append(seen)
        outcome = self.handler(seen)
        transport = request.transport
        if isinstance(outcome, Fault):
            if outcome is Fault.STALL:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), STALL_MAX_S)
            elif transport is not None:
                if outcome is Fault.CUT_BODY:
                    transport.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"id": 1')
                elif outcome is Fault.GARBAGE:
                    transport.write(b"this is not HTTP at all\r\n\r\n")
                transport.close()
            return web.Response(status=599)
        if outcome.body is not None:
            body = outcome.body
            content_type = "text/plain"
        else:
            body = orjson.dumps(outcome.json) if outcome.json is not None else b""
            content_type = "application/json"
        return web.Response(
            status=outcome.status, body=body, headers=outcome.headers, content_type=content_type
        )

    async def __aenter__(self) -> FakeGateway:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()


@contextlib.asynccontextmanager
async def fake_gateway(handler: Handler) -> AsyncIterator[FakeGateway]:
    async with FakeGateway(handler) as gateway:
        yield gateway
