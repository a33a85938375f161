"""The TCP proxy's blackhole and dropped replies: connections stay open and silent, or requests
go through unanswered; restore resets them.

Loopback sockets only: an echo server the proxy forwards to, and plain clients.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from devtools.simulator.tcp_proxy import TcpProxy

SILENCE_S = 0.5
"""How long a client listens for an answer that must not come (a read deadline, not a sleep)."""


class EchoServer:
    """Echoes every byte back; records what it received and how its connections ended."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.received = bytearray()
        self.closed_by_peer = 0
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(4096):
                with self.lock:
                    self.received += data
                conn.sendall(data)
        except OSError:
            return
        with self.lock:
            self.closed_by_peer += 1

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


def _client(proxy: TcpProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.settimeout(5)
    return sock


def _echoes(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def _stays_silent(sock: socket.socket) -> bool:
    """True when nothing, not even a close, arrives within SILENCE_S."""
    sock.settimeout(SILENCE_S)
    try:
        sock.recv(4096)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(5)
    return False


def _wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_blackhole_keeps_connections_open_and_forwards_nothing(echo: EchoServer) -> None:
    with TcpProxy(echo.port) as proxy:
        before = _client(proxy)
        assert _echoes(before, b"hello") == b"hello"
        proxy.blackhole()
        assert proxy.is_blackholed
        received = len(echo.received)
        before.sendall(b"lost")
        assert _stays_silent(before), "a blackholed connection answered (or was closed)"
        assert len(echo.received) == received, "bytes went through the blackhole"

        # A connection made during the blackhole: the connect succeeds, then silence,
        # and the server never hears of it.
        during = _client(proxy)
        during.sendall(b"also lost")
        assert _stays_silent(during)
        assert echo.accepted == 1, f"the server saw {echo.accepted} connections"
        assert proxy.silenced == 2, proxy.silenced

        # A client closing a silenced connection: the server is not told.
        before.close()
        assert echo.closed_by_peer == 0
        with echo.lock:
            server_side = echo.conns[0]
        server_side.settimeout(SILENCE_S)
        with pytest.raises(TimeoutError):
            server_side.recv(1)  # not b"": the close was not passed on
        during.close()


def test_a_blackhole_notes_when_a_client_first_wrote_into_it(echo: EchoServer) -> None:
    with TcpProxy(echo.port) as proxy:
        idle = _client(proxy)
        assert _echoes(idle, b"warm") == b"warm"
        proxy.blackhole()
        assert _stays_silent(idle)  # nothing written yet: no request's deadline has started
        assert proxy.first_silenced_request_at is None
        written_at = time.time()
        idle.sendall(b"request")
        _wait_for(lambda: proxy.first_silenced_request_at is not None, "the first request")
        first = proxy.first_silenced_request_at
        assert first is not None and written_at <= first <= time.time()
        idle.sendall(b"another")
        assert _stays_silent(idle)
        assert proxy.first_silenced_request_at == first, "a later request moved the start"
        proxy.restore()
        proxy.blackhole()  # a new blackhole starts its own count
        assert proxy.first_silenced_request_at is None
        idle.close()


def test_restore_resets_the_silenced_connections_and_forwards_new_ones(echo: EchoServer) -> None:
    with TcpProxy(echo.port) as proxy:
        old = _client(proxy)
        assert _echoes(old, b"a") == b"a"
        proxy.blackhole()
        proxy.restore()
        assert not proxy.is_blackholed
        # The old connection is reset (EOF or a reset), never revived.
        try:
            assert old.recv(1) == b""
        except ConnectionResetError:
            pass
        old.close()
        _wait_for(lambda: echo.closed_by_peer == 1, "the server side of the old connection closed")
        new = _client(proxy)
        assert _echoes(new, b"after") == b"after"
        assert echo.accepted == 2
        new.close()


def test_cut_still_refuses_and_restore_accepts_again(echo: EchoServer) -> None:
    with TcpProxy(echo.port) as proxy:
        conn = _client(proxy)
        assert _echoes(conn, b"x") == b"x"
        proxy.cut()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        proxy.restore()
        again = _client(proxy)
        assert _echoes(again, b"y") == b"y"
        again.close()
        conn.close()


def test_dropped_replies_reach_the_server_unanswered_and_restore_resets(echo: EchoServer) -> None:
    with TcpProxy(echo.port) as proxy:
        conn = _client(proxy)
        assert _echoes(conn, b"before") == b"before"
        proxy.drop_replies()
        conn.sendall(b"carried-out")
        # The request reaches the server, which answers; the answer never arrives.
        _wait_for(lambda: bytes(echo.received).endswith(b"carried-out"), "the request")
        assert _stays_silent(conn)
        assert proxy.replies_dropped == len(b"carried-out")
        proxy.cut()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        assert conn.recv(4096) == b""  # closed, never answered
        proxy.restore()
        again = _client(proxy)
        assert _echoes(again, b"after") == b"after"
        again.close()
        conn.close()


def test_restore_after_dropped_replies_resets_the_connections_that_lost_answers(
    echo: EchoServer,
) -> None:
    with TcpProxy(echo.port) as proxy:
        conn = _client(proxy)
        proxy.drop_replies()
        conn.sendall(b"lost")
        _wait_for(lambda: bytes(echo.received).endswith(b"lost"), "the request")
        proxy.restore()
        # Half an exchange went missing on it: the old connection is reset, not resumed.
        with contextlib.suppress(ConnectionResetError):
            assert conn.recv(4096) == b""
        again = _client(proxy)
        assert _echoes(again, b"fresh") == b"fresh"
        again.close()
        conn.close()
