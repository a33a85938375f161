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


def guarded(
    job: str,
    fn: Callable[[], Awaitable[object]],
    logger: logging.Logger = log,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], Awaitable[None]]:
    """``fn`` that never raises (cancellation apart), for a timer someone else schedules
    (a Faust ``app.timer``, whose app crashes when a timer raises)."""
    failures = JobFailures(job, logger, clock=clock)

    async def run() -> None:
        try:
            await fn()
        except Exception as exc:  # noqa: BLE001 - a timer must never crash its process
            failures.failed(exc)
        else:
            failures.succeeded()

    run.__name__ = run.__qualname__ = job.replace(" ", "_").replace("-", "_")
    return run


class Periodic(Service):
    """Runs ``fn`` now and then every ``interval_s`` in a task of its own, until stopped.

    After a failure the next run waits ``max(interval_s, retry_s)``, doubling with each
    failure in a row up to ``max_retry_s`` (never under ``interval_s``). An interval of 0
    runs ``fn`` back to back (``fn`` then waits on its own, e.g. a poll with a timeout).
    ``kafka``: the job reads Kafka (its outage line gives way to the process's Kafka
    outage line, :mod:`streams.kernel.kafka_outage`).
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
    ) -> None:
        super().__init__(name=name)
        self.interval_s = interval_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.failures = 0
        """Failed runs in a row."""
        self.runs = 0
        self._told = JobFailures(name, logger, kafka=kafka)
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

    def retry_delay(self, failures: int) -> float:
        """The wait after ``failures`` failed runs in a row (capped exponential backoff)."""
        first = max(self.interval_s, self.retry_s)
        cap = max(self.max_retry_s, self.interval_s)
        return float(min(first * 2 ** min(failures - 1, 32), cap))

    def summary(self) -> str:
        return f"{self.runs} runs, {self.failures} failing in a row"

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self._fn()
            except Exception as exc:  # noqa: BLE001 - a timer must never crash its process
                self._told.failed(exc)
                self.failures += 1
                wait = self.retry_delay(self.failures)
            else:
                self._told.succeeded()
                self.failures = 0
                wait = self.interval_s
            self.runs += 1
            await asyncio.sleep(max(wait - (loop.time() - started), 0.0))
