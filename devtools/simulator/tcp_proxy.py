"""A TCP proxy that tests can cut, blackhole and restore, to take PostgreSQL, Kafka or a
gateway away from a client.

Usage::

    with TcpProxy(target_port=pg.port) as proxy:     # listens on proxy.port
        ...  # point the relay's DSN at proxy.port
        proxy.cut()        # every connection through it is closed, new ones are refused
        proxy.restore()    # accepts again, on the same port
        proxy.blackhole()  # every connection stays open and goes silent
        proxy.restore()    # the silent connections are reset, new ones forward again
        proxy.drop_replies()  # requests still reach the server, its answers are dropped
        proxy.cut()        # ... then the client sees its connection close, unanswered

While cut, the listening socket is closed, so clients get "connection refused"
(what a stopped server gives), not a hang.

While blackholed, nothing is closed and nothing is forwarded: a peer that stops
answering without closing (a NAT or load balancer that dropped the connection's
state, a frozen VM). Bytes either side sends are read and dropped, a close from
either side is not passed on, and connections accepted meanwhile are silent too
(the client's connect succeeds, then nothing). Only a deadline in the client
notices. A silenced connection never forwards again: :meth:`restore` resets it
(as a NAT answers the next packet of a connection it forgot) and forwards only
connections made after it. The proxy's own kernel still acknowledges what it
reads, so TCP-level deadlines (keepalives, ``TCP_USER_TIMEOUT``) do not fire
through it: what it tests is the application's read deadlines.

While dropping replies, what clients send is forwarded and what the server answers
is read and dropped: requests the server carries out are never acknowledged. A
:meth:`cut` after it is the connection lost between a write and its acknowledgement,
the case a client's retry can duplicate (an idempotent Kafka producer's must not).
:meth:`cut` ends it, and so does :meth:`restore`, which resets the connections too.

Threads, not asyncio: the callers
are synchronous pytest tests and the proxy must keep working while they block.
For Kafka the broker must advertise the proxy's port (see
:class:`devtools.stack.devstack.TansuBroker`'s ``advertised_port``), or clients would
reconnect to the broker directly after their first metadata request.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from devtools.stack.lifecycle import StartStop

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
        self._blackholed = False
        # Sockets of silenced connections: what they receive is dropped, never forwarded.
        self._silenced: set[socket.socket] = set()
        # The server side of each connection, and whether what it sends is dropped.
        self._upstreams: set[socket.socket] = set()
        self._dropping_replies = False
        self.accepted = 0
        """Connections accepted so far (tests check that clients came back)."""
        self.silenced = 0
        """Connections silenced so far: open when :meth:`blackhole` came, or accepted during it."""
        self.replies_dropped = 0
        """Bytes of the server's answers :meth:`drop_replies` kept from clients so far."""
        self.first_silenced_request_at: float | None = None
        """``time.time()`` when a client first sent bytes into the current blackhole (None
        until one does): where a request's deadline starts, for a client that was idle when
        the blackhole came."""

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("TcpProxy is not started")
        return self._port

    @property
    def is_cut(self) -> bool:
        return self._cut

    @property
    def is_blackholed(self) -> bool:
        return self._blackholed

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
        self._dropping_replies = False
        self._cut = True
        self.stop()
        self._cut = True

    def blackhole(self) -> None:
        """Silence every connection, open and new, without closing any, until :meth:`restore`."""
        with self._lock:
            self._blackholed = True
            self.first_silenced_request_at = None
            fresh = self._connections - self._silenced
            self._silenced.update(fresh)
            self.silenced += len(fresh) // 2

    def drop_replies(self) -> None:
        """Forward what clients send, drop what the server answers, until :meth:`cut` or
        :meth:`restore`: requests are carried out and never acknowledged."""
        self._dropping_replies = True

    def restore(self) -> None:
        """Accept connections again, on the same port; after :meth:`blackhole`, reset the
        silenced connections and forward the new ones; after :meth:`drop_replies`, reset
        the connections that lost answers (their byte streams are broken) and forward again."""
        dropped, self._dropping_replies = self._dropping_replies, False
        if dropped:
            self._close_connections()
        with self._lock:
            self._blackholed = False
            silenced = set(self._silenced)
            self._silenced.clear()
            self._connections -= silenced
        for sock in silenced:
            _close(sock)
        if self._listener is None:
            self.start()

    # --- internals ---------------------------------------------------------------------

    def _close_connections(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, set()
            connections |= self._silenced
            self._silenced.clear()
        for conn in connections:
            _close(conn)

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: stop() or cut()
            if self._blackholed:
                self._accept_silent(listener, client)
                continue
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
                self._upstreams.add(upstream)
                self.accepted += 1
                if self._blackholed:  # blackhole() came while upstream was connecting
                    self._silenced.update((client, upstream))
                    self.silenced += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _accept_silent(self, listener: socket.socket, client: socket.socket) -> None:
        """A connection made during a blackhole: accepted, never connected upstream, silent."""
        with self._lock:
            if self._listener is not listener:
                _close(client)
                return
            self._connections.add(client)
            self._silenced.add(client)
            self.accepted += 1
            self.silenced += 1
        threading.Thread(target=self._pump, args=(client, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket | None) -> None:
        try:
            while data := src.recv(_BUFFER):
                if dst is None or src in self._silenced:
                    if self.first_silenced_request_at is None and src not in self._upstreams:
                        self.first_silenced_request_at = time.time()
                    continue
                if self._dropping_replies and src in self._upstreams:
                    self.replies_dropped += len(data)
                    continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                # A silenced connection's close is not passed on: its peer stays open and
                # hears nothing, until restore() or stop() resets it.
                passed_on = src not in self._silenced
                self._connections.discard(src)
                self._silenced.discard(src)
                self._upstreams.discard(src)
                if passed_on and dst is not None:
                    self._connections.discard(dst)
            _close(src)
            if passed_on and dst is not None:
                _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
