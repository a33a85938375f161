"""The worker as a :class:`~streams.kernel.runtime.service.Service`: its readiness and its
closing line, in the runtime's contract, while Faust runs it.

Faust's ``Worker`` owns the worker's process (signals, event loop, shutdown), so the worker
does not go through :func:`~streams.kernel.runtime.run.run_until_signalled`; it keeps what
every deployable shares with it instead: ``readiness() -> (bool, str)`` behind ``/readyz``
on Faust's web server (:mod:`streams.health`), and one closing line in the format of
:func:`~streams.kernel.runtime.run.closing_line` when the app stopped::

    zapstream worker stopped after 812.4s: 12,000 intents (11,990 ACCEPTED, 10 parked), ...

:class:`WorkerService` is the app's first resource (:class:`streams.app.WorkerApp`), so it
starts before everything and stops after everything else stopped: the line comes last.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from streams.kernel.runtime.health import Readiness
from streams.kernel.runtime.run import closing_line
from streams.kernel.runtime.service import Service, ServiceState

log = logging.getLogger("zapstream")
"""The runtime's logger for closing lines (:mod:`streams.kernel.runtime.run`)."""


class WorkerTally:
    """What the dispatchers handled, for the closing line (plain counters, no Prometheus
    read-back): intents by decision, receipts, commands, poison records."""

    def __init__(self) -> None:
        self.intents: collections.Counter[str] = collections.Counter()
        self.receipts = 0
        self.commands = 0
        self.poison = 0

    def summary(self) -> str:
        total = sum(self.intents.values())
        decisions = ", ".join(f"{n:,} {d}" for d, n in self.intents.most_common())
        return (
            f"{total:,} intents" + (f" ({decisions})" if decisions else "") + ", "
            f"{self.receipts:,} receipts, {self.commands:,} commands, "
            f"{self.poison:,} poison records"
        )


class WorkerService(Service):
    """The worker's lifecycle as the runtime sees it: ready while Faust runs its streams,
    one closing line once stopped."""

    name = "worker"

    def __init__(
        self,
        tally: WorkerTally,
        *,
        streaming: Readiness,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``streaming``: the Faust app's readiness (:func:`streams.health.readiness`)."""
        super().__init__()
        self.tally = tally
        self._streaming = streaming
        self._clock = clock
        self._built_at = clock()
        """The closing line counts from here, as ``run_until_signalled`` counts from before
        the deployable starts (the worker is built in ``main()``, just before Faust runs)."""

    def readiness(self) -> tuple[bool, str]:
        """Ready while the worker runs its streams; else why not (the runtime's contract)."""
        if self.state is not ServiceState.RUNNING:
            return False, self.state.value
        return self._streaming()

    def summary(self) -> str:
        return self.tally.summary()

    async def on_stop(self) -> None:
        # The last resource to stop (the first started): everything else is closed.
        log.info("%s", closing_line(self, self._clock() - self._built_at))
