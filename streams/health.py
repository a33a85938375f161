"""``/healthz`` and ``/readyz`` on the worker's web port (beside ``/metrics``).

``/healthz`` answers 200 while the process serves requests (a liveness probe).
``/readyz`` answers 200 only while the worker runs its streams: 503 with the reason
while the consumer group rebalances, while tables recover from their changelogs, or
before the consumer started (a readiness probe; a rolling update waits for it).
"""

from __future__ import annotations

from typing import Any


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


def add_health_pages(app: Any) -> None:
    """Register ``/healthz`` and ``/readyz`` on the Faust app's web server."""

    async def healthz(web: Any, request: Any) -> Any:
        return web.text("ok\n")

    async def readyz(web: Any, request: Any) -> Any:
        reason = not_ready_reason(app)
        if reason is not None:
            return web.text(f"not ready: {reason}\n", status=503)
        return web.text("ready\n")

    app.page("/healthz")(healthz)
    app.page("/readyz")(readyz)
