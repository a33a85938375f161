"""Pipeline gauges read from PostgreSQL on a timer and exported by ``zapstream sink``.

Every ``ZAPSTREAM_SINK_PIPELINE_METRICS_INTERVAL_S`` (15 s) :class:`PipelineGauges`
reads, on a connection of its own (so it never waits behind, or holds up, the
sink's state writes):

- ``zapstream_jobs{state}``: ``outbox_jobs`` rows per status, every status present;
- ``zapstream_oldest_pending_seconds{instance,purpose}``: the age of the oldest
  PENDING job per instance and purpose (``''`` when the job has none); a series
  disappears when its instance and purpose have nothing pending;
- ``zapstream_oldest_pending_max_seconds``: the largest of those (0 when none).

The ages are computed when Prometheus scrapes, from the last read plus the time
since, so they keep growing while PostgreSQL cannot be read (the oldest job may
have left meanwhile: an age is an upper bound for at most one interval).

A failed read never stops the sink: it is counted, logged once when the outage
starts and once when it ends, and tried again at the next tick; the gauges keep
their last values and ``zapstream_pipeline_metrics_last_success_timestamp_seconds``
tells how old they are. The queries are in :mod:`connectors.ops.pipeline_sql`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from connectors.ops.config_errors import error_detail
from connectors.ops.pipeline_sql import job_counts, pending_groups
from connectors.sink import metrics
from streams.kernel.postgres import ReopeningConnection, postgres_deadline
from streams.kernel.runtime.outage import OutageLog
from streams.kernel.settings import PostgresSettings

__all__ = ["PipelineGauges"]

log = logging.getLogger(__name__)

_EXPECTED = (psycopg.Error, OSError, TimeoutError)


class PipelineGauges:
    """Reads the pipeline gauges every ``interval_s`` until :meth:`stop`.

    :meth:`refresh` is one read (it raises when PostgreSQL cannot answer);
    :meth:`start` runs it on a timer that survives every failure.
    """

    def __init__(
        self,
        postgres: PostgresSettings,
        *,
        interval_s: float,
        connect_timeout_s: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._postgres = postgres
        self._interval_s = interval_s
        self._connect_timeout_s = connect_timeout_s
        self._clock = clock
        self._conn = ReopeningConnection(self._open)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._ages: dict[tuple[str, str], float] = {}
        self._read_at = clock()
        self._outage = OutageLog(
            "pipeline gauges (PostgreSQL)",
            log,
            retrying=f"reading again every {interval_s:g}s, the gauges keep their last values",
        )
        self.reads = 0

    async def __aenter__(self) -> PipelineGauges:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the timer (the first read happens at once)."""
        if self._task is not None:
            return
        self._stopping.clear()
        metrics.OLDEST_PENDING_MAX.set_function(self._max_age)
        self._task = asyncio.create_task(self._run(), name="zapstream-pipeline-gauges")

    async def stop(self) -> None:
        """Stop the timer and close the connection; idempotent."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._conn.drop()

    async def refresh(self) -> None:
        """Read the gauges once; raises what PostgreSQL raised (the gauges keep their values)."""
        started = self._clock()
        conn = await self._conn.get()
        async with postgres_deadline(self._postgres.query_timeout_s, "the gauges' read", conn):
            counts = await job_counts(conn)
            groups = await pending_groups(conn)
        read_at = self._clock()
        for state, count in counts.items():
            metrics.JOBS.labels(state).set(count)
        ages = {(g.instance_id, g.purpose): g.oldest_age_s for g in groups}
        for gone in self._ages.keys() - ages.keys():
            with contextlib.suppress(KeyError):
                metrics.OLDEST_PENDING.remove(*gone)
        for key in ages:
            # Every time, not only for new series: a child may still call another reader.
            metrics.OLDEST_PENDING.labels(*key).set_function(self._age_of(key))
        self._ages, self._read_at = ages, read_at
        metrics.PIPELINE_READ_SECONDS.set(read_at - started)
        metrics.PIPELINE_READ_TIMESTAMP.set(time.time())
        self.reads += 1

    def oldest_pending_s(self) -> dict[tuple[str, str], float]:
        """The ages the gauges show now, by (instance, purpose)."""
        return {key: self._age_of(key)() for key in self._ages}

    # --- the timer -------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - a gauge must never stop the sink
                metrics.PIPELINE_READ_FAILURES.inc()
                await self._conn.drop()
                starting = not self._outage.ongoing
                self._outage.failed(error_detail(exc))
                if starting and not isinstance(exc, _EXPECTED):
                    log.error("pipeline gauges: unexpected failure (a bug?)", exc_info=exc)
            else:
                self._outage.recovered()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)

    def _age_of(self, key: tuple[str, str]) -> Callable[[], float]:
        def age() -> float:
            base = self._ages.get(key)
            return 0.0 if base is None else base + max(0.0, self._clock() - self._read_at)

        return age

    def _max_age(self) -> float:
        if not self._ages:
            return 0.0
        return max(self._ages.values()) + max(0.0, self._clock() - self._read_at)

    # --- the connection ---------------------------------------------------------------------

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        # A read never runs longer than its interval; JIT only slows these small plans.
        timeout_ms = max(1000, int(self._interval_s * 1000))
        return await psycopg.AsyncConnection.connect(
            self._postgres.dsn,
            autocommit=True,
            connect_timeout=self._connect_timeout_s,
            options=f"-c statement_timeout={timeout_ms} -c jit=off",
            application_name="zapstream-sink-gauges",
        )
