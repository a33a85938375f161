"""``/metrics``, ``/healthz`` and ``/readyz``: the one health endpoint of every deployable.

``/healthz`` answers 200 as long as the process serves HTTP (a liveness probe: the event
loop is alive). ``/readyz`` answers 200 while ``readiness()`` says so and 503 otherwise,
with the reason as the body (e.g. ``standby``). ``/metrics`` is prometheus_client's text
exposition of the default registry. The worker serves the same three paths on Faust's own
web server with the same readiness contract (:mod:`streams.health`); a deployable with an
aiohttp app of its own (the webhook intake) mounts the same three handlers on it
(:func:`add_health_routes`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from streams.kernel.failures import StartRefused
from streams.kernel.runtime.service import Service

if TYPE_CHECKING:
    from aiohttp import web

Readiness = Callable[[], tuple[bool, str]]
"""``readiness()``: (True, "streaming") while ready, else (False, why)."""

log = logging.getLogger(__name__)

IDLE_CONNECTION_TIMEOUT_S = 75.0
"""How long an HTTP server of zapstream's (metrics and health, the webhook, the console) keeps
an idle keep-alive connection: aiohttp's own default is an hour, so a client that opens
connections and leaves them idle would pile up sockets."""


def add_health_routes(app: web.Application, readiness: Readiness) -> None:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``app`` (the one implementation)."""

    async def readyz(request: web.Request) -> web.Response:
        from aiohttp import web

        try:
            ready, why = readiness()
        except Exception as exc:  # noqa: BLE001 - a probe must answer, never crash
            ready, why = False, f"readiness unknown: {exc!r}"
        return web.Response(status=200 if ready else 503, text=f"{why}\n")

    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", readyz)


async def _metrics(request: web.Request) -> web.Response:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    response = web.Response(body=generate_latest(REGISTRY))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def _healthz(request: web.Request) -> web.Response:
    from aiohttp import web

    return web.Response(text="ok\n")


class HealthEndpoint(Service):
    """An aiohttp server on ``port`` (0: off) for the three paths; a child of a deployable.

    ``port_setting`` names the setting of the port: a port that cannot be served is then a
    refused start (:class:`~streams.kernel.failures.StartRefused`, exit 2) naming it (and
    that 0 switches metrics off, unless ``may_switch_off`` is false: the setting forbids 0).
    """

    def __init__(
        self,
        port: int,
        *,
        bind_local: bool,
        readiness: Readiness | None = None,
        name: str = "metrics",
        logger: logging.Logger = log,
        port_setting: str | None = None,
        may_switch_off: bool = True,
    ) -> None:
        super().__init__(name=f"{name} health endpoint")
        self._owner = name
        self.port = port
        self.host = "127.0.0.1" if bind_local else "0.0.0.0"  # noqa: S104 - a pod's probes
        self._readiness: Readiness = readiness or (lambda: (True, "ready"))
        self._log = logger
        self._port_setting = port_setting
        self._off = ", or 0 to switch metrics off" if may_switch_off else ""
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
        add_health_routes(app, self._readiness)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=IDLE_CONNECTION_TIMEOUT_S,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as exc:
            await runner.cleanup()
            if self._port_setting is None:
                raise
            raise StartRefused(
                f"cannot serve metrics on {self.host}:{self.port} ({exc.strerror or exc})",
                hint=f"set {self._port_setting} to a free port{self._off}",
            ) from exc
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._log.info("%s metrics on %s (and /healthz, /readyz)", self._owner, self.url)

    async def on_stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
