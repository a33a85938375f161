"""Exactly-once sessions: the relay's Kafka transactions (``ZAPSTREAM_RELAY_EXACTLY_ONCE``).

The rules are :mod:`connectors.cdc.transactions`; this is their use by the relay.
A transactional producer per streaming session, started only once this relay
holds the slot (a standby's InitProducerId would fence the active relay).
Records go into a Kafka transaction opened on the first send; it is committed,
with the position it reaches stored as the consumer-group offset, at a
PostgreSQL transaction boundary once every record was acknowledged (at the
latest every ``transaction_interval_s``), and only then is that position
confirmed to PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiokafka.errors import IllegalOperation, KafkaError, KafkaTimeoutError, ProducerFenced

from connectors.cdc.failures import RelayError, kafka_transient, refused
from connectors.cdc.lsn import Lsn
from connectors.cdc.settings import RelaySettings
from connectors.cdc.source import ReplicationSource
from connectors.cdc.transactions import (
    KafkaPosition,
    position_partition,
    resume_point,
    transactional_id,
)
from streams.kernel.producer_stop import abandon_sender

if TYPE_CHECKING:
    from connectors.cdc.metrics import RelayStats
    from connectors.cdc.publisher import Publisher

# The relay's log lines keep the logger name they always had: operators filter on it.
log = logging.getLogger("connectors.cdc.relay")


class KafkaTransactions:
    """One relay's Kafka transactions: sessions, begin, commit (see the module docstring)."""

    def __init__(
        self,
        settings: RelaySettings,
        stats: RelayStats,
        *,
        make_producer: Callable[[], Any],
        read_position: Callable[[], Awaitable[KafkaPosition | None]],
        stopping: Callable[[], bool],
    ) -> None:
        self._settings = settings
        self._stopping = stopping
        self._stats = stats
        self._make_producer = make_producer
        self._read_position = read_position
        # An aiokafka producer starts only once: every session after the first needs a new one.
        self._producer_spent = False
        self.open = False
        """A Kafka transaction is open (records were sent since the last commit)."""
        self._due = 0.0
        self.committed = Lsn(0)
        """What the last Kafka commit reached (confirmable to PostgreSQL)."""
        self.skip_before = Lsn(0)
        """Transactions whose commit starts before it are in Kafka already."""
        self._system_id: str | None = None
        self._timeline: int | None = None

    async def begin_session(
        self, publisher: Publisher, source: ReplicationSource, confirmed: Lsn
    ) -> Lsn | None:
        """This relay holds the slot: start a transactional producer, read Kafka's position.

        The producer's InitProducerId fences the relay that streamed before and aborts
        what it left open; then the position its last commit stored says which replayed
        transactions Kafka already holds. Returns that position when it lies past
        ``confirmed`` (to be confirmed now), else None. A Kafka failure is noted
        (``publisher.fail``) like a failed send: the session ends and the relay retries
        (or stops, if permanent).
        """
        s = self._settings
        if self._producer_spent:
            publisher.use(self._make_producer())
        self._producer_spent = True
        try:
            async with asyncio.timeout(s.kafka.request_timeout_s):
                await publisher.producer.start()
                stored = await self._read_position()
        except TimeoutError:
            publisher.fail(
                KafkaTimeoutError("no transactional producer within the request timeout")
            )
            return None
        except KafkaError as exc:
            if not kafka_transient(exc) and not isinstance(exc, ProducerFenced):
                raise refused(
                    f"Kafka refused the relay's transactions as {transactional_id(s)} ({exc!r}): "
                    "with ACLs, allow it Write and Describe on that transactional id and Read "
                    "on that group; or set ZAPSTREAM_RELAY_EXACTLY_ONCE=false",
                    dependency="kafka",
                ) from exc
            publisher.fail(exc)
            return None
        identity = getattr(source, "identity", None)
        self._system_id = getattr(identity, "system_id", None)
        self._timeline = getattr(identity, "timeline", None)
        resume = resume_point(
            stored, slot=s.slot, system_id=self._system_id, timeline=self._timeline
        )
        self.skip_before = resume if resume is not None else Lsn(0)
        self.open = False
        publisher.kafka_ok = True
        if resume is not None and resume > confirmed:
            # Committed in Kafka but never confirmed (the last relay died in between).
            log.info(
                "exactly-once: Kafka holds the slot's records up to %s, past the confirmed %s; "
                "transactions before it are skipped",
                resume,
                confirmed,
            )
            return resume
        return None

    async def end_session(self, publisher: Publisher) -> None:
        """Drop the session's producer; an open transaction is aborted by the next one's start."""
        publisher.tracker = None  # late answers about this session's records are ignored
        self.open = False
        for task in publisher.replacements:
            task.cancel()
        producer = publisher.producer
        try:
            async with asyncio.timeout(self._settings.drain_timeout_s):
                await producer.stop()
        except (TimeoutError, KafkaError) as exc:
            log.debug("exactly-once: the session's producer did not stop cleanly: %r", exc)
            await abandon_sender(producer)  # aiokafka's sender, still retrying
        publisher.in_flight.clear()
        publisher.replacements.clear()

    async def begin(self, publisher: Publisher) -> None:
        """Open the Kafka transaction the next records go into (raises KafkaError)."""
        tracker = publisher.tracker
        assert tracker is not None
        try:
            await publisher.producer.begin_transaction()
        except IllegalOperation as exc:  # not a KafkaError: the producer is in a bad state
            raise KafkaError(f"cannot begin a Kafka transaction: {exc}") from exc
        self.open = True
        self._due = time.monotonic() + self._settings.transaction_interval_s
        # Nothing was open: everything acknowledged so far is committed, confirmable.
        self.committed = max(self.committed, tracker.confirmed)

    def due(self, now: float) -> bool:
        """The open transaction has run its ``transaction_interval_s``."""
        return self.open and now >= self._due

    async def commit(self, publisher: Publisher, *, draining: bool = False) -> bool:
        """Commit the open Kafka transaction with the position it reaches; True if committed.

        Called at a PostgreSQL transaction boundary only: every record produced belongs
        to a transaction whose Commit was read. The records must all be acknowledged
        first (one Kafka refused is replaced in this transaction); on any failure
        nothing is committed and the session ends (:meth:`end_session`).
        """
        tracker = publisher.tracker
        assert tracker is not None
        s = self._settings
        await publisher.send_batches()
        while (publisher.in_flight or publisher.replacements) and publisher.failure is None:
            if self._stopping() and not draining:
                return False  # the drain commits, bounded (or leaves it to be aborted)
            await asyncio.wait(publisher.pending, timeout=s.status_interval_s)
        if publisher.failure is not None:
            return False
        lsn = tracker.confirmed
        if tracker.records_outstanding or tracker.pending_transactions:
            publisher.fail(RelayError("a Kafka transaction would commit records not acknowledged"))
            return False
        position = KafkaPosition(lsn, s.slot, self._system_id, self._timeline)
        try:
            await publisher.producer.send_offsets_to_transaction(
                {position_partition(s): (0, position.metadata())}, transactional_id(s)
            )
            await publisher.producer.commit_transaction()
        except (KafkaError, IllegalOperation) as exc:
            publisher.fail(exc if isinstance(exc, KafkaError) else KafkaError(str(exc)))
            return False
        self.open = False
        self.committed = max(self.committed, lsn)
        self._stats.kafka_commits += 1
        return True
