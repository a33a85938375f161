"""The CDC relay: outbox rows from PostgreSQL logical replication into Kafka.

``zapstream relay`` runs one :class:`OutboxRelay`. It

1. makes sure the publication (inserts only, so state write-back into
   ``outbox_jobs`` never echoes into the stream) and the pgoutput slot exist;
2. streams the slot with ``START_REPLICATION`` (see :mod:`connectors.cdc.replication_stream`);
3. turns each inserted row into an ``IntentCaptured`` on ``zapstream.intents``
   keyed by instance and conversation, or an ``IntentRejected`` on
   ``zapstream.invalid`` with the reason;
4. confirms to PostgreSQL only the end LSN of transactions whose records Kafka
   acknowledged, through :class:`~connectors.cdc.acks.AckTracker`.

Killed at any point, a restarted relay resumes from the slot's confirmed
position: nothing is lost, and transactions produced but not yet confirmed are
produced again (the worker drops the duplicates). PostgreSQL lets one consumer
stream a slot at a time, so a second relay waits as a hot standby, retrying
every ``standby_retry_s``, and takes over when the first one's connection ends.
SIGTERM drains: stop reading WAL, wait for Kafka to acknowledge what is in
flight (bounded by ``drain_timeout_s``), confirm it, close.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

import psycopg
from aiokafka import AIOKafkaProducer
from psycopg import errors as pg_errors
from psycopg import sql

from connectors.cdc.acks import AckTracker
from connectors.cdc.lsn import Lsn
from connectors.cdc.outbox_rows import command_row_to_record, row_to_record
from connectors.cdc.pgoutput import Begin, Commit, Insert, PgOutputDecoder
from connectors.cdc.replication_messages import PrimaryKeepalive, XLogData
from connectors.cdc.replication_stream import (
    ReplicationError,
    ReplicationStream,
    ReplicationStreamClosed,
    SlotInUse,
)
from connectors.cdc.settings import RelaySettings
from streams.contract import (
    HEADER_JOB_ID,
    HEADER_LSN,
    HEADER_SCHEMA,
    INTENTS,
    INVALID,
    CommandRequested,
    IntentCaptured,
)

log = logging.getLogger(__name__)

OUTBOX_TABLE = "outbox_jobs"
COMMANDS_TABLE = "outbox_commands"
PUBLISHED_TABLES = (OUTBOX_TABLE, COMMANDS_TABLE)


class RelayError(RuntimeError):
    """The relay cannot go on safely (Kafka refused a record, the slot went missing)."""


def ensure_replication(dsn: str, *, slot: str, publication: str) -> Lsn:
    """Create the insert-only publication and the pgoutput slot if missing.

    The publication covers ``outbox_jobs`` and ``outbox_commands``; a publication
    from an older version gets the missing table added. Returns the slot's
    confirmed position. Safe to run from several relays at once.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)
        ).fetchone()
        if not exists:
            with contextlib.suppress(pg_errors.DuplicateObject):
                conn.execute(
                    sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')").format(
                        sql.Identifier(publication),
                        sql.SQL(", ").join(sql.Identifier(t) for t in PUBLISHED_TABLES),
                    )
                )
        published = {
            str(name)
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (publication,)
            )
        }
        for table in PUBLISHED_TABLES:
            if table not in published:
                with contextlib.suppress(pg_errors.DuplicateObject):
                    conn.execute(
                        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                            sql.Identifier(publication), sql.Identifier(table)
                        )
                    )
        row = conn.execute(
            "SELECT plugin, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        if row is None:
            with contextlib.suppress(pg_errors.DuplicateObject):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            row = conn.execute(
                "SELECT plugin, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            ).fetchone()
        assert row is not None
        plugin, confirmed = row
        if plugin != "pgoutput":
            raise RelayError(f"slot {slot!r} uses plugin {plugin!r}, not pgoutput")
        return Lsn.parse(str(confirmed)) if confirmed else Lsn(0)


@dataclasses.dataclass(slots=True)
class RelayStats:
    """What one relay process did, for its closing summary line."""

    transactions: int = 0
    intents: int = 0
    rejected: int = 0
    acked: int = 0
    started: float = dataclasses.field(default_factory=time.monotonic)


def build_producer(settings: RelaySettings) -> AIOKafkaProducer:
    kafka = settings.kafka
    return AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        client_id="zapstream-relay",
        acks="all",
        enable_idempotence=kafka.use_idempotent_producer,
        linger_ms=5,
        max_batch_size=256 * 1024,
        request_timeout_ms=30_000,
    )


class OutboxRelay:
    """Streams outbox inserts into Kafka, confirming only what Kafka acknowledged."""

    def __init__(self, settings: RelaySettings, producer: AIOKafkaProducer | None = None) -> None:
        self.settings = settings
        self._producer = producer or build_producer(settings)
        self._stopping = asyncio.Event()
        self._failure: BaseException | None = None
        self._stats = RelayStats()
        self._tracker: AckTracker | None = None
        self._reported = Lsn(0)
        self._room = asyncio.Event()
        self._room.set()
        self._started = False
        self._stopped = False

    @property
    def stats(self) -> RelayStats:
        return self._stats

    @property
    def confirmed(self) -> Lsn:
        return self._reported

    async def __aenter__(self) -> OutboxRelay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if not self._started:
            await self._producer.start()
            self._started = True

    def request_stop(self) -> None:
        """Ask :meth:`run` to drain and return (signal handlers call this)."""
        self._stopping.set()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        if self._started:
            await self._producer.stop()

    async def run(self) -> None:
        """Stream until :meth:`request_stop`; wait as a standby while another relay has the slot."""
        s = self.settings
        dsn = s.postgres.dsn
        confirmed = await asyncio.to_thread(
            ensure_replication, dsn, slot=s.slot, publication=s.publication
        )
        announced_standby = False
        while not self._stopping.is_set():
            stream = ReplicationStream(dsn, slot=s.slot, publication=s.publication)
            try:
                await stream.start(Lsn(0))
            except SlotInUse:
                await stream.close()
                if not announced_standby:
                    log.info("relay standby: slot %s is streamed by another relay; waiting", s.slot)
                    announced_standby = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), s.standby_retry_s)
                continue
            announced_standby = False
            try:
                confirmed = await self._stream(stream, confirmed)
            except ReplicationStreamClosed as exc:
                if not exc.retriable:
                    raise
                # PostgreSQL restarted or the connection dropped: what Kafka acknowledged
                # but PostgreSQL did not hear about is replayed from the slot (duplicates
                # the worker drops), nothing is skipped.
                log.warning("replication connection lost (%s); reconnecting", exc)
                await self._producer.flush()
                confirmed = self._reported
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), s.standby_retry_s)
            finally:
                await stream.close()
            if self._failure is not None:
                raise RelayError("Kafka did not acknowledge a record") from self._failure
        log.info(
            "relay stopped: %d transactions, %d intents, %d rejected, confirmed %s, %.1fs",
            self._stats.transactions,
            self._stats.intents,
            self._stats.rejected,
            self._reported,
            time.monotonic() - self._stats.started,
        )

    async def _stream(self, stream: ReplicationStream, confirmed: Lsn) -> Lsn:
        s = self.settings
        tracker = AckTracker(confirmed)
        self._tracker = tracker
        self._reported = max(self._reported, confirmed)
        decoder = PgOutputDecoder()
        log.info("relay streaming slot %s from %s", s.slot, confirmed)
        txn: Any = None
        committed_at: str | None = None
        lsn_text = str(confirmed)
        next_status = time.monotonic() + s.status_interval_s
        while not self._stopping.is_set() and self._failure is None:
            message = await stream.read(timeout_s=s.status_interval_s)
            if isinstance(message, XLogData):
                decoded = decoder.decode(message.payload)
                if isinstance(decoded, Begin):
                    txn = tracker.begin()
                    committed_at = decoded.commit_ts.isoformat()
                    lsn_text = str(decoded.final_lsn)
                elif isinstance(decoded, Insert):
                    if decoded.relation.name in PUBLISHED_TABLES:
                        await self._produce(
                            txn, decoded.relation.name, decoded.new, lsn_text, committed_at
                        )
                elif isinstance(decoded, Commit):
                    tracker.commit(txn, decoded.end_lsn)
                    self._stats.transactions += 1
                    txn = None
            elif isinstance(message, PrimaryKeepalive):
                tracker.keepalive(message.wal_end)
                if message.reply_requested:
                    await self._report(stream, force=True)
            now = time.monotonic()
            if now >= next_status:
                await self._report(stream)
                next_status = now + s.status_interval_s
        await self._drain(stream)
        return tracker.confirmed

    async def _produce(
        self,
        txn: Any,
        table: str,
        row: dict[str, str | None],
        lsn: str,
        committed_at: str | None,
    ) -> None:
        tracker = self._tracker
        assert tracker is not None
        while tracker.records_outstanding >= self.settings.max_in_flight:
            self._room.clear()
            await self._room.wait()
        convert = row_to_record if table == OUTBOX_TABLE else command_row_to_record
        record = convert(row, lsn=lsn, committed_at=committed_at)
        if isinstance(record, IntentCaptured | CommandRequested):
            topic, key = INTENTS, record.partition_key
            self._stats.intents += 1
        else:
            topic, key = INVALID, str(record.job_id).encode()
            self._stats.rejected += 1
            log.warning("%s row for job %s rejected: %s", table, record.job_id, record.reason)
        headers = [
            (HEADER_SCHEMA, record.SCHEMA.encode()),
            (HEADER_LSN, lsn.encode()),
            (HEADER_JOB_ID, str(record.job_id).encode()),
        ]
        tracker.record_sent(txn)
        future = await self._producer.send(topic, record.dumps(), key=key, headers=headers)
        future.add_done_callback(lambda f: self._on_ack(f, txn))

    def _on_ack(self, future: asyncio.Future[Any], txn: Any) -> None:
        tracker = self._tracker
        if future.cancelled() or future.exception() is not None:
            # Never confirm past a record Kafka did not take: stop, restart from the slot.
            self._failure = future.exception() or RelayError("send cancelled")
            log.error("Kafka did not acknowledge a record: %r", self._failure)
            self._stopping.set()
            self._room.set()
            return
        assert tracker is not None
        tracker.record_acked(txn)
        self._stats.acked += 1
        if tracker.records_outstanding < self.settings.max_in_flight:
            self._room.set()

    async def _report(self, stream: ReplicationStream, *, force: bool = False) -> None:
        tracker = self._tracker
        assert tracker is not None
        confirmed = tracker.confirmed
        if confirmed < self._reported:
            raise RelayError(f"confirmed LSN would move back from {self._reported} to {confirmed}")
        if confirmed > self._reported or force:
            await stream.send_status(flush=confirmed)
            self._reported = confirmed

    async def _drain(self, stream: ReplicationStream) -> None:
        """Wait (bounded) for Kafka to acknowledge what is in flight, then confirm it."""
        if self._failure is not None:
            return
        try:
            await asyncio.wait_for(self._producer.flush(), self.settings.drain_timeout_s)
        except TimeoutError:
            log.warning("drain: Kafka did not acknowledge everything within the bound")
        try:
            await self._report(stream, force=True)
        except ReplicationError as exc:
            # The slot keeps the older position; the next relay replays the rest.
            log.warning("drain: could not confirm the final position: %s", exc)
