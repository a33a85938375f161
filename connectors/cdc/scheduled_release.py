"""The release of scheduled jobs: due ``SCHEDULED`` rows become the relay's intents.

A job inserted with ``next_retry_at`` in the future (``enqueue(..., send_at=...)``,
or plain SQL as the outbox article does) is marked ``SCHEDULED`` by migration 0008's
trigger, and the relay publishes nothing for it
(:func:`~connectors.cdc.outbox_rows.waits_for_release`): until it is due it costs a
row and an index entry in PostgreSQL, nothing in Kafka or in the worker. A bulk job
the worker held for the recipient's quiet hours is ``SCHEDULED`` too (its
``next_retry_at`` the window's end, written by the state sink).

:class:`ScheduledRelease` runs in the relay process, beside the stream, on an
ordinary connection of its own, and only while this relay streams the slot (a
standby releases nothing, so two relays never race). Every
``ZAPSTREAM_RELAY_RELEASE_INTERVAL_S`` it releases a batch of at most
``ZAPSTREAM_RELAY_RELEASE_BATCH`` due jobs, ONE transaction
(:data:`RELEASE_SQL`, migration 0008's ``zapstream_release_due``): the jobs move
``SCHEDULED`` -> ``PENDING`` and their copies go into ``outbox_replays`` (migration
0005), which the relay streams as each job's own ``IntentCaptured``. So a release is
crash-safe by construction (both or neither), and a released job goes through the
relay's rules, the priority topics, the worker's pacing, expiry and cancel like any
job; the worker has never seen the job, so the replay is not a duplicate to it.

- Order: a batch takes due jobs in ``(next_retry_at, id)`` order and inserts their
  copies in that order; within a conversation the worker keeps Kafka's order.
- Cancelled: a job with a cancel command is never released (its cancel reaches the
  worker, which settles it CANCELLED without it ever having been an intent).
- Locked rows (an application rescheduling the job right now) are skipped and
  released at a later tick (``SKIP LOCKED``): the release never waits on a
  transaction it does not own.
- Expired: a job due after its ``expires_at`` is released like any other; the
  worker settles it EXPIRED before any attempt, never sent.

The bound: a job is released no earlier than its ``next_retry_at`` (PostgreSQL's
clock decides) and, while a relay streams, at most one interval plus one release
transaction after it when fewer than a batch are due at once (a larger crowd enters
at a batch per interval, in due order, and an instance with two batches released and
not yet attempted gets no more until the worker caught up); then it is sent as its
instance's pacing allows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from prometheus_client import Counter

from connectors.cdc.failures import OutageLog, classify_exception
from connectors.cdc.settings import RelaySettings
from streams.kernel.postgres import ReopeningConnection, postgres_deadline
from streams.kernel.runtime.periodic import Periodic
from streams.kernel.runtime.service import Service

log = logging.getLogger(__name__)

RELEASED = Counter(
    "zapstream_relay_scheduled_released_total",
    "Scheduled jobs (next_retry_at, send_at, quiet hours) released by the active relay "
    "into outbox_replays, to be streamed as intents",
)

RELEASE_SQL = "SELECT zapstream_release_due(%(batch)s)"
"""One batch: migration 0008's ``zapstream_release_due`` (SECURITY DEFINER, so the relay's
role needs only EXECUTE on it): due jobs become PENDING and their copies are streamed from
``outbox_replays``, in one transaction, by the partial index ``outbox_jobs_scheduled_idx``."""


@dataclasses.dataclass(slots=True)
class ReleaseStats:
    """What this process released."""

    released: int = 0
    batches: int = 0


async def release_due(conn: psycopg.AsyncConnection[Any], *, batch: int) -> int:
    """Release at most ``batch`` due jobs in one transaction; return how many."""
    async with conn.transaction():
        cursor = await conn.execute(RELEASE_SQL, {"batch": batch})
        row = await cursor.fetchone()
        return int(row[0]) if row and row[0] is not None else 0


class ScheduledRelease(Service):
    """Releases due scheduled jobs while ``streaming()`` (see the module docstring).

    ``connect`` opens the connection (default: a psycopg connection to ``dsn``; tests
    may inject one). ``interval_s`` 0 switches the release off (a deployment that runs
    it elsewhere, or none: scheduled jobs then wait).
    """

    name = "scheduled release"

    def __init__(
        self,
        dsn: str,
        *,
        interval_s: float,
        batch: int,
        streaming: Callable[[], bool],
        query_timeout_s: float = 45.0,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]] | None = None,
    ) -> None:
        super().__init__()
        self._dsn = dsn
        self._batch = batch
        self._streaming = streaming
        self._query_timeout_s = query_timeout_s
        self._connect = connect or self._connect_dsn
        self._conn = ReopeningConnection(self._open)
        self.outage = OutageLog(
            "PostgreSQL (scheduled release)", log, retrying="retrying each tick"
        )
        self.stats = ReleaseStats()
        if interval_s > 0:
            self.add_child(Periodic("relay scheduled release", interval_s, self.tick, logger=log))

    @classmethod
    def of_relay(
        cls, settings: RelaySettings, *, streaming: Callable[[], bool]
    ) -> ScheduledRelease:
        """The release of the relay configured by ``settings``."""
        return cls(
            settings.postgres.service_dsn,
            interval_s=settings.release_interval_s,
            batch=settings.release_batch,
            streaming=streaming,
            query_timeout_s=settings.postgres.query_timeout_s,
        )

    async def stop(self) -> None:
        await super().stop()
        await self._conn.drop()

    async def tick(self) -> int:
        """Release one batch of what is due (nothing unless streaming).

        One batch a tick, never all that is due, and nothing more for an instance that
        has two batches released and not yet attempted: a million jobs due at once enter
        the stream as fast as pacing sends them (at most ``batch`` per interval), not as a
        flood ahead of operational rows in the relay's WAL order and the worker's intake."""
        if not self._streaming() or self.stop_requested:
            return 0
        return await self.release_once() or 0

    async def release_once(self) -> int | None:
        """One batch (one transaction); None if PostgreSQL could not be reached."""
        try:
            conn = await self._conn.get()
            async with postgres_deadline(self._query_timeout_s, "the scheduled release", conn):
                count = await release_due(conn, batch=self._batch)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            self.outage.failed(classify_exception(exc).problem)
            await self._conn.drop()
            return None
        self.outage.recovered()
        if count:
            self.stats.released += count
            self.stats.batches += 1
            RELEASED.inc(count)
        return count

    def summary(self) -> str:
        return f"{self.stats.released} scheduled jobs released in {self.stats.batches} batches"

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        async with asyncio.timeout(max(5.0, self._query_timeout_s)):
            return await self._connect()

    async def _connect_dsn(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, application_name="zapstream-relay-release"
        )
