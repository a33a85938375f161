"""The gateway HTTP transport against a real server on loopback (no mocks of the transport):
keep-alive, framing, stale connections, timeouts, the pool's bounds, TLS, cancellation."""

from __future__ import annotations

import asyncio
import gzip
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from connectors.gateways.classify import send_request
from connectors.gateways.http_transport import (
    ConnectError,
    ConnectionDroppedError,
    HttpTransport,
    InvalidRequestError,
    InvalidURLError,
    MalformedResponseError,
    PoolTimeoutError,
    ReadTimeoutError,
    ResponseReader,
    ResponseTooLargeError,
    TotalTimeoutError,
)
from streams.kernel.errors import (
    PermanentGatewayError,
    TransientGatewayError,
    UncertainGatewayError,
)
from tests.unit.connectors.gateways.fake_gateway import closed_port_url
from tests.unit.connectors.gateways.raw_server import (
    RawRequest,
    RawServer,
    ServerConnection,
    answer,
    replying,
)

DEADLINE_S = 5.0


@pytest.fixture
async def transport() -> AsyncIterator[HttpTransport]:
    async with HttpTransport(
        connect_timeout_s=1.0, read_timeout_s=0.3, pool_timeout_s=0.2, max_body_bytes=64 * 1024
    ) as t:
        yield t


# --- keep-alive and framing ---------------------------------------------------------


async def test_keep_alive_reuses_one_connection(transport: HttpTransport) -> None:
    async with RawServer(replying(answer(200, b'{"id":"j1"}'))) as server:
        for _ in range(3):
            response = await transport.request("POST", f"{server.url}/x", body=b"{}")
            assert (response.status, response.body) == (200, b'{"id":"j1"}')
    assert len(server.connections) == 1
    assert [r.connection for r in server.requests] == [0, 0, 0]


async def test_request_shape(transport: HttpTransport) -> None:
    """Host, Content-Length and the defaults; no Accept-Encoding; query quoted by yarl."""
    async with (
        HttpTransport(default_headers={"Accept": "application/json", "X-API-Key": "k1"}) as t,
        RawServer(replying()) as server,
    ):
        await t.request(
            "POST",
            f"{server.url}/v1/instances/inst%201/text",
            headers={"Idempotency-Key": "ref-1", "x-api-key": "k2"},
            body=b'{"a":1}',
        )
        await t.request("GET", f"{server.url}/list", params=[("ref", "a b"), ("ref", "é")])
    post, get = server.requests
    assert post.target == "/v1/instances/inst%201/text"
    assert post.headers["host"] == server.url.removeprefix("http://")
    assert post.headers["content-length"] == "7" and post.body == b'{"a":1}'
    assert post.headers["accept"] == "application/json"
    assert post.headers["x-api-key"] == "k2"  # the request's header wins over the default
    assert post.headers["idempotency-key"] == "ref-1"
    assert "accept-encoding" not in post.headers
    assert get.target == "/list?ref=a+b&ref=%C3%A9"
    assert "content-length" not in get.headers


async def test_chunked_body_split_across_writes(transport: HttpTransport) -> None:
    async def respond(request: RawRequest, conn: ServerConnection) -> bool:
        await conn.send(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\n{"id')
        await conn.send(b"\r\n")
        await conn.send(b'5\r\n":"j1\r\n2\r\n"}\r\n0\r\nX-Trailer: t\r\n')
        await conn.send(b"\r\n")
        return True

    async with RawServer(respond) as server:
        first = await transport.request("GET", f"{server.url}/x")
        second = await transport.request("GET", f"{server.url}/x")
    assert first.body == second.body == b'{"id":"j1"}'
    assert len(server.connections) == 1  # read whole, so reused


async def test_connection_close_is_not_reused(transport: HttpTransport) -> None:
    async with RawServer(replying(answer(headers={"Connection": "close"}), keep=False)) as srv:
        await transport.request("GET", f"{srv.url}/x")
        assert transport.idle_connections() == 0
        await transport.request("GET", f"{srv.url}/x")
    assert [r.connection for r in srv.requests] == [0, 1]


async def test_body_until_close(transport: HttpTransport) -> None:
    respond = replying(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it", keep=False)
    async with RawServer(respond) as server:
        response = await transport.request("GET", f"{server.url}/x")
    assert response.body == b"all of it"
    assert transport.idle_connections() == 0


async def test_gzip_answer_is_decoded_anyway(transport: HttpTransport) -> None:
    body = gzip.compress(b'{"ok":true}')
    async with RawServer(replying(answer(200, body, {"Content-Encoding": "gzip"}))) as server:
        response = await transport.request("GET", f"{server.url}/x")
    assert response.body == b'{"ok":true}'


async def test_head_and_interim_answers(transport: HttpTransport) -> None:
    async def respond(request: RawRequest, conn: ServerConnection) -> bool:
        if request.method == "HEAD":
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
        else:
            await conn.send(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(201, b"[]"))
        return True

    async with RawServer(respond) as server:
        head = await transport.request("HEAD", f"{server.url}/x")
        post = await transport.request("POST", f"{server.url}/x", body=b"{}")
    assert (head.status, head.body) == (200, b"")
    assert (post.status, post.body) == (201, b"[]")
    assert len(server.connections) == 1


# --- a kept-alive connection the server closed --------------------------------------


def answer_once_then_drop() -> RawServer:
    """Each connection: the first request is answered, the second read and dropped unanswered."""

    async def respond(request: RawRequest, conn: ServerConnection) -> bool:
        if conn.requests == 1:
            await conn.send(answer(200, b'{"id":"j"}'))
            return True
        return False

    return RawServer(respond)


async def test_a_send_on_a_dropped_keep_alive_connection_is_uncertain_and_not_resent(
    transport: HttpTransport,
) -> None:
    async with answer_once_then_drop() as server:
        url = f"{server.url}/send"
        await send_request(transport, "POST", url, gateway="g", json_body={"n": 1})
        with pytest.raises(UncertainGatewayError) as info:
            await send_request(transport, "POST", url, gateway="g", json_body={"n": 2})
    assert isinstance(info.value.__cause__, ConnectionDroppedError)
    assert [r.body for r in server.requests] == [b'{"n":1}', b'{"n":2}']  # never resent
    assert len(server.connections) == 1


async def test_a_listing_on_a_dropped_keep_alive_connection_is_asked_again_once(
    transport: HttpTransport,
) -> None:
    async with answer_once_then_drop() as server:
        await send_request(transport, "GET", f"{server.url}/list", gateway="g")
        response = await send_request(transport, "GET", f"{server.url}/list", gateway="g")
    assert response.content == b'{"id":"j"}'
    assert [r.connection for r in server.requests] == [0, 0, 1]


async def test_an_idle_connection_the_server_closed_is_not_used(transport: HttpTransport) -> None:
    async with RawServer(replying(keep=False)) as server:
        # Content-Length and no "Connection: close": the client thinks it may keep it.
        await transport.request("POST", f"{server.url}/x", body=b"{}")
        async with asyncio.timeout(DEADLINE_S):
            await server.connections[0].closed.wait()
        for _ in range(int(DEADLINE_S / 0.01)):  # until the client saw the end-of-file
            if not transport.idle_connections():
                break
            await asyncio.sleep(0.01)
        assert transport.idle_connections() == 0
        await transport.request("POST", f"{server.url}/x", body=b"{}")
    assert [r.connection for r in server.requests] == [0, 1]


# --- timeouts -------------------------------------------------------------------------


async def stall(request: RawRequest, conn: ServerConnection) -> bool:
    return await conn.wait_for_close()


async def test_read_timeout_after_the_request_was_written(transport: HttpTransport) -> None:
    async with RawServer(stall) as server:
        with pytest.raises(UncertainGatewayError) as info:
            await send_request(transport, "POST", f"{server.url}/x", gateway="g", json_body={})
        assert isinstance(info.value.__cause__, ReadTimeoutError)
        with pytest.raises(TransientGatewayError) as listing:
            await send_request(transport, "GET", f"{server.url}/x", gateway="g")
        assert isinstance(listing.value.__cause__, ReadTimeoutError)
    assert [r.method for r in server.requests] == ["POST", "GET"]
    assert transport.open_connections() == 0


async def test_an_answer_trickling_in_hits_the_total_timeout() -> None:
    async def trickle(request: RawRequest, conn: ServerConnection) -> bool:
        await conn.send(b"HTTP/1.1 200 OK\r\n")
        while True:  # a header byte every 20 ms: never silent for the read timeout
            await conn.send(b"X")
            await asyncio.sleep(0.02)

    async with (
        HttpTransport(read_timeout_s=1.0, total_timeout_s=1.2) as t,
        RawServer(trickle) as server,
    ):
        with pytest.raises(TotalTimeoutError):
            await t.request("POST", f"{server.url}/x", body=b"{}")


async def test_connect_refused_is_transient(transport: HttpTransport) -> None:
    with pytest.raises(TransientGatewayError) as info:
        await send_request(transport, "POST", f"{closed_port_url()}/x", gateway="g", json_body={})
    assert isinstance(info.value.__cause__, ConnectError)


async def test_pool_exhaustion_is_transient_and_never_written() -> None:
    async with (
        HttpTransport(max_connections=1, pool_timeout_s=0.1, read_timeout_s=3.0) as t,
        RawServer(stall) as server,
    ):
        holder = asyncio.create_task(t.request("POST", f"{server.url}/x", body=b"1"))
        await server.wait_for_requests(1)
        with pytest.raises(TransientGatewayError) as info:
            await send_request(t, "POST", f"{server.url}/x", gateway="g", json_body=2)
        assert isinstance(info.value.__cause__, PoolTimeoutError)
        assert [r.body for r in server.requests] == [b"1"]
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder


async def test_idle_connections_expire_after_five_seconds() -> None:
    now = [100.0]
    async with (
        HttpTransport(clock=lambda: now[0]) as t,
        RawServer(replying()) as server,
    ):
        await t.request("GET", f"{server.url}/x")
        now[0] += 4.9
        await t.request("GET", f"{server.url}/x")  # still fresh: reused
        now[0] += 5.0
        await t.request("GET", f"{server.url}/x")  # idle 5 s: closed, a new one
        async with asyncio.timeout(DEADLINE_S):
            await server.connections[0].closed.wait()
    assert [r.connection for r in server.requests] == [0, 0, 1]


# --- bounds ---------------------------------------------------------------------------


async def test_a_declared_oversize_body_fails_before_reading_it(transport: HttpTransport) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n"
    async with RawServer(replying(head)) as server:
        with pytest.raises(UncertainGatewayError) as info:
            await send_request(transport, "POST", f"{server.url}/x", gateway="g", json_body={})
    assert isinstance(info.value.__cause__, ResponseTooLargeError)


@pytest.mark.parametrize("chunked", [True, False])
async def test_an_endless_body_fails_once_over_the_bound(
    transport: HttpTransport, chunked: bool
) -> None:
    """The server never stops sending: a client reading it all would never return."""

    async def endless(request: RawRequest, conn: ServerConnection) -> bool:
        piece = b"x" * 16384
        framing = b"Transfer-Encoding: chunked\r\n" if chunked else b""
        await conn.send(b"HTTP/1.1 200 OK\r\n" + framing + b"\r\n")
        while True:
            await conn.send(b"4000\r\n" + piece + b"\r\n" if chunked else piece)

    async with RawServer(endless) as server:
        async with asyncio.timeout(DEADLINE_S):
            with pytest.raises(ResponseTooLargeError):
                await transport.request("GET", f"{server.url}/x")
        assert transport.open_connections() == 0
        async with asyncio.timeout(DEADLINE_S):
            await server.connections[0].closed.wait()


async def test_a_gzip_bomb_is_bounded(transport: HttpTransport) -> None:
    bomb = gzip.compress(b"\0" * (8 << 20))
    async with RawServer(replying(answer(200, bomb, {"Content-Encoding": "gzip"}))) as server:
        with pytest.raises(ResponseTooLargeError):
            await transport.request("GET", f"{server.url}/x")


# --- cancellation and close -----------------------------------------------------------


async def test_cancellation_closes_the_connection(transport: HttpTransport) -> None:
    async with RawServer(stall) as server:
        task = asyncio.create_task(transport.request("POST", f"{server.url}/x", body=b"{}"))
        await server.wait_for_requests(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(DEADLINE_S):
            await server.connections[0].closed.wait()
        assert transport.open_connections() == 0
        assert transport.idle_connections() == 0


async def test_close_closes_idle_connections_and_is_idempotent() -> None:
    async with RawServer(replying()) as server:
        t = HttpTransport()
        await t.request("GET", f"{server.url}/x")
        assert t.idle_connections() == 1
        await t.close()
        await t.close()
        async with asyncio.timeout(DEADLINE_S):
            await server.connections[0].closed.wait()
        with pytest.raises(RuntimeError):
            await t.request("GET", f"{server.url}/x")


# --- our own mistakes -----------------------------------------------------------------


@pytest.mark.parametrize("url", ["ftp://gw.test/x", "http:///x", "http://gw.test:99999/x"])
async def test_a_wrong_url_is_permanent(transport: HttpTransport, url: str) -> None:
    with pytest.raises(PermanentGatewayError) as info:
        await send_request(transport, "POST", url, gateway="g", json_body={})
    assert isinstance(info.value.__cause__, InvalidURLError)


async def test_a_header_with_a_line_break_is_refused_without_its_value(
    transport: HttpTransport,
) -> None:
    with pytest.raises(PermanentGatewayError) as info:
        await send_request(
            transport,
            "POST",
            f"{closed_port_url()}/x",
            gateway="g",
            headers={"Idempotency-Key": "secret-token\r\nX-Evil: 1"},
        )
    assert isinstance(info.value.__cause__, InvalidRequestError)
    assert "secret-token" not in str(info.value)


# --- TLS ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a localhost certificate it signed (openssl CLI), in a temp dir."""
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (d / "leaf.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    commands = [
        ["openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2"]
        + ["-subj", "/CN=zapstream test CA", "-addext", "basicConstraints=critical,CA:TRUE"]
        + ["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        [
            "openssl",
            "req",
            *ec,
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=localhost",
        ],
        ["openssl", "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key"]
        + ["-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext"],
    ]
    for command in commands:
        subprocess.run(command, cwd=d, check=True, capture_output=True)
    return d


def server_tls(certificates: Path, names: list[str]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates / "leaf.pem", certificates / "leaf.key")

    def on_sni(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        names.append(name or "")

    context.sni_callback = on_sni
    return context


async def test_tls_with_a_trusted_ca(certificates: Path) -> None:
    names: list[str] = []
    trusted = ssl.create_default_context(cafile=str(certificates / "ca.pem"))
    async with (
        HttpTransport(ssl_context=trusted) as t,
        RawServer(replying(answer(200, b'{"tls":1}')), tls=server_tls(certificates, names)) as srv,
    ):
        first = await t.request("POST", f"{srv.url}/x", body=b"{}")
        second = await t.request("POST", f"{srv.url}/x", body=b"{}")
    assert first.body == second.body == b'{"tls":1}'
    assert names == ["localhost"]  # SNI sent; one handshake, the connection kept
    assert len(srv.connections) == 1


async def test_tls_with_an_untrusted_certificate_is_transient(
    certificates: Path, transport: HttpTransport
) -> None:
    async with RawServer(replying(), tls=server_tls(certificates, [])) as server:
        with pytest.raises(TransientGatewayError) as info:
            await send_request(transport, "POST", f"{server.url}/x", gateway="g", json_body={})
    assert isinstance(info.value.__cause__, ConnectError)
    assert isinstance(info.value.__cause__.__cause__, ssl.SSLCertVerificationError)
    assert server.requests == []


# --- the reader alone -----------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"this is not HTTP\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    ],
)
def test_malformed_answers(data: bytes) -> None:
    with pytest.raises(MalformedResponseError):
        ResponseReader().feed(data)


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        b"HTTP/1.1 200 OK\r\nContent-Le",
    ],
)
def test_an_answer_cut_off_by_the_close_is_malformed(data: bytes) -> None:
    reader = ResponseReader()
    assert reader.feed(data) is None
    with pytest.raises(MalformedResponseError):
        reader.feed_eof()


def test_reader_byte_by_byte_and_keep_alive_rules() -> None:
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    reader = ResponseReader()
    results = [reader.feed(data[i : i + 1]) for i in range(len(data))]
    assert all(r is None for r in results[:-1])
    last = results[-1]
    assert last is not None and last.body == b"abc" and last.keep_alive
    old = ResponseReader().feed(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert old is not None and not old.keep_alive
    extra = ResponseReader().feed(b"HTTP/1.1 204 No Content\r\n\r\nleftover")
    assert extra is not None and not extra.keep_alive  # bytes nobody asked for
