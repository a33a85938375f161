"""``/healthz`` and ``/readyz`` on the worker's web port (beside ``/metrics``).

The same three paths and the same readiness contract as every other deployable's
:class:`~streams.kernel.runtime.health.HealthEndpoint`, served by Faust's web server:
``/healthz`` answers 200 while the process serves requests (a liveness probe).
``/readyz`` answers ``readiness()``: 200 with ``streaming`` while the worker runs its
streams, 503 with the reason while the consumer group rebalances, while tables recover
from their changelogs, or before the consumer started (a readiness probe; a rolling update
waits for it).
"""

from __future__ import annotations

from typing import Any

from streams.kernel.runtime.health import Readiness


def not_ready_reason(app: Any) -> str | None:
    """Why the worker is not processing now, or None when it is."""
    if getattr(app, "consumer", None) is None or not app.consumer.started:
        return "starting"
    if app.rebalancing:
        return "rebalancing"
    if app.in_recovery:
        return "recovering tables"
    if not app.consumer.flow_active:
        return "flow stopped"
    return None


def readiness(app: Any) -> tuple[bool, str]:
    """``readiness()`` of the runtime's contract for the Faust app: (True, "streaming"), or
    (False, why)."""
    reason = not_ready_reason(app)
    return (True, "streaming") if reason is None else (False, reason)


def add_health_pages(app: Any, readiness: Readiness) -> None:
    """Register ``/healthz`` and ``/readyz`` on the Faust app's web server; ``/readyz``
    answers as :class:`~streams.kernel.runtime.health.HealthEndpoint` does."""

    async def healthz(web: Any, request: Any) -> Any:
        return web.text("ok\n")

    async def readyz(web: Any, request: Any) -> Any:
        ready, why = readiness()
        return web.text(f"{why}\n", status=200 if ready else 503)

    app.page("/healthz")(healthz)
    app.page("/readyz")(readyz)
