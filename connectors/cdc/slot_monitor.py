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
  last heartbeat is ``zapstream_relay_heartbeat_last_seconds``;
- every ``checkpoint_interval_s`` while this relay streams the slot, it copies the slot's
  ``confirmed_flush_lsn`` into ``outbox_relay_slots`` (``zapstream_relay_slot_checkpoint``):
  the position a reconnecting relay compares the slot with (:mod:`connectors.cdc.slot_gap`).

A failure (PostgreSQL away, a permission missing) is logged once per outage;
the connection is opened again at the next tick. Nothing here stops the relay: the
timers are runtime :class:`~streams.kernel.runtime.periodic.Periodic` services.
"""

from __future__ import annotations

import asyncio
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
from connectors.cdc.settings import RelaySettings
from streams.kernel.postgres import ReopeningConnection, postgres_deadline
from streams.kernel.runtime.periodic import Periodic
from streams.kernel.runtime.service import Service

log = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "zapstream.heartbeat"
"""The prefix of the relay's logical heartbeat messages (``pg_logical_emit_message``)."""

_SLOT_QUERY = (
    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, active "
    "FROM pg_replication_slots WHERE slot_name = %s"
)
_HEARTBEAT_QUERY = "SELECT pg_logical_emit_message(false, %s, '')"
_CHECKPOINT_QUERY = "SELECT zapstream_relay_slot_checkpoint(%s)"


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


class SlotMonitor(Service):
    """Reads the slot's position for ``/metrics`` and writes heartbeats while ``streaming()``.

    A :class:`~streams.kernel.runtime.service.Service` with two runtime
    :class:`~streams.kernel.runtime.periodic.Periodic` children: the slot read every
    ``interval_s`` and the heartbeat tick every ``heartbeat_interval_s`` (0: no
    heartbeat). ``connect`` opens the connection (default: an autocommit psycopg
    connection to ``dsn``; tests fake it).
    """

    name = "slot monitor"

    def __init__(
        self,
        dsn: str,
        slot: str,
        *,
        interval_s: float,
        heartbeat_interval_s: float,
        streaming: Callable[[], bool],
        checkpoint_interval_s: float = 0.0,
        clock: Callable[[], float] = time.time,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]] | None = None,
        query_timeout_s: float = 45.0,
    ) -> None:
        super().__init__()
        self._dsn = dsn
        self._query_timeout_s = query_timeout_s
        self._connect = connect or self._connect_dsn
        self._slot = slot
        self._interval_s = interval_s
        self._streaming = streaming
        self._clock = clock
        self._conn = ReopeningConnection(self._open)
        # One query at a time on the connection: the two timers share it.
        self._using = asyncio.Lock()
        self.outage = OutageLog("PostgreSQL (slot metrics)", log, retrying="retrying each tick")
        self._slot_missing_logged = False
        self._heartbeat_refused = False
        self._checkpoint_refused = False
        self.checkpoints = 0
        """Slot positions recorded."""
        self.position: SlotPosition | None = None
        """The last position read."""
        self.heartbeats = 0
        """Heartbeat messages written."""
        # read_once and heartbeat_once never raise for PostgreSQL: Periodic sees only bugs.
        self.add_child(Periodic("relay slot metrics", interval_s, self.read_once, logger=log))
        if heartbeat_interval_s:
            self.add_child(
                Periodic("relay heartbeat", heartbeat_interval_s, self._beat, logger=log)
            )
        if checkpoint_interval_s:
            self.add_child(
                Periodic(
                    "relay slot checkpoint", checkpoint_interval_s, self._checkpoint, logger=log
                )
            )

    @classmethod
    def of_relay(cls, settings: RelaySettings, *, streaming: Callable[[], bool]) -> SlotMonitor:
        """The monitor of the relay configured by ``settings`` (its own ordinary connection)."""
        return cls(
            settings.postgres.service_dsn,
            settings.slot,
            query_timeout_s=settings.postgres.query_timeout_s,
            interval_s=settings.slot_metrics_interval_s,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            checkpoint_interval_s=settings.slot_checkpoint_interval_s,
            streaming=streaming,
        )

    async def stop(self) -> None:
        """Stop the timers and close the connection (also one opened by a direct read)."""
        await super().stop()
        await self._conn.drop()

    async def _beat(self) -> None:
        if self._streaming():
            await self.heartbeat_once()

    async def _checkpoint(self) -> None:
        if self._streaming():
            await self.checkpoint_once()

    async def checkpoint_once(self) -> bool:
        """Record the slot's confirmed position in ``outbox_relay_slots``; False if not."""
        if self._checkpoint_refused:
            return False
        try:
            async with self._using:
                conn = await self._conn.get()
                async with postgres_deadline(self._query_timeout_s, "the slot checkpoint", conn):
                    await conn.execute(_CHECKPOINT_QUERY, (self._slot,))
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction) as exc:
            # Permanent until `db migrate` runs: say it once; the gap check still runs.
            log.warning(
                "relay slot checkpoint off: %s; run `zapstream db migrate` (migration 0011)",
                exc,
            )
            self._checkpoint_refused = True
            return False
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self._failed(exc)
            return False
        self.outage.recovered()
        self.checkpoints += 1
        return True

    async def read_once(self) -> SlotPosition | None:
        """Read the slot's position into the gauges; None if it could not be read."""
        try:
            async with self._using:
                conn = await self._conn.get()
                async with postgres_deadline(self._query_timeout_s, "the slot metrics query", conn):
                    position = await read_slot_position(conn, self._slot)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self._failed(exc)
            return None
        self.outage.recovered()
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
            async with self._using:
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
        self.outage.recovered()
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
        self.outage.failed(classify_exception(exc).problem)
        await self._conn.drop()
