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
flight (bounded by ``drain_timeout_s``), confirm it, close.

Failures are classified once (:mod:`connectors.cdc.failures`):

- PostgreSQL away (connection refused or closed, SQLSTATE 08/53/57...): the
  relay reconnects with capped, jittered backoff for as long as it takes,
  logging the outage once when it starts and once when it ends. A slot found
  missing on reconnect is recreated (rows committed while it was missing need
  ``zapstream outbox restream``; a WARNING says so).
- Kafka away (producer start, or a retriable send error such as a batch that
  expired during the outage): the same backoff; the relay resumes from the
  slot's confirmed position, so what Kafka did not take is produced again.
- A record Kafka cannot take (too large, corrupt): it is replaced by a minimal
  ``IntentRejected`` on ``zapstream.invalid`` (job id, LSN, reason), so one row
  never blocks the slot. Records are also reduced *before* producing when they
  exceed ``max_record_bytes``.
- Permanent (bad credentials, missing database, no replication privilege,
  wal_level not logical, slot with another plugin): :class:`RelayConfigError`
  with one line naming the setting; ``zapstream relay`` exits 2.
- Kafka refusing or cancelling a record in any other way: the relay confirms
  nothing past it and :meth:`OutboxRelay.run` raises :class:`RelayError`; the
  restarted relay replays from the slot.
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
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)

from connectors.cdc.acks import AckOrderError, AckTracker
from connectors.cdc.failures import (
    Backoff,
    OutageLog,
    RelayConfigError,
    classify_exception,
)
from connectors.cdc.lsn import Lsn
from connectors.cdc.outbox_rows import (
    command_row_to_record,
    minimal_rejection,
    reduced_rejection,
    replay_row_to_record,
    row_to_record,
)
from connectors.cdc.pgoutput import Begin, Commit, Insert, PgOutputDecoder
from connectors.cdc.provisioning import (
    COMMANDS_TABLE,
    OUTBOX_TABLE,
    PUBLISHED_TABLES,
    REPLAYS_TABLE,
    ProvisioningError,
    ensure_replication,
)
from connectors.cdc.replication_messages import PrimaryKeepalive, XLogData
from connectors.cdc.replication_stream import (
    ReplicationError,
    ReplicationStream,
    ReplicationStreamClosed,
    SlotInUse,
    SlotNotFound,
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
    IntentRejected,
    Record,
)

log = logging.getLogger(__name__)

_CONVERTERS = {
    OUTBOX_TABLE: row_to_record,
    COMMANDS_TABLE: command_row_to_record,
    REPLAYS_TABLE: replay_row_to_record,
}

PER_RECORD_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
)
"""Kafka refuses this one record, however often it is sent: it becomes a minimal rejection."""


def kafka_transient(exc: BaseException) -> bool:
    """A Kafka failure a later attempt may not meet: brokers away, a batch that expired.

    A batch that expired (``KafkaTimeoutError``) may still have been written:
    replaying it from the slot makes a duplicate the worker drops by job id.
    """
    return isinstance(exc, KafkaTimeoutError) or (isinstance(exc, KafkaError) and exc.retriable)


__all__ = ["OutboxRelay", "RelayConfigError", "RelayError", "RelayStats", "build_producer"]


class RelayError(RuntimeError):
    """The relay cannot go on safely (Kafka refused or cancelled a record)."""


@dataclasses.dataclass(slots=True)
class RelayStats:
    """What one relay process did, for its closing summary line."""

    transactions: int = 0
    intents: int = 0
    rejected: int = 0
    reduced: int = 0
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
        self._pg_outage = OutageLog("PostgreSQL", log)
        self._kafka_outage = OutageLog("Kafka", log)
        # Replacements for records Kafka refused, so the drain waits for them too.
        self._replacements: set[asyncio.Task[None]] = set()

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
        """Start the Kafka producer, retrying with backoff while the brokers are unreachable."""
        if self._started:
            return
        backoff = self._backoff()
        while True:
            try:
                await self._producer.start()
                break
            except KafkaError as exc:
                if not exc.retriable:
                    raise RelayConfigError(
                        f"Kafka refused the relay: {exc!r}; check ZAPSTREAM_KAFKA_BROKERS"
                    ) from exc
                self._kafka_outage.failed(repr(exc))
                if await self._sleep(backoff.next_delay_s()):
                    return
        self._kafka_outage.recovered()
        self._started = True

    def _backoff(self) -> Backoff:
        return Backoff(self.settings.reconnect_initial_s, self.settings.reconnect_max_s)

    async def _sleep(self, delay_s: float) -> bool:
        """Wait ``delay_s`` or until a stop is requested; True if stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay_s)
        return self._stopping.is_set()

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

    async def _provision_until_ready(self, backoff: Backoff) -> Lsn | None:
        """Run provisioning, retrying transient failures; None if a stop came first."""
        while not self._stopping.is_set():
            try:
                confirmed = await self._provision()
            except ProvisioningError as exc:
                raise RelayConfigError(str(exc)) from exc
            except psycopg.Error as exc:
                self._pg_failed(exc)
                if await self._sleep(backoff.next_delay_s()):
                    return None
                continue
            return confirmed
        return None

    def _pg_failed(self, exc: BaseException) -> None:
        """Permanent: raise RelayConfigError. Transient: note the outage (logged once)."""
        verdict = classify_exception(exc)
        if not verdict.retriable:
            raise RelayConfigError(f"PostgreSQL: {verdict.problem}") from exc
        self._pg_outage.failed(verdict.problem)

    async def run(self) -> None:
        """Stream until :meth:`request_stop`; wait as a standby while another relay has the slot.

        Transient PostgreSQL and Kafka failures are waited out. Raises
        :class:`RelayConfigError` for a permanent one and :class:`RelayError`
        once Kafka refused or cancelled a record for good.
        """
        s = self.settings
        backoff = self._backoff()
        provisioned = await self._provision_until_ready(backoff)
        if provisioned is None:
            self._log_summary()
            return
        confirmed = provisioned
        announced_standby = False
        while not self._stopping.is_set():
            source = self._new_source()
            try:
                await source.start(Lsn(0))
            except SlotInUse:
                await source.close()
                self._pg_outage.recovered()
                if not announced_standby:
                    log.info("relay standby: slot %s is streamed by another relay; waiting", s.slot)
                    announced_standby = True
                await self._sleep(s.standby_retry_s)
                continue
            except SlotNotFound:
                await source.close()
                log.warning(
                    "replication slot %s is missing; recreating it. Rows committed while it "
                    "was missing are not streamed: run `zapstream outbox restream --older-than "
                    "<age>` to send them",
                    s.slot,
                )
                provisioned = await self._provision_until_ready(backoff)
                if provisioned is None:
                    break
                confirmed = max(confirmed, provisioned)
                continue
            except ReplicationError as exc:
                await source.close()
                self._pg_failed(exc)
                await self._sleep(backoff.next_delay_s())
                continue
            self._pg_outage.recovered()
            backoff.reset()
            announced_standby = False
            try:
                confirmed = await self._stream(source, confirmed)
            except ReplicationStreamClosed as exc:
                if not exc.retriable:
                    raise RelayConfigError(
                        f"PostgreSQL ended replication: {classify_exception(exc).problem}"
                    ) from exc
                # PostgreSQL restarted or the connection dropped: what Kafka acknowledged
                # but PostgreSQL did not hear about is replayed from the slot (duplicates
                # the worker drops), nothing is skipped.
                self._pg_outage.failed(f"replication connection lost: {exc}")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(s.drain_timeout_s):
                        await self._producer.flush()
                confirmed = self._reported
                await self._sleep(backoff.next_delay_s())
            finally:
                await source.close()
            if self._failure is not None:
                failure = self._failure
                if not kafka_transient(failure):
                    raise RelayError("Kafka did not acknowledge a record") from failure
                # E.g. a batch expired while the brokers were away: confirm nothing past
                # it, let the rest settle, and stream again from the slot's position.
                self._kafka_outage.failed(repr(failure))
                await self._settle_in_flight()
                self._failure = None
                self._room.set()
                confirmed = self._reported
                await self._sleep(backoff.next_delay_s())
            elif self._kafka_outage.ongoing and self._tracker is not None:
                self._kafka_outage.recovered()
        self._log_summary()

    async def _settle_in_flight(self) -> None:
        pending: set[asyncio.Future[Any]] = set(self._in_flight) | set(self._replacements)
        if pending:
            await asyncio.wait(pending, timeout=self.settings.drain_timeout_s)

    def _log_summary(self) -> None:
        log.info(
            "relay stopped: %d transactions, %d intents, %d rejected (%d reduced), "
            "confirmed %s, %.1fs",
            self._stats.transactions,
            self._stats.intents,
            self._stats.rejected,
            self._stats.reduced,
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
        record = self._producible(_CONVERTERS[table](row, lsn=lsn, committed_at=committed_at), row)
        if isinstance(record, IntentCaptured | CommandRequested):
            self._stats.intents += 1
        else:
            self._stats.rejected += 1
            log.warning("%s row for job %s rejected: %s", table, record.job_id, record.reason)
        tracker.record_sent(txn)
        try:
            future = await self._send(record)
            watched: Record = record
        except PER_RECORD_ERRORS as exc:
            # Refused before it left (e.g. over max_request_size): send the minimal form.
            try:
                future = await self._send(self._minimal(record, exc))
            except KafkaError as failure:
                self._fail(failure)
                return
            watched = _MINIMAL
        except KafkaError as exc:
            # E.g. no metadata while the brokers are away: its transaction stays
            # outstanding, so nothing at or past it is confirmed; the relay resumes
            # from the slot (transient) or stops (permanent).
            self._fail(exc)
            return
        self._watch(future, tracker, txn, watched)

    def _producible(
        self, record: IntentCaptured | CommandRequested | IntentRejected, row: dict[str, str | None]
    ) -> IntentCaptured | CommandRequested | IntentRejected:
        """The record, or a reduced rejection if it is over ``max_record_bytes``."""
        s = self.settings
        size = len(record.dumps())
        if size <= s.max_record_bytes:
            return record
        self._stats.reduced += 1
        if isinstance(record, IntentRejected):
            reason = record.reason
        else:
            reason = f"record too large: {size} bytes over the relay's {s.max_record_bytes}"
        job_id = record.job_id
        return reduced_rejection(
            job_id=job_id,
            reason=reason,
            row=row,
            lsn=record.lsn,
            committed_at=getattr(record, "committed_at", None),
            max_record_bytes=s.max_record_bytes,
            max_value_bytes=s.rejected_value_max_bytes,
        )

    def _minimal(self, record: Record, exc: BaseException) -> IntentRejected:
        self._stats.reduced += 1
        job_id = getattr(record, "job_id", None)
        log.warning("Kafka refused the record for job %s (%r); sending its reference", job_id, exc)
        if isinstance(record, IntentRejected):
            reference: dict[str, str | None] | None = record.row
        elif isinstance(record, CommandRequested):
            reference = {
                "id": str(record.command_id),
                "job_id": str(record.job_id),
                "command": str(record.command),
            }
        else:
            reference = None
        return minimal_rejection(
            job_id=job_id if isinstance(job_id, int) else None,
            reason=f"record too large or refused by Kafka: {exc!r}",
            lsn=str(getattr(record, "lsn", "0/0")),
            committed_at=getattr(record, "committed_at", None),
            row=reference,
        )

    async def _send(self, record: Record) -> asyncio.Future[Any]:
        if isinstance(record, IntentCaptured | CommandRequested):
            topic, key = INTENTS, record.partition_key
        else:
            assert isinstance(record, IntentRejected)
            topic, key = INVALID, str(record.job_id).encode()
        job_id = getattr(record, "job_id", None)
        headers = [
            (HEADER_SCHEMA, record.SCHEMA.encode()),
            (HEADER_LSN, str(getattr(record, "lsn", "0/0")).encode()),
            (HEADER_JOB_ID, str(job_id).encode()),
        ]
        future: asyncio.Future[Any] = await self._producer.send(
            topic, record.dumps(), key=key, headers=headers
        )
        return future

    def _watch(
        self, future: asyncio.Future[Any], tracker: AckTracker, txn: Any, record: Record
    ) -> None:
        self._in_flight.add(future)
        # Bind this connection's tracker: after a reconnect, late acks of the old
        # connection's records must not count against the new tracker.
        future.add_done_callback(lambda f: self._on_ack(f, tracker, txn, record))

    async def _replace(self, tracker: AckTracker, txn: Any, record: Record, exc: Exception) -> None:
        try:
            future = await self._send(self._minimal(record, exc))
        except KafkaError as failure:
            self._fail(failure)
            return
        # The minimal form is never replaced again: a refusal of it stops the relay.
        self._watch(future, tracker, txn, _MINIMAL)

    def _on_ack(
        self, future: asyncio.Future[Any], tracker: AckTracker, txn: Any, record: Record
    ) -> None:
        self._in_flight.discard(future)
        # exception() raises CancelledError on a cancelled future: ask cancelled() first.
        if future.cancelled():
            failure: BaseException | None = RelayError("Kafka send was cancelled")
        else:
            failure = future.exception()
        if (
            isinstance(failure, PER_RECORD_ERRORS)
            and record is not _MINIMAL
            and self._failure is None
        ):
            # Kafka will never take this record: its transaction stays outstanding
            # until the minimal rejection replacing it is acknowledged.
            task = asyncio.get_running_loop().create_task(
                self._replace(tracker, txn, record, failure)
            )
            self._replacements.add(task)
            task.add_done_callback(self._replacements.discard)
            return
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
        if self._failure is None:
            self._failure = failure
            if not kafka_transient(failure):
                log.error(
                    "a record was not acknowledged; stopping without confirming it: %r", failure
                )
        # Wake a send blocked on backpressure so it sees the failure.
        self._room.set()

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
                while self._in_flight or self._replacements:
                    await asyncio.wait(set(self._in_flight) | set(self._replacements))
        except TimeoutError:
            log.warning("drain: Kafka did not acknowledge everything within the bound")
        try:
            await self._report(source, force=True)
        except ReplicationError as exc:
            # The slot keeps the older position; the next relay replays the rest.
            log.warning("drain: could not confirm the final position: %s", exc)


_MINIMAL: Record = IntentRejected(job_id=None, reason="", row={})
"""Marks a send that already is the minimal form of a refused record."""
