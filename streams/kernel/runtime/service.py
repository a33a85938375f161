"""A long-lived part of a deployable, with an explicit lifecycle state.

httpx's ``ClientState`` is the model: the state is one enum, never a set of flags, and
every transition is checked. A :class:`Service` is started once and stopped once;
``start()`` and ``stop()`` are idempotent, and ``async with`` does both. Children (the
services a service owns: a health endpoint, a timer, a client) start in the order they
were added, after the parent's own :meth:`Service.on_start`, and stop in reverse order,
before the parent's :meth:`Service.on_stop`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from types import TracebackType
from typing import Self

log = logging.getLogger(__name__)


class ServiceState(enum.Enum):
    """Where a service is in its life; it only moves forward."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class Service:
    """The base of every long-lived thing: state, idempotent start/stop, children, stop request.

    Subclasses override :meth:`on_start` (open connections, spawn tasks), :meth:`on_stop`
    (flush, close), :meth:`run` (the main body, for a deployable's top service),
    :meth:`summary` (the closing line's text) and :meth:`readiness`.
    """

    name: str = "service"

    def __init__(self, *, name: str | None = None) -> None:
        if name is not None:
            self.name = name
        self._state = ServiceState.CREATED
        self._children: list[Service] = []
        self._started: list[Service] = []
        self._stop_requested = asyncio.Event()
        self._stop_lock: asyncio.Lock | None = None

    # -- state ----------------------------------------------------------------------------

    @property
    def state(self) -> ServiceState:
        return self._state

    @property
    def running(self) -> bool:
        return self._state is ServiceState.RUNNING

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def request_stop(self) -> None:
        """Ask :meth:`run` to finish (safe from a signal handler); :meth:`stop` still closes."""
        self._stop_requested.set()

    async def wait_stop_requested(self) -> None:
        await self._stop_requested.wait()

    def add_child(self, child: Service) -> Service:
        """Start ``child`` with this service (after :meth:`on_start`), stop it before this one."""
        if self._state is not ServiceState.CREATED:
            raise RuntimeError(f"{self.name}: children are added before start ({self._state})")
        self._children.append(child)
        return child

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start (idempotent). A failed start stops what it had started and re-raises."""
        if self._state is not ServiceState.CREATED:
            if self._state is ServiceState.STOPPED:
                raise RuntimeError(f"{self.name} was stopped: it cannot start again")
            return
        self._state = ServiceState.STARTING
        try:
            await self.on_start()
            for child in self._children:
                await child.start()
                self._started.append(child)
        except BaseException:
            await self._close()
            raise
        self._state = ServiceState.RUNNING

    async def stop(self) -> None:
        """Drain and stop (idempotent; a second caller waits for the first)."""
        if self._stop_lock is None:
            self._stop_lock = asyncio.Lock()
        async with self._stop_lock:
            if self._state in (ServiceState.STOPPED, ServiceState.CREATED):
                self._state = ServiceState.STOPPED
                return
            self.request_stop()
            await self._close()

    async def _close(self) -> None:
        self._state = ServiceState.DRAINING
        try:
            for child in reversed(self._started):
                await child.stop()
        finally:
            self._started.clear()
            try:
                await self.on_stop()
            finally:
                self._state = ServiceState.STOPPED

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- what subclasses override ---------------------------------------------------------

    async def on_start(self) -> None:
        """Open what the service needs (called once, before its children start)."""

    async def on_stop(self) -> None:
        """Flush and close (called once, after its children stopped; also after a failed start)."""

    async def run(self) -> None:
        """The service's main body, for the top service of a deployable: by default it waits
        until a stop is requested."""
        await self.wait_stop_requested()

    def summary(self) -> str:
        """The closing line's text (what the service did), e.g. ``"12 batches, 3,400 rows"``."""
        return self._state.value

    def readiness(self) -> tuple[bool, str]:
        """(ready?, why) for ``/readyz``: ready while running, with the state as the reason."""
        return self._state is ServiceState.RUNNING, self._state.value
