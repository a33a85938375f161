"""``/metrics``, ``/healthz`` and ``/readyz`` over HTTP, for the relay and the state sink.

The worker serves the same three paths on Faust's web server (:mod:`streams.health`),
the webhook intake on its own aiohttp server.
"""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

Readiness = Callable[[], tuple[bool, str]]
"""``ready()``: (True, "streaming") while ready, else (False, why); called from the HTTP thread."""


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` over HTTP in a thread; ``port`` 0 means off.

    ``/healthz`` answers 200 as long as the process serves HTTP. ``/readyz``
    answers 200 while ``ready()`` says so and 503 otherwise, with the reason
    as the body (e.g. ``standby``). ``/metrics`` is prometheus_client's text
    exposition of the default registry.
    """

    def __init__(
        self,
        port: int,
        *,
        bind_local: bool,
        log: logging.Logger,
        ready: Readiness | None = None,
        name: str = "relay",
    ) -> None:
        self._name = name
        self._port = port
        self._host = "127.0.0.1" if bind_local else "0.0.0.0"  # noqa: S104
        self._log = log
        self._ready = ready or (lambda: (True, "ready"))
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str | None:
        return None if self._server is None else f"http://{self._host}:{self._port}/metrics"

    def start(self) -> None:
        """Serve; raises OSError if the port is taken."""
        if self._port == 0 or self._server is not None:
            return
        server = http.server.ThreadingHTTPServer((self._host, self._port), _handler(self._ready))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name=f"{self._name}-metrics", daemon=True
        )
        self._thread.start()
        self._log.info("%s metrics on %s (and /healthz, /readyz)", self._name, self.url)

    def stop(self) -> None:
        """Stop serving (idempotent). Blocks for the server thread's poll (<0.5 s)."""
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


def _handler(ready: Readiness) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
            elif path == "/healthz":
                self._reply(200, "text/plain; charset=utf-8", b"ok\n")
            elif path == "/readyz":
                try:
                    ok, why = ready()
                except Exception as exc:  # noqa: BLE001 (a probe must answer, never crash)
                    ok, why = False, f"readiness unknown: {exc!r}"
                self._reply(200 if ok else 503, "text/plain; charset=utf-8", f"{why}\n".encode())
            else:
                self._reply(404, "text/plain; charset=utf-8", b"not found\n")

        def _reply(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            # Scrapes and probes every few seconds: not worth a log line each.
            return

    return Handler
