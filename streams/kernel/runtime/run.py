"""Run a deployable until SIGTERM/SIGINT: the one way every zapstream service starts and ends.

:func:`run_until_signalled` starts the deployable's top :class:`Service`, runs its
:meth:`~Service.run` until it returns or a signal asks it to stop, gives it ``drain_s`` to
finish what is in flight (its ``run`` returns once drained), stops it (flush, close) and
prints one closing line::

    zapstream relay stopped after 812.4s: 12001 transactions, 120000 intents, ...

A refused start (:class:`~streams.kernel.failures.StartRefused`, or any permanent
:class:`~streams.kernel.errors.Failure` raised while starting) is one line on stderr
naming what to fix, and exit status 2: a restart would fail the same way.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import TextIO

from streams.kernel.errors import Failure
from streams.kernel.runtime.service import Service

log = logging.getLogger("zapstream")

EXIT_OK = 0
EXIT_REFUSED = 2
DEFAULT_DRAIN_S = 30.0


def closing_line(service: Service, took_s: float) -> str:
    """The one line a deployable ends with (the worker writes it from Faust's shutdown too)."""
    return f"zapstream {service.name} stopped after {took_s:.1f}s: {service.summary()}"


def refusal_line(name: str, exc: Failure) -> str:
    return f"zapstream: {name} cannot start: {exc}"


async def serve(service: Service, *, drain_s: float = DEFAULT_DRAIN_S) -> None:
    """Start ``service``, run it until it returns or a stop is requested, drain, stop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.request_stop)
    try:
        async with service:
            body = asyncio.create_task(service.run(), name=f"{service.name} run")
            stop = asyncio.create_task(service.wait_stop_requested(), name="stop requested")
            try:
                await asyncio.wait({body, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not body.done():
                    # Stop requested: run() stops taking new work and returns once drained.
                    done, _ = await asyncio.wait({body}, timeout=drain_s)
                    if not done:
                        log.warning(
                            "%s did not drain within %.0fs: stopping what is in flight",
                            service.name,
                            drain_s,
                        )
                        body.cancel()
                        await asyncio.gather(body, return_exceptions=True)
                        return
                body.result()
            finally:
                stop.cancel()
                for task in (body, stop):
                    if not task.done():
                        task.cancel()
                await asyncio.gather(body, stop, return_exceptions=True)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def run_until_signalled(
    build: Service | Callable[[], Service],
    *,
    drain_s: float = DEFAULT_DRAIN_S,
    stderr: TextIO | None = None,
) -> int:
    """Run a deployable to its end; return its exit status (0, or 2 for a refused start).

    ``build`` is the service or a callable that builds it inside the event loop (services
    that create asyncio objects at construction need a running loop).
    """
    err = stderr or sys.stderr
    started = time.monotonic()
    holder: list[Service] = []

    async def main() -> None:
        service = build() if not isinstance(build, Service) else build
        holder.append(service)
        await serve(service, drain_s=drain_s)

    try:
        asyncio.run(main())
    except Failure as exc:
        if exc.retriable:
            raise
        name = holder[0].name if holder else "service"
        print(refusal_line(name, exc), file=err)
        return EXIT_REFUSED
    if holder:
        log.info("%s", closing_line(holder[0], time.monotonic() - started))
    return EXIT_OK
