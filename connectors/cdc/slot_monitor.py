"""The relay's view of its replication slot from PostgreSQL, and its WAL heartbeat.

:class:`SlotMonitor` runs beside :class:`~connectors.cdc.relay.OutboxRelay` on
an ordinary connection of its own (never the replication connection), so it
keeps working while the relay is a standby, reconnecting or waiting for Kafka:

- every ``slot_metrics_interval_s`` it reads ``pg_replication_slots`` and sets
  ``zapstream_relay_slot_lag_bytes`` (``pg_current_wal_lsn() -
  confirmed_flush_lsn``: grows while no relay confirms) and
  ``zapstream_relay_slot_retained_wal_bytes`` (``pg_current_wal_lsn() -
  restart_lsn``: the WAL the slot keeps on disk);
- every ``heartbeat_interval_s`` while this relay streams the slot, it writes
  ``pg_logical_emit_message(false, 'zapstream.heartbeat', '')``. The message is
  WAL of the slot's own database, so the walsender decodes past it (pgoutput
  does not send it: the relay does not ask for ``messages``) and, once caught
  up, sends a keepalive whose ``wal_end`` lies after it; the relay confirms a
  keepalive position when nothing is outstanding
  (:meth:`~connectors.cdc.acks.AckTracker.keepalive`). So the slot's
  ``confirmed_flush_lsn`` moves on at least once per heartbeat while the
  outbox is idle, whatever else writes WAL (or nothing does), and an alert
  sees the whole path (monitor connection, walsender, relay) alive: the time of the
  last heartbeat is ``zapstream_relay_heartbeat_last_seconds``.

A failure (PostgreSQL away, a permission missing) is logged once per outage;
the connection is opened again at the next tick. Nothing here stops the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from connectors.cdc.failures import OutageLog, classify_exception
from connectors.cdc.metrics import (
    HEARTBEAT_LAST,
    SLOT_LAG,
    SLOT_METRICS_READ,
    SLOT_RETAINED_WAL,
)
from streams.kernel.postgres import ReopeningConnection, postgres_deadline

log = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "zapstream.heartbeat"
"""The prefix of the relay's logical heartbeat messages (``pg_logical_emit_message``)."""

_SLOT_QUERY = (
    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, active "
    "FROM pg_replication_slots WHERE slot_name = %s"
)
_HEARTBEAT_QUERY = "SELECT pg_logical_emit_message(false, %s, '')"


@dataclasses.dataclass(frozen=True, slots=True)
class SlotPosition:
    """How far behind the server's WAL a slot is, in bytes (None: not known yet)."""

    lag_bytes: int | None
    """``pg_current_wal_lsn() - confirmed_flush_lsn``."""
    retained_wal_bytes: int | None
    """``pg_current_wal_lsn() - restart_lsn``."""
    active: bool
    """A walsender streams the slot now."""


async def read_slot_position(conn: psycopg.AsyncConnection[Any], slot: str) -> SlotPosition | None:
    """The slot's lag and retained WAL; None if there is no such slot."""
    cur = await conn.execute(_SLOT_QUERY, (slot,))
    row = await cur.fetchone()
    if row is None:
        return None
    lag, retained, active = row
    return SlotPosition(
        None if lag is None else int(lag),
        None if retained is None else int(retained),
        bool(active),
    )


class SlotMonitor:
    """Reads the slot's position for ``/metrics`` and writes heartbeats while ``streaming()``.

    A service: :meth:`start`, an idempotent :meth:`stop`, ``async with``.
    ``heartbeat_interval_s`` 0 writes no heartbeat. ``connect`` opens the
    connection (default: an autocommit psycopg connection to ``dsn``; tests fake it).
    """

    def __init__(
        self,
        dsn: str,
        slot: str,
        *,
        interval_s: float,
        heartbeat_interval_s: float,
        streaming: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]] | None = None,
        query_timeout_s: float = 45.0,
    ) -> None:
        self._dsn = dsn
        self._query_timeout_s = query_timeout_s
        self._connect = connect or self._connect_dsn
        self._slot = slot
        self._interval_s = interval_s
        self._heartbeat_s = heartbeat_interval_s
        self._streaming = streaming
        self._clock = clock
        self._conn = ReopeningConnection(self._open)
        self._task: asyncio.Task[None] | None = None
        self._outage = OutageLog("PostgreSQL (slot metrics)", log, retrying="retrying each tick")
        self._slot_missing_logged = False
        self._heartbeat_refused = False
        self.position: SlotPosition | None = None
        """The last position read."""
        self.heartbeats = 0
        """Heartbeat messages written."""

    async def __aenter__(self) -> SlotMonitor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="relay-slot-monitor"
            )
            self._task.add_done_callback(_report_death)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._conn.drop()

    async def _run(self) -> None:
        now = time.monotonic()
        next_read = now
        next_beat = now + self._heartbeat_s if self._heartbeat_s else float("inf")
        while True:
            now = time.monotonic()
            if now >= next_read:
                await self.read_once()
                next_read = time.monotonic() + self._interval_s
            if now >= next_beat:
                if self._streaming():
                    await self.heartbeat_once()
                next_beat = time.monotonic() + self._heartbeat_s
            await asyncio.sleep(max(0.0, min(next_read, next_beat) - time.monotonic()))

    async def read_once(self) -> SlotPosition | None:
        """Read the slot's position into the gauges; None if it could not be read."""
        try:
            conn = await self._conn.get()
            async with postgres_deadline(self._query_timeout_s, "the slot metrics query", conn):
                position = await read_slot_position(conn, self._slot)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self._failed(exc)
            return None
        self._outage.recovered()
        if position is None:
            if not self._slot_missing_logged:
                log.warning("slot metrics: replication slot %s does not exist (yet)", self._slot)
                self._slot_missing_logged = True
            return None
        self._slot_missing_logged = False
        self.position = position
        if position.lag_bytes is not None:
            SLOT_LAG.set(position.lag_bytes)
        if position.retained_wal_bytes is not None:
            SLOT_RETAINED_WAL.set(position.retained_wal_bytes)
        SLOT_METRICS_READ.set(self._clock())
        return position

    async def heartbeat_once(self) -> bool:
        """Write one heartbeat message to the WAL; False if it could not be written."""
        if self._heartbeat_refused:
            return False
        try:
            conn = await self._conn.get()
            async with postgres_deadline(self._query_timeout_s, "the heartbeat message", conn):
                await conn.execute(_HEARTBEAT_QUERY, (HEARTBEAT_PREFIX,))
        except psycopg.errors.InsufficientPrivilege as exc:
            # Permanent: say it once and stop trying; the slot metrics go on.
            log.warning(
                "relay heartbeat off: PostgreSQL refused pg_logical_emit_message (%s); grant "
                "EXECUTE on it to the relay's role, or set ZAPSTREAM_RELAY_HEARTBEAT_INTERVAL_S=0",
                exc,
            )
            self._heartbeat_refused = True
            return False
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self._failed(exc)
            return False
        self._outage.recovered()
        self.heartbeats += 1
        HEARTBEAT_LAST.set(self._clock())
        return True

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        async with asyncio.timeout(max(5.0, self._interval_s)):
            return await self._connect()

    async def _connect_dsn(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, application_name="zapstream-relay-monitor"
        )

    async def _failed(self, exc: BaseException) -> None:
        self._outage.failed(classify_exception(exc).problem)
        await self._conn.drop()


def _report_death(task: asyncio.Task[None]) -> None:
    """The monitor must never stop the relay; if it dies of a bug, say so loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.error("slot monitor stopped: %r", task.exception(), exc_info=task.exception())
