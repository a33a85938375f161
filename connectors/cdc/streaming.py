"""One streaming connection of the relay: WAL read, assembled, published, confirmed.

:meth:`Streamer.stream` runs while this relay holds the slot on one
:class:`~connectors.cdc.source.ReplicationSource`: it reads messages, feeds
their payloads to the :class:`~connectors.cdc.assembler.TransactionAssembler`,
hands the records to the :class:`~connectors.cdc.publisher.Publisher` (whose
:class:`~connectors.cdc.publisher.BatchingPolicy` says when batches go while
the source runs dry), answers keepalives and reports the confirmed LSN every
``status_interval_s``, and as soon as the source goes quiet after a burst. When
asked to stop it drains (:meth:`Streamer.drain`).

The confirmed LSN is the end of the last transaction whose records Kafka all
acknowledged (:class:`~connectors.cdc.acks.AckTracker`); with exactly-once,
the position the last Kafka commit reached. It never moves back: that is a
bug, :class:`~connectors.cdc.failures.RelayError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from connectors.cdc.acks import AckTracker
from connectors.cdc.assembler import (
    RowCaptured,
    Step,
    TransactionAssembler,
    TxnBegun,
    TxnCommitted,
)
from connectors.cdc.exactly_once import KafkaTransactions
from connectors.cdc.failures import RelayError
from connectors.cdc.lsn import Lsn
from connectors.cdc.metrics import (
    COMMIT_TO_READ,
    CONFIRMED_LSN,
    ROWS,
    TRANSACTIONS,
    LatencyWindow,
    RelayStats,
)
from connectors.cdc.publisher import Linger, Publisher
from connectors.cdc.replication_messages import PrimaryKeepalive, XLogData, pg_timestamp_to_unix
from connectors.cdc.replication_stream import ReplicationError
from connectors.cdc.settings import RelaySettings
from connectors.cdc.shaping import RecordShaper
from connectors.cdc.slot_gap import ReplayedBefore
from connectors.cdc.source import ReplicationSource

# The relay's log lines keep the logger name they always had: operators filter on it.
log = logging.getLogger("connectors.cdc.relay")

Message = XLogData | PrimaryKeepalive | None


QUIET_CONFIRM_FRACTION = 0.1
"""How long the source must stay quiet, as a fraction of ``status_interval_s`` (100 ms by
default), before what Kafka acknowledged is confirmed ahead of the interval's tick (see
:meth:`Streamer._read_idle`). A fraction, not a fixed time: a longer interval (fewer
status updates) still means WAL flowing at any steady pace is confirmed only on the tick."""


class _Again:
    """No message, and none to wait for now: go round the loop (see _wait_for_message)."""


_AGAIN = _Again()


class Streamer:
    """Streams the slot over one connection at a time (see the module docstring)."""

    def __init__(
        self,
        settings: RelaySettings,
        publisher: Publisher,
        shaper: RecordShaper,
        stats: RelayStats,
        *,
        transactions: KafkaTransactions | None,
        stopping: Callable[[], bool],
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._publisher = publisher
        self._shaper = shaper
        self._stats = stats
        self._eos = transactions
        self._stopping = stopping
        self._clock = clock
        self._linger = Linger(publisher.policy)
        self.reported = Lsn(0)
        """The LSN last confirmed to PostgreSQL (by any connection)."""
        self.replayed_before: ReplayedBefore | None = None
        """After a slot gap: the restream's transaction, until a session streamed up to it."""
        self.commit_to_ack = LatencyWindow()
        self.commit_to_read = LatencyWindow("commit->read", COMMIT_TO_READ)
        # The connection being streamed (set by stream()).
        self._assembler: TransactionAssembler | None = None
        self._txn: Any = None
        self._rows_counted = 0

    def _on_acknowledged(self, commit_ts_us: int, acked_at: float) -> None:
        """A transaction's last record was acknowledged: observe its commit->ack latency."""
        self.commit_to_ack.observe(acked_at - pg_timestamp_to_unix(commit_ts_us))

    async def stream(self, source: ReplicationSource, confirmed: Lsn) -> Lsn:
        """Stream until a stop or a failure, then drain; the LSN to resume from."""
        s = self._settings
        eos = self._eos
        if eos is not None:
            # The session may have confirmed what Kafka held (KafkaTransactions.begin_session).
            confirmed = max(confirmed, self.reported)
            eos.committed = confirmed
        tracker = AckTracker(confirmed, on_acknowledged=self._on_acknowledged, clock=self._clock)
        self._publisher.begin(tracker)
        self.reported = max(self.reported, confirmed)
        self._assembler = TransactionAssembler(
            self._shaper,
            max_value_bytes=s.max_record_bytes,
            oversized_head_bytes=s.rejected_value_max_bytes,
            skip_before=Lsn(0) if eos is None else eos.skip_before,
            start_lsn=confirmed,
            replayed_before=self.replayed_before,
        )
        self._txn = None
        self._rows_counted = self._stats.intents + self._stats.rejected
        log.info(
            "relay streaming slot %s from %s",
            s.slot,
            confirmed if confirmed else "its confirmed position",
        )
        try:
            await self._read(source, tracker, self._assembler)
        finally:
            self.replayed_before = self._assembler.replayed_before
        await self.drain(source, at_boundary=self._txn is None)
        # Exactly-once: only what was confirmed is known to be committed in Kafka.
        return self.reported if eos is not None else tracker.confirmed

    async def _read(
        self, source: ReplicationSource, tracker: AckTracker, assembler: TransactionAssembler
    ) -> None:
        """The loop: read, assemble, publish, confirm, until a stop or a failure."""
        status_interval_s = self._settings.status_interval_s
        next_status = time.monotonic() + status_interval_s
        publisher = self._publisher
        feed, try_append, read_nowait = assembler.feed, publisher.try_append, source.read_nowait
        message: Message | _Again
        while not self._stopping() and publisher.failure is None:
            # Batches fill while WAL is already at hand; the rest is _wait_for_message.
            message = source.read_nowait() if publisher.batches else None
            if message is None:
                message = await self._wait_for_message(source)
            if type(message) is XLogData:
                step: Step | PrimaryKeepalive | None = feed(message.payload)
                while type(step) is RowCaptured and try_append(self._txn, step.record):
                    # The common case without a coroutine: an intent appended to its batch,
                    # then the next rows while WAL is at hand. Nothing is awaited in here, so
                    # no stop, failure or timer can come in between: the checks can wait.
                    message = read_nowait()
                    step = feed(message.payload) if isinstance(message, XLogData) else message
                if isinstance(step, RowCaptured):
                    await self._produce(step)
                elif isinstance(step, PrimaryKeepalive):
                    await self._keepalive(source, step, tracker)
                elif step is not None:
                    self._boundary(step, tracker)
            elif isinstance(message, PrimaryKeepalive):
                await self._keepalive(source, message, tracker)
            elif message is _AGAIN:
                continue
            now = time.monotonic()
            if self._eos is not None and self._txn is None and self._eos.due(now):
                # Exactly-once: the interval passed; this is a transaction boundary.
                await self._commit(source)
            if now >= next_status:
                await self.report(source)
                next_status = now + status_interval_s

    async def _keepalive(
        self, source: ReplicationSource, message: PrimaryKeepalive, tracker: AckTracker
    ) -> None:
        tracker.keepalive(message.wal_end)
        if message.reply_requested:
            await self.report(source, force=True)

    async def _wait_for_message(self, source: ReplicationSource) -> Message | _Again:
        """No WAL at hand: wait for some, sending the open batches as the policy says."""
        publisher = self._publisher
        if not publisher.batches:
            self._linger.reset()
            if self._eos is not None and self._eos.open and self._txn is None:
                # Exactly-once, at a transaction boundary with no more WAL at hand:
                # commit now rather than hold read_committed consumers until the interval.
                message = source.read_nowait()
                if message is None:
                    await self._commit(source)
                    return _AGAIN
                return message
            return await self._read_idle(source)
        if publisher.batched < publisher.policy.full_records:
            wait = self._linger.wait(time.monotonic(), kafka_busy=bool(publisher.in_flight))
            if wait is not None:
                timeout_s, hold = wait
                message = await source.read(timeout_s=timeout_s)
                if message is not None:
                    return message
                if hold:
                    return _AGAIN
        await publisher.send_batches()
        self._linger.reset()
        return _AGAIN

    async def _read_idle(self, source: ReplicationSource) -> Message:
        """Wait for WAL with nothing to send; confirm what Kafka acknowledged once it goes quiet.

        Records in flight (or acknowledged and not yet confirmed) and no WAL for
        :data:`QUIET_CONFIRM_FRACTION` of ``status_interval_s``: confirm now rather than at
        the interval's tick, so a burst's WAL is released (and its slot lag gone) soon after
        Kafka took it. A steady trickle of WAL keeps the read busy and leaves confirmation
        to the interval.
        """
        timeout_s = self._settings.status_interval_s
        tracker = self._publisher.tracker
        if self._eos is not None or tracker is None:
            # Exactly-once confirms at each Kafka commit (_wait_for_message commits when idle).
            return await source.read(timeout_s=timeout_s)
        if self._publisher.in_flight or tracker.confirmed > self.reported:
            timeout_s *= QUIET_CONFIRM_FRACTION
        message = await source.read(timeout_s=timeout_s)
        if message is None and tracker.confirmed > self.reported:
            await self.report(source)
        return message

    async def _produce(self, step: RowCaptured) -> None:
        """A row the fast path did not take: produced whole, waiting for room if need be."""
        assert self._assembler is not None
        step = self._assembler.completed(step)
        await self._publisher.produce(
            self._txn, step.table, step.record, step.row, too_large=step.too_large
        )

    def _boundary(self, step: TxnBegun | TxnCommitted, tracker: AckTracker) -> None:
        """A transaction begins (its commit->read latency) or ends (counted, confirmable)."""
        if type(step) is TxnBegun:
            self._txn = tracker.begin(step.commit_ts_us)
            self.commit_to_read.observe(self._clock() - pg_timestamp_to_unix(step.commit_ts_us))
            return
        assert isinstance(step, TxnCommitted)
        tracker.commit(self._txn, step.end_lsn)
        self._txn = None
        stats = self._stats
        stats.transactions += 1
        TRANSACTIONS.inc()
        rows = stats.intents + stats.rejected
        ROWS.inc(rows - self._rows_counted)
        self._rows_counted = rows
        if step.skipped:
            stats.skipped += 1

    async def _commit(self, source: ReplicationSource, *, draining: bool = False) -> None:
        """Exactly-once: commit the open Kafka transaction, then confirm what it reached."""
        assert self._eos is not None
        if await self._eos.commit(self._publisher, draining=draining):
            await self.report(source)

    async def report(self, source: ReplicationSource, *, force: bool = False) -> None:
        """Confirm the highest confirmable LSN to PostgreSQL (``force``: even if unchanged)."""
        tracker = self._publisher.tracker
        assert tracker is not None
        confirmed = tracker.confirmed
        if self._eos is not None and self._eos.open:
            # Exactly-once: acknowledged is not committed; confirm what the last commit reached.
            confirmed = self._eos.committed
        if confirmed < self.reported:
            raise RelayError(f"confirmed LSN would move back from {self.reported} to {confirmed}")
        if confirmed > self.reported or force:
            await source.send_status(flush=confirmed)
            self.reported = confirmed
            CONFIRMED_LSN.set(confirmed.value)

    async def confirm(self, source: ReplicationSource, lsn: Lsn) -> None:
        """Confirm ``lsn`` now (exactly-once: what Kafka held past the slot's position)."""
        await source.send_status(flush=lsn)
        self.reported = lsn
        CONFIRMED_LSN.set(lsn.value)

    async def drain(self, source: ReplicationSource, *, at_boundary: bool = True) -> None:
        """Wait (bounded) for Kafka to acknowledge what is in flight, then confirm it.

        Exactly-once: commit the open Kafka transaction if the relay stopped at a
        PostgreSQL transaction boundary (``at_boundary``); inside one it is left open, to be
        aborted by the next relay's start: a commit would hold part of a transaction
        that the slot replays whole.
        """
        if self._publisher.failure is not None:
            return
        drain_s = self._settings.drain_timeout_s
        if self._eos is not None:
            if self._eos.open and at_boundary:
                try:
                    async with asyncio.timeout(drain_s):
                        await self._commit(source, draining=True)
                except TimeoutError:
                    log.warning("drain: the Kafka transaction did not commit within the bound")
            with contextlib.suppress(ReplicationError):
                await self.report(source, force=True)
            return
        try:
            async with asyncio.timeout(drain_s):
                await self._publisher.flush()
        except TimeoutError:
            log.warning("drain: Kafka did not acknowledge everything within the bound")
        try:
            await self.report(source, force=True)
        except ReplicationError as exc:
            # The slot keeps the older position; the next relay replays the rest.
            log.warning("drain: could not confirm the final position: %s", exc)
