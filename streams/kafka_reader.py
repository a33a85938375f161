"""Reading Kafka outside any consumer group, and timers that never crash their process.

Three parts of zapstream read topics on their own, beside (or without) the
worker's consumer group: the controls reader (:mod:`streams.controls`) reads
``zapstream.controls`` from its start, the dedup horizon's sink progress
(:mod:`streams.sink_progress`) reads the state sink's committed offsets and the
record before each, and the lag monitor (:mod:`streams.lag_monitor`) reads a
group's committed offsets and the first record it has not consumed. They share:

- :func:`group_less_consumer`: an ``AIOKafkaConsumer`` with no ``group_id`` and
  no auto-commit (it joins no group, commits nothing, and is assigned partitions
  by hand), and :func:`admin_client` for committed offsets;
- :func:`guarded` and :class:`Every`: a periodic job whose failures are logged
  (once per outage) and counted, and never escape: a Faust app crashes when a
  timer raises, and a lag or progress reading is not worth a worker.

Kafka is imported when these are called, never at import time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from streams.kernel import kafka_outage

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    from streams.kernel.settings import KafkaSettings

log = logging.getLogger(__name__)

TIMER_ERRORS = Counter(
    "zapstream_timer_errors_total",
    "Runs of a periodic job (lag monitor, sink progress, controls reader) that failed; "
    "the job runs again at its next tick",
    ["job"],
)


def group_less_consumer(kafka: KafkaSettings, client_id: str, **config: Any) -> AIOKafkaConsumer:
    """An ``AIOKafkaConsumer`` outside any group: assigned by hand, commits nothing.

    Not started: ``await consumer.start()``. It connects as ``kafka`` says (brokers,
    TLS, SASL); ``config`` adds to (or overrides) aiokafka's options, e.g.
    ``auto_offset_reset`` or ``fetch_max_wait_ms``.
    """
    from aiokafka import AIOKafkaConsumer

    options: dict[str, Any] = {
        "group_id": None,
        "enable_auto_commit": False,
        # Never an aborted transaction's records (the relay's exactly-once); end offsets
        # are then the last stable offset, what a read_committed group can reach.
        "isolation_level": kafka.consumer_isolation_level,
        **config,
    }
    return AIOKafkaConsumer(
        client_id=client_id, **kafka.client_options(), **{**kafka.deadline_options(), **options}
    )


def admin_client(kafka: KafkaSettings, client_id: str) -> AIOKafkaAdminClient:
    """An ``AIOKafkaAdminClient`` (not started) for a group's committed offsets."""
    from aiokafka.admin import AIOKafkaAdminClient

    return AIOKafkaAdminClient(
        client_id=client_id, **kafka.client_options(), **kafka.deadline_options()
    )


def is_transient(exc: BaseException) -> bool:
    """Kafka away or slow: the next tick may succeed. Anything else is a bug worth a traceback."""
    from aiokafka.errors import KafkaError

    return isinstance(exc, KafkaError | OSError | TimeoutError)


FLAP_WINDOW_S = 60.0
"""A job failing again (transiently) this soon after its "reading again" line continues
that outage: counted, no new line (one broker of a cluster down makes a reader's
client meet it now and then while the others answer)."""


class _OutageLog:
    """One log line when a job starts failing, one when it recovers.

    A Kafka outage shows several faces in a row (a request timeout, then no metadata,
    then a refused bootstrap): one outage, one line. A bug (not transient) is logged
    with its traceback whenever it replaces another failure.
    """

    def __init__(self, job: str, logger: logging.Logger) -> None:
        self.job = job
        self.log = logger
        self.failing: type[BaseException] | None = None
        self._failing_transient = False
        self._silent = False
        """Failing without a line: within the process's Kafka outage (its own line said
        it), or again soon after reading again (flapping)."""
        self._read_again_at: float | None = None

    def _flapping(self) -> bool:
        at = self._read_again_at
        return at is not None and time.monotonic() - at < FLAP_WINDOW_S

    def failed(self, exc: Exception) -> None:
        TIMER_ERRORS.labels(self.job).inc()
        transient = is_transient(exc)
        if transient and (self.failing is None or self._silent):
            if kafka_outage.reported() or self._flapping():
                # The process's Kafka outage line (streams/kernel/kafka_outage.py), or this job's
                # own a moment ago, says it: counted here, not logged again.
                self.failing, self._failing_transient, self._silent = type(exc), True, True
                return
        if self._silent:
            # Still failing once the process's outage ended, or for another reason: say it.
            self.failing, self._failing_transient, self._silent = None, False, False
        if self.failing is type(exc) or (transient and self._failing_transient):
            return
        self.failing = type(exc)
        self._failing_transient = transient
        if transient:
            self.log.warning("%s: cannot read Kafka (%s); retrying", self.job, exc or type(exc))
        else:
            self.log.exception("%s failed; it runs again at its next tick", self.job)

    def succeeded(self) -> None:
        if self.failing is not None:
            silent = self._silent
            self.failing, self._failing_transient, self._silent = None, False, False
            if not silent:
                self._read_again_at = time.monotonic()
                self.log.warning("%s: reading again", self.job)


def guarded(
    job: str, fn: Callable[[], Awaitable[object]], logger: logging.Logger = log
) -> Callable[[], Awaitable[None]]:
    """``fn`` that never raises (cancellation apart): for a Faust ``app.timer``.

    A failure is counted in ``zapstream_timer_errors_total{job}`` and logged once
    per outage (a traceback unless it is Kafka or the network being away).
    """
    outage = _OutageLog(job, logger)

    async def run() -> None:
        try:
            await fn()
        except Exception as exc:  # noqa: BLE001 - a timer must never crash its process
            outage.failed(exc)
        else:
            outage.succeeded()

    run.__name__ = run.__qualname__ = job.replace(" ", "_").replace("-", "_")
    return run


class Every:
    """Runs ``fn`` now and then every ``interval_s`` in a task of its own, until stopped.

    A failure is logged once per outage and counted (as by :func:`guarded`), and
    the next run waits ``max(interval_s, retry_s)``, doubling with each failure in a
    row up to ``max_retry_s`` (never under ``interval_s``). An interval of 0 runs
    ``fn`` back to back (``fn`` then waits on its own, e.g. a poll with a timeout).
    """

    def __init__(
        self,
        job: str,
        interval_s: float,
        fn: Callable[[], Awaitable[object]],
        *,
        retry_s: float = 1.0,
        max_retry_s: float = 30.0,
        logger: logging.Logger = log,
    ) -> None:
        self.job = job
        self.interval_s = interval_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.failures = 0
        """Failed runs in a row."""
        self._outage = _OutageLog(job, logger)
        self._fn = fn
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=self.job)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> Every:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def retry_delay(self, failures: int) -> float:
        """The wait after ``failures`` failed runs in a row (capped exponential backoff)."""
        first = max(self.interval_s, self.retry_s)
        cap = max(self.max_retry_s, self.interval_s)
        return float(min(first * 2 ** min(failures - 1, 32), cap))

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self._fn()
            except Exception as exc:  # noqa: BLE001 - a timer must never crash its process
                self._outage.failed(exc)
                self.failures += 1
                wait = self.retry_delay(self.failures)
            else:
                self._outage.succeeded()
                self.failures = 0
                wait = self.interval_s
            # Ticks keep their rhythm: a slow run shortens the wait, never stacks up.
            await asyncio.sleep(max(wait - (loop.time() - started), 0.0))
