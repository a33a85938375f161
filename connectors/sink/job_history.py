"""``outbox_jobs`` as the worker's long-term record: a ``JobHistory``.

The worker asks it only about late redeliveries (intents older than the dedup
horizon for jobs its table forgot), so the connection is opened on first use,
not at start: a worker never needs PostgreSQL to send new intents. Every failure
becomes :class:`~streams.kernel.job_history.HistoryUnavailable` (transient or permanent,
classified by :mod:`streams.kernel.failures`); the caller waits and asks again.
It lives beside the state sink: both are the worker side's view of ``outbox_jobs``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from streams.kernel.failures import classify_postgres
from streams.kernel.job_history import HistoricState, HistoryUnavailable
from streams.kernel.postgres import ReopeningConnection
from streams.kernel.settings import PostgresSettings

_STATUS = "SELECT status FROM outbox_jobs WHERE id = %s"
# attempt_seq: the attempts ever made (each began with a move into ATTEMPTING), so a
# reprocess of a forgotten job never reuses an attempt id the gateway saw.
_STATE = (
    "SELECT j.status, j.state_version, j.attempts, j.gateway_job_id, "
    "(SELECT count(*) FROM outbox_job_events e WHERE e.job_id = j.id "
    "AND e.to_status = 'ATTEMPTING' AND e.from_status IS DISTINCT FROM 'ATTEMPTING') "
    "FROM outbox_jobs j WHERE j.id = %s"
)


class PostgresJobHistory:
    """Looks up ``outbox_jobs.status`` over one lazily opened async connection."""

    def __init__(self, settings: PostgresSettings, *, timeout_s: float = 5.0) -> None:
        self._settings = settings
        self._timeout_s = timeout_s
        self._conn = ReopeningConnection(self._open)
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Nothing to do: the connection opens on the first lookup."""

    async def stop(self) -> None:
        await self._conn.drop()

    async def status_of(self, job_id: int) -> str | None:
        row = await self._row(_STATUS, job_id)
        return str(row[0]) if row is not None else None

    async def state_of(self, job_id: int) -> HistoricState | None:
        row = await self._row(_STATE, job_id)
        if row is None:
            return None
        status, version, attempts, gateway_job_id, attempt_seq = row
        return HistoricState(
            str(status), int(version), int(attempts), gateway_job_id, int(attempt_seq)
        )

    async def _row(self, query: str, job_id: int) -> tuple[Any, ...] | None:
        async with self._lock:
            try:
                async with asyncio.timeout(self._timeout_s):
                    conn = await self._conn.get()
                    cur = await conn.execute(query, (job_id,))
                    row = await cur.fetchone()
            except psycopg.Error as exc:
                await self._conn.drop()
                if exc.sqlstate is None and not isinstance(exc, psycopg.OperationalError):
                    raise  # a client-side bug, not an outage
                verdict = classify_postgres(exc.sqlstate, str(exc))
                problem = f"{verdict.hint} ({verdict.problem})" if verdict.hint else verdict.problem
                raise HistoryUnavailable(
                    f"outbox_jobs: {problem}", permanent=not verdict.retriable
                ) from exc
            except (TimeoutError, OSError) as exc:
                await self._conn.drop()
                raise HistoryUnavailable(
                    f"outbox_jobs: no answer within {self._timeout_s:.0f}s ({exc!r})"
                ) from exc
        return tuple(row) if row is not None else None

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self._settings.dsn, autocommit=True, connect_timeout=max(1, int(self._timeout_s))
        )
