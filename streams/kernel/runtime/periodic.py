"""A timer: one job run now and then every interval, whose failures never escape.

The one periodic mechanism of zapstream (lag readings, slot metrics, pipeline gauges, the
controls reader, sink progress). A failure is counted in
``zapstream_timer_errors_total{job}``; a dependency being away (Kafka, PostgreSQL, the
network: :func:`streams.kernel.failures.is_transient`) is one outage (:class:`OutageLog`),
anything else is a bug logged with its traceback once per kind. The next run after a
failure waits longer (capped exponential backoff), and ticks keep their rhythm: a slow run
shortens the next wait, runs never stack up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from streams.kernel import kafka_outage
from streams.kernel.failures import is_transient
from streams.kernel.runtime.backoff import Backoff
from streams.kernel.runtime.outage import OutageLog
from streams.kernel.runtime.service import Service

log = logging.getLogger(__name__)

TIMER_ERRORS = Counter(
    "zapstream_timer_errors_total",
    "Runs of a periodic job (lag monitor, sink progress, controls reader, slot metrics, "
    "pipeline gauges) that failed; the job runs again at its next tick",
    ["job"],
)

FLAP_WINDOW_S = 60.0
"""A job failing again (transiently) this soon after its recovery line continues that
outage: counted, no new line."""


class JobFailures:
    """How one periodic job's failures are told: an outage once, a bug once per kind."""

    def __init__(
        self,
        job: str,
        logger: logging.Logger,
        *,
        kafka: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self._log = logger
        self._bug: type[BaseException] | None = None
        self.outage = OutageLog(
            job,
            logger,
            retrying="retrying at the next tick",
            # A job reading Kafka says nothing within the process's Kafka outage (its own
            # line says it); a job of another dependency (PostgreSQL) still speaks then.
            quiet=kafka_outage.reported if kafka else None,
            flap_window_s=FLAP_WINDOW_S,
            clock=clock,
        )

    def failed(self, exc: Exception) -> None:
        TIMER_ERRORS.labels(self.job).inc()
        if is_transient(exc):
            self.outage.failed(exc)
            return
        if self._bug is not type(exc):
            self._bug = type(exc)
            self._log.error("%s failed; it runs again at its next tick", self.job, exc_info=exc)

    def succeeded(self) -> None:
        self._bug = None
        self.outage.recovered()


class Periodic(Service):
    """Runs ``fn`` now and then every ``interval_s`` in a task of its own, until stopped.

    After a failure the next run waits ``max(interval_s, retry_s)``, doubling with each
    failure in a row up to ``max_retry_s`` (never under ``interval_s``). An interval of 0
    runs ``fn`` back to back (``fn`` then waits on its own, e.g. a poll with a timeout).
    ``kafka``: the job reads Kafka (its outage line gives way to the process's Kafka
    outage line, :mod:`streams.kernel.kafka_outage`).

    ``crash_on_bug``: a failure that is not a dependency being away ends the timer, and
    :meth:`run` raises it, for a job whose bug must stop its process (the worker's retry
    scan and dedup horizon: Faust crashes the app when an app task raises, and the
    supervisor restarts it). Without it every failure is told and the timer goes on.
    """

    def __init__(
        self,
        name: str,
        interval_s: float,
        fn: Callable[[], Awaitable[object]],
        *,
        retry_s: float = 1.0,
        max_retry_s: float = 30.0,
        logger: logging.Logger = log,
        kafka: bool = True,
        crash_on_bug: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name=name)
        self.crash_on_bug = crash_on_bug
        self.interval_s = interval_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.failures = 0
        """Failed runs in a row."""
        self.backoff = Backoff(
            initial_s=max(interval_s, retry_s), max_s=max(max_retry_s, interval_s), jitter=False
        )
        """The wait after each failed run in a row: never under ``interval_s``."""
        self.runs = 0
        self._told = JobFailures(name, logger, kafka=kafka, clock=clock)
        self._fn = fn
        self._task: asyncio.Task[None] | None = None

    @property
    def outage(self) -> OutageLog:
        return self._told.outage

    async def on_start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self.name)

    async def on_stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def summary(self) -> str:
        return f"{self.runs} runs, {self.failures} failing in a row"

    async def run(self) -> None:
        """Wait for the timer's end: never, unless ``crash_on_bug`` and a bug (raised here)."""
        if self._task is None:
            raise RuntimeError(f"{self.name}: run() before start()")
        await asyncio.shield(self._task)

    async def tick(self) -> bool:
        """Run the job once, its failure told (or raised: ``crash_on_bug``); True if it ran."""
        try:
            await self._fn()
        except Exception as exc:  # noqa: BLE001 - a timer tells its failures, never crashes
            if self.crash_on_bug and not is_transient(exc):
                raise
            self._told.failed(exc)
            self.failures += 1
            return False
        self._told.succeeded()
        self.failures = 0
        return True

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            if await self.tick():
                self.backoff.reset()
                wait = self.interval_s
            else:
                wait = self.backoff.next_delay_s()
            self.runs += 1
            # Ticks keep their rhythm: a slow run shortens the wait, never stacks up.
            await asyncio.sleep(max(wait - (loop.time() - started), 0.0))
