"""A TCP proxy that tests can cut and restore, to take PostgreSQL or Kafka away from a client.

Usage::

    with TcpProxy(target_port=pg.port) as proxy:     # listens on proxy.port
        ...  # point the relay's DSN at proxy.port
        proxy.cut()       # every connection through it is closed, new ones are refused
        proxy.restore()   # accepts again, on the same port

While cut, the listening socket is closed, so clients get "connection refused"
(what a stopped server gives), not a hang. Threads, not asyncio: the callers
are synchronous pytest tests and the proxy must keep working while they block.
For Kafka the broker must advertise the proxy's port (see
:class:`devtools.devstack.TansuBroker`'s ``advertised_port``), or clients would
reconnect to the broker directly after their first metadata request.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from devtools.lifecycle import StartStop

__all__ = ["TcpProxy"]

_BUFFER = 64 * 1024


class TcpProxy(StartStop):
    """Forwards ``127.0.0.1:port`` to ``target_host:target_port``; can :meth:`cut` and
    :meth:`restore` it."""

    def __init__(self, target_port: int, *, port: int = 0, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._port = port
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._cut = False
        self.accepted = 0
        """Connections accepted so far (tests check that clients came back)."""

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("TcpProxy is not started")
        return self._port

    @property
    def is_cut(self) -> bool:
        return self._cut

    def start(self) -> None:
        """Listen (on ``port``, or a free one the first time) and start accepting."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self._port))
        listener.listen(128)
        self._port = listener.getsockname()[1]
        self._listener = listener
        self._cut = False
        self._accepting = threading.Thread(
            target=self._accept_loop, args=(listener,), name=f"tcp-proxy:{self._port}", daemon=True
        )
        self._accepting.start()

    def stop(self) -> None:
        """Close the listener and every connection. Idempotent."""
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)
        if self._accepting is not None:
            self._accepting.join(timeout=5)
            self._accepting = None
        self._close_connections()

    def cut(self) -> None:
        """Close every connection and refuse new ones until :meth:`restore`."""
        self._cut = True
        self.stop()
        self._cut = True

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        if self._listener is None:
            self.start()

    # --- internals ---------------------------------------------------------------------

    def _close_connections(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, set()
        for conn in connections:
            _close(conn)

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: stop() or cut()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._listener is not listener:
                    _close(client)
                    _close(upstream)
                    return
                self._connections.update((client, upstream))
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(_BUFFER):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(src)
                self._connections.discard(dst)
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
