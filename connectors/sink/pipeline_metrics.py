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

A failed read never stops the sink: the timer is the runtime's
(:class:`~streams.kernel.runtime.periodic.Periodic`): PostgreSQL away is counted, logged
once when the outage starts and once when it ends, and tried again at the next tick
(anything else is a bug, logged with its traceback); the gauges keep their last values
and ``zapstream_pipeline_metrics_last_success_timestamp_seconds`` tells how old they are.
The queries are in :mod:`connectors.sink.pipeline_sql`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from connectors.sink import metrics
from connectors.sink.pipeline_sql import job_counts, pending_groups
from streams.kernel.failures import classify_postgres
from streams.kernel.postgres import ReopeningConnection, postgres_deadline
from streams.kernel.runtime.periodic import Periodic
from streams.kernel.runtime.service import Service
from streams.kernel.settings import PostgresSettings

__all__ = ["PipelineGauges"]

log = logging.getLogger(__name__)


class PipelineGauges(Service):
    """Reads the pipeline gauges every ``interval_s`` until :meth:`stop`.

    :meth:`refresh` is one read (it raises when PostgreSQL cannot answer);
    :meth:`start` runs it on a timer (a child) that survives every failure.
    """

    name = "pipeline gauges"

    def __init__(
        self,
        postgres: PostgresSettings,
        *,
        interval_s: float,
        connect_timeout_s: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._postgres = postgres
        self._interval_s = interval_s
        self._connect_timeout_s = connect_timeout_s
        self._clock = clock
        self._conn = ReopeningConnection(self._open)
        self._ages: dict[tuple[str, str], float] = {}
        self._read_at = clock()
        self.reads = 0
        # Every interval, failed or not (no backoff): a read is one small query.
        self.add_child(
            Periodic(
                "pipeline gauges (PostgreSQL)",
                interval_s,
                self._read,
                retry_s=interval_s,
                max_retry_s=interval_s,
                logger=log,
                kafka=False,
            )
        )

    async def on_start(self) -> None:
        """Before the timer's first read (at once): the max age is computed at scrape time."""
        metrics.OLDEST_PENDING_MAX.set_function(self._max_age)

    async def on_stop(self) -> None:
        # The timer (a child) stopped first: nothing reads on the connection any more.
        await self._conn.drop()

    def summary(self) -> str:
        return f"{self.reads} reads"

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

    async def _read(self) -> None:
        """One read for the timer: PostgreSQL's failures classified (away: an outage, once)."""
        try:
            await self.refresh()
        except Exception as exc:
            metrics.PIPELINE_READ_FAILURES.inc()
            await self._conn.drop()
            if isinstance(exc, psycopg.Error):
                raise classify_postgres(exc.sqlstate, str(exc)) from exc
            raise

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
