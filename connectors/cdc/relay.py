"""The CDC relay: outbox rows from PostgreSQL logical replication into Kafka.

``zapstream relay`` runs one :class:`OutboxRelay`. It

1. makes sure the publication (inserts only, so state write-back into
   ``outbox_jobs`` never echoes into the stream) and the pgoutput slot exist
   (see :mod:`connectors.cdc.provisioning`);
2. streams the slot with ``START_REPLICATION`` (see :mod:`connectors.cdc.replication_stream`;
   the relay sees it only as a :class:`~connectors.cdc.source.ReplicationSource`);
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
flight (bounded by ``drain_timeout_s``), confirm it, close. If Kafka refuses
or cancels a record, the relay confirms nothing past it, stops and
:meth:`OutboxRelay.run` raises :class:`RelayError`; the restarted relay replays
from the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaProducer

from connectors.cdc.acks import AckOrderError, AckTracker
from connectors.cdc.lsn import Lsn
from connectors.cdc.outbox_rows import command_row_to_record, row_to_record
from connectors.cdc.pgoutput import Begin, Commit, Insert, PgOutputDecoder
from connectors.cdc.provisioning import OUTBOX_TABLE, PUBLISHED_TABLES, ensure_replication
from connectors.cdc.replication_messages import PrimaryKeepalive, XLogData
from connectors.cdc.replication_stream import (
    ReplicationError,
    ReplicationStream,
    ReplicationStreamClosed,
    SlotInUse,
)
from connectors.cdc.settings import RelaySettings
from connectors.cdc.source import ReplicationSource
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


class RelayError(RuntimeError):
    """The relay cannot go on safely (Kafka refused a record, the slot went missing)."""


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
    """Streams outbox inserts into Kafka, confirming only what Kafka acknowledged.

    The collaborators default to production ones and can be injected (tests do):
    ``producer`` (an :class:`AIOKafkaProducer` or anything with its
    ``start``/``stop``/``send``/``flush``), ``source_factory`` (a new
    :class:`~connectors.cdc.source.ReplicationSource` per connection attempt) and
    ``provision`` (makes sure the publication and slot exist, returns the slot's
    confirmed LSN).
    """

    def __init__(
        self,
        settings: RelaySettings,
        producer: AIOKafkaProducer | None = None,
        *,
        source_factory: Callable[[], ReplicationSource] | None = None,
        provision: Callable[[], Awaitable[Lsn]] | None = None,
    ) -> None:
        self.settings = settings
        self._producer = producer or build_producer(settings)
        self._new_source = source_factory or self._replication_stream
        self._provision = provision or self._ensure_replication
        self._stopping = asyncio.Event()
        self._failure: BaseException | None = None
        self._stats = RelayStats()
        self._tracker: AckTracker | None = None
        self._reported = Lsn(0)
        # Sends Kafka has not answered yet, so the drain can wait for their callbacks.
        self._in_flight: set[asyncio.Future[Any]] = set()
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
        # Wake a send blocked on backpressure so it sees the stop.
        self._room.set()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.request_stop()
        if self._started:
            await self._producer.stop()

    def _replication_stream(self) -> ReplicationSource:
        s = self.settings
        return ReplicationStream(s.postgres.dsn, slot=s.slot, publication=s.publication)

    async def _ensure_replication(self) -> Lsn:
        s = self.settings
        return await asyncio.to_thread(
            ensure_replication, s.postgres.dsn, slot=s.slot, publication=s.publication
        )

    async def run(self) -> None:
        """Stream until :meth:`request_stop`; wait as a standby while another relay has the slot.

        Raises :class:`RelayError` once Kafka refused or cancelled a record.
        """
        s = self.settings
        confirmed = await self._provision()
        announced_standby = False
        while not self._stopping.is_set():
            source = self._new_source()
            try:
                await source.start(Lsn(0))
            except SlotInUse:
                await source.close()
                if not announced_standby:
                    log.info("relay standby: slot %s is streamed by another relay; waiting", s.slot)
                    announced_standby = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), s.standby_retry_s)
                continue
            announced_standby = False
            try:
                confirmed = await self._stream(source, confirmed)
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
                await source.close()
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

    async def _stream(self, source: ReplicationSource, confirmed: Lsn) -> Lsn:
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
            message = await source.read(timeout_s=s.status_interval_s)
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
                    await self._report(source, force=True)
            now = time.monotonic()
            if now >= next_status:
                await self._report(source)
                next_status = now + s.status_interval_s
        await self._drain(source)
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
            if self._stopping.is_set() or self._failure is not None:
                # Leave the row unsent: its transaction stays open in the tracker,
                # so nothing at or past it is confirmed, and the slot replays it.
                return
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
        self._in_flight.add(future)
        # Bind this connection's tracker: after a reconnect, late acks of the old
        # connection's records must not count against the new tracker.
        future.add_done_callback(lambda f: self._on_ack(f, tracker, txn))

    def _on_ack(self, future: asyncio.Future[Any], tracker: AckTracker, txn: Any) -> None:
        self._in_flight.discard(future)
        # exception() raises CancelledError on a cancelled future: ask cancelled() first.
        if future.cancelled():
            failure: BaseException | None = RelayError("Kafka send was cancelled")
        else:
            failure = future.exception()
        if failure is None:
            try:
                tracker.record_acked(txn)
            except AckOrderError as exc:
                failure = exc
        if failure is not None:
            # Never confirm past a record Kafka did not take: its transaction keeps
            # an outstanding record in the tracker forever. Stop; restart from the slot.
            self._fail(failure)
            return
        self._stats.acked += 1
        if tracker.records_outstanding < self.settings.max_in_flight:
            self._room.set()

    def _fail(self, failure: BaseException) -> None:
        log.error("a record was not acknowledged; stopping without confirming it: %r", failure)
        if self._failure is None:
            self._failure = failure
        self.request_stop()

    async def _report(self, source: ReplicationSource, *, force: bool = False) -> None:
        tracker = self._tracker
        assert tracker is not None
        confirmed = tracker.confirmed
        if confirmed < self._reported:
            raise RelayError(f"confirmed LSN would move back from {self._reported} to {confirmed}")
        if confirmed > self._reported or force:
            await source.send_status(flush=confirmed)
            self._reported = confirmed

    async def _drain(self, source: ReplicationSource) -> None:
        """Wait (bounded) for Kafka to acknowledge what is in flight, then confirm it."""
        if self._failure is not None:
            return
        try:
            async with asyncio.timeout(self.settings.drain_timeout_s):
                await self._producer.flush()
                # flush() returns once Kafka answered; the ack callbacks may not
                # have run yet. asyncio.wait never cancels the sends themselves.
                if self._in_flight:
                    await asyncio.wait(set(self._in_flight))
        except TimeoutError:
            log.warning("drain: Kafka did not acknowledge everything within the bound")
        try:
            await self._report(source, force=True)
        except ReplicationError as exc:
            # The slot keeps the older position; the next relay replays the rest.
            log.warning("drain: could not confirm the final position: %s", exc)
