"""``/metrics``, ``/healthz`` and ``/readyz``: the one health endpoint of every deployable.

``/healthz`` answers 200 as long as the process serves HTTP (a liveness probe: the event
loop is alive). ``/readyz`` answers 200 while ``readiness()`` says so and 503 otherwise,
with the reason as the body (e.g. ``standby``). ``/metrics`` is prometheus_client's text
exposition of the default registry. The worker serves the same three paths on Faust's own
web server with the same readiness contract (:mod:`streams.health`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from streams.kernel.runtime.service import Service

if TYPE_CHECKING:
    from aiohttp import web

Readiness = Callable[[], tuple[bool, str]]
"""``readiness()``: (True, "streaming") while ready, else (False, why)."""

log = logging.getLogger(__name__)


class HealthEndpoint(Service):
    """An aiohttp server on ``port`` (0: off) for the three paths; a child of a deployable."""

    def __init__(
        self,
        port: int,
        *,
        bind_local: bool,
        readiness: Readiness | None = None,
        name: str = "metrics",
        logger: logging.Logger = log,
    ) -> None:
        super().__init__(name=f"{name} health endpoint")
        self._owner = name
        self.port = port
        self.host = "127.0.0.1" if bind_local else "0.0.0.0"  # noqa: S104 - a pod's probes
        self._readiness: Readiness = readiness or (lambda: (True, "ready"))
        self._log = logger
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str | None:
        return None if self._runner is None else f"http://{self.host}:{self.port}/metrics"

    async def on_start(self) -> None:
        """Serve; raises OSError if the port is taken."""
        if self.port == 0:
            return
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._log.info("%s metrics on %s (and /healthz, /readyz)", self._owner, self.url)

    async def on_stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

        response = web.Response(body=generate_latest(REGISTRY))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        from aiohttp import web

        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        from aiohttp import web

        ready, why = self._readiness()
        return web.Response(status=200 if ready else 503, text=f"{why}\n")
