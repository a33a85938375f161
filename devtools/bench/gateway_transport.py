"""Client CPU per gateway request: our HTTP transport next to aiohttp's client.

``PYTHONPATH=$PWD .venv/bin/python -m devtools.bench.gateway_transport [rounds]`` starts an
aiohttp server in another process (its CPU is not counted), then sends 10,000 keep-alive POSTs
of a 130-byte JSON send, 100 at a time, through ``send_request`` as the gateway clients call
it, and the same bare through an ``aiohttp.ClientSession`` configured as the clients' was
before the transport (the comparison), and prints the client process's CPU per request.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from connectors.gateways.classify import send_request
from connectors.gateways.http_transport import HttpTransport
from devtools.stack.devstack import find_free_port

REQUESTS = 10_000
CONCURRENT = 100
HEADERS = {"Accept": "application/json", "X-API-Key": "bench-key"}
PAYLOAD = {"to": "5511999999999", "text": "x" * 100}


def _serve(port: int) -> None:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": "job-1", "status": "queued"})

    app = web.Application()
    app.router.add_post("/v1/instances/{instance}/send-queue/text", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def _timed(name: str, one: Callable[[], Awaitable[None]]) -> None:
    slots = asyncio.Semaphore(CONCURRENT)

    async def bounded() -> None:
        async with slots:
            await one()

    await asyncio.gather(*(bounded() for _ in range(500)))  # warm the pool
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.gather(*(bounded() for _ in range(REQUESTS)))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    print(f"{name:34s} {REQUESTS / wall:7,.0f} req/s {cpu / REQUESTS * 1e6:5.0f} us CPU/request")


async def _transport(url: str) -> None:
    transport = HttpTransport(
        max_connections=256,
        connect_timeout_s=5,
        read_timeout_s=15,
        pool_timeout_s=5,
        default_headers=HEADERS,
    )

    async def one() -> None:
        await send_request(
            transport,
            "POST",
            url,
            gateway="stackzap",
            headers={"Idempotency-Key": "123-1-abc"},
            json_body=PAYLOAD,
            url_setting="STACKZAP_API_URL",
        )

    try:
        await _timed("http_transport through send_request", one)
    finally:
        await transport.close()


async def _aiohttp(url: str) -> None:
    body = orjson.dumps(PAYLOAD)
    async with aiohttp.ClientSession(
        headers=HEADERS,
        connector=aiohttp.TCPConnector(limit=256, limit_per_host=0, keepalive_timeout=5.0),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    ) as session:

        async def one() -> None:
            async with session.post(
                url,
                data=body,
                headers={"Idempotency-Key": "123-1-abc", "Content-Type": "application/json"},
                allow_redirects=False,
            ) as response:
                await response.read()

        await _timed("aiohttp ClientSession, bare request", one)


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 3
    port = find_free_port()
    server = multiprocessing.Process(target=_serve, args=(port,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}/v1/instances/inst-1/send-queue/text"
    try:
        for _ in range(100):
            try:
                asyncio.run(_probe(port))
                break
            except OSError:
                time.sleep(0.1)
        for _ in range(rounds):
            asyncio.run(_transport(url))
            asyncio.run(_aiohttp(url))
    finally:
        server.terminate()
    return 0


async def _probe(port: int) -> None:
    """The server is listening (else OSError)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()
    await writer.wait_closed()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
