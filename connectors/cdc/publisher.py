"""The relay's publisher: records into Kafka in partition batches, Kafka's answers settled.

:class:`Publisher` hands records to the producer and accounts for every answer
in the connection's :class:`~connectors.cdc.acks.AckTracker`:

- **partition batches**: each record is appended to one batch per topic
  partition (the partition aiokafka's, Faust's and the Java client's murmur2
  partitioner gives the key, :class:`KeyHashPartitioner`); Kafka answers for the
  whole batch and each record is settled as if sent alone. When the batches go
  is the :class:`BatchingPolicy` (full, no more WAL at hand after a short linger,
  before waiting for room);
- **backpressure**: at most ``max_in_flight`` records unacknowledged;
- **settlement**: an acknowledgement counts towards its transaction; any other
  answer stops confirmation at that record (:meth:`Publisher.fail`);
- **replacement**: a record Kafka refuses for good (too large, corrupt:
  :data:`~connectors.cdc.failures.PER_RECORD_ERRORS`) is replaced by its minimal
  rejection, so one row never blocks the slot; a batch refused as a whole is sent
  again record by record.

A producer without the batch methods (a test's fake) gets one send per record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner, murmur2

from connectors.cdc.acks import AckOrderError, AckTracker
from connectors.cdc.failures import PER_RECORD_ERRORS, RelayError, kafka_transient
from connectors.cdc.metrics import ACKED, RelayStats
from connectors.cdc.outbox_rows import CapturedIntent
from connectors.cdc.settings import RelaySettings
from connectors.cdc.shaping import MINIMAL, Converted, Outgoing, RecordShaper, Row
from connectors.cdc.transactions import transactional_id

if TYPE_CHECKING:
    from connectors.cdc.exactly_once import KafkaTransactions

# The relay's log lines keep the logger name they always had: operators filter on it.
log = logging.getLogger("connectors.cdc.relay")


class KeyHashPartitioner:
    """aiokafka's (and the Java client's) murmur2 partitioner, with the key hashes cached.

    Exactly :class:`aiokafka.partitioner.DefaultPartitioner` for keyed records,
    so every key lands where Faust's producer puts it (the worker's tables are
    co-partitioned with intents; ``tests/integration/test_partitioning.py``
    proves it). aiokafka's murmur2 is pure Python and conversations repeat, so
    the hash of each key is remembered (bounded: the cache starts over when full).
    """

    def __init__(self, max_keys: int = 100_000) -> None:
        self._hashes: dict[bytes, int] = {}
        self._max_keys = max_keys

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return int(DefaultPartitioner()(key, all_partitions, available))
        hashes = self._hashes
        positive = hashes.get(key)
        if positive is None:
            if len(hashes) >= self._max_keys:
                hashes.clear()
            positive = hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[positive % len(all_partitions)]


def build_producer(settings: RelaySettings) -> AIOKafkaProducer:
    """The relay's producer: acks=all, idempotent where the broker allows, our partitioner."""
    kafka = settings.kafka
    transactional: dict[str, Any] = {}
    if settings.exactly_once:
        # One transactional id per slot: a new relay's InitProducerId fences the last one.
        transactional = {
            "transactional_id": transactional_id(settings),
            "transaction_timeout_ms": round(settings.transaction_timeout_s * 1000),
        }
    return AIOKafkaProducer(
        **kafka.client_options(),
        client_id="zapstream-relay",
        partitioner=KeyHashPartitioner(),
        acks="all",
        enable_idempotence=kafka.use_idempotent_producer,
        linger_ms=5,
        max_batch_size=256 * 1024,
        **kafka.deadline_options(),
        **transactional,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """When the partition batches go to the producer (cf. the Java client's ``linger.ms``).

    Batches fill while WAL is already at hand. Once the source has nothing
    buffered they wait ``linger_s`` for more (under load more WAL is on its way:
    fewer, larger produce requests), counted from the first dry read, not from
    each message: WAL trickling in every millisecond must not hold them back
    until they fill. While Kafka still answers earlier batches (aiokafka keeps
    one request in flight per broker, so batches sent now would only queue
    behind it) they keep filling up to ``hold_s``, looking every ``poll_s``.
    With ``full_records`` records waiting they go without lingering.
    """

    linger_s: float = 0.002
    hold_s: float = 0.010
    poll_s: float = 0.0005
    full_records: int = 5_000


class Linger:
    """The :class:`BatchingPolicy` clock of one dry spell (from the first dry read)."""

    __slots__ = ("_dry_since", "policy")

    def __init__(self, policy: BatchingPolicy) -> None:
        self.policy = policy
        self._dry_since: float | None = None

    def reset(self) -> None:
        """The batches went (or there are none): the next dry read starts a new spell."""
        self._dry_since = None

    def wait(self, now: float, *, kafka_busy: bool) -> tuple[float, bool] | None:
        """How long to read for more WAL, and whether to look again if none came; None: send."""
        policy = self.policy
        if self._dry_since is None:
            self._dry_since = now
        if kafka_busy and now < self._dry_since + policy.hold_s:
            return policy.poll_s, True
        if now < self._dry_since + policy.linger_s:
            return self._dry_since + policy.linger_s - now, False
        return None


@dataclasses.dataclass(slots=True)
class _Batch:
    """Records for one topic partition, appended in WAL order and produced as one batch."""

    topic: str
    partition: int
    builder: Any
    """An aiokafka ``BatchBuilder`` (``producer.create_batch()``)."""
    tracker: AckTracker
    """The tracker of the connection the records came from (late acks must not cross)."""
    entries: list[tuple[Any, Outgoing]] = dataclasses.field(default_factory=list)
    """(transaction, record) of every record in the batch, for the acknowledgement."""


def _outcome(future: asyncio.Future[Any]) -> BaseException | None:
    """What a done send future says: None if Kafka acknowledged, else the failure."""
    # exception() raises CancelledError on a cancelled future: ask cancelled() first.
    if future.cancelled():
        return RelayError("Kafka send was cancelled")
    return future.exception()


class Publisher:
    """Produces records in partition batches and settles Kafka's answers (see the module)."""

    def __init__(
        self,
        settings: RelaySettings,
        producer: Any,
        shaper: RecordShaper,
        stats: RelayStats,
        *,
        stopping: Callable[[], bool],
        transactions: KafkaTransactions | None = None,
    ) -> None:
        self.producer = producer
        self._max_in_flight = settings.max_in_flight
        self._shaper = shaper
        self._stats = stats
        self._stopping = stopping
        self._transactions = transactions
        self.policy = BatchingPolicy()
        self.failure: BaseException | None = None
        """The first answer that stopped confirmation (None: all well)."""
        self.kafka_ok = True
        """False from a Kafka failure until Kafka acknowledges a record again."""
        self.tracker: AckTracker | None = None
        """The streaming connection's tracker (None between connections)."""
        # Sends Kafka has not answered yet, so the drain can wait for their callbacks.
        self.in_flight: set[asyncio.Future[Any]] = set()
        # Replacements for records Kafka refused, so the drain waits for them too.
        self.replacements: set[asyncio.Task[None]] = set()
        self._room = asyncio.Event()
        self._room.set()
        # Batched produce (aiokafka's create_batch/send_batch): one future per partition
        # batch instead of one per record.
        self._batching = False
        self.batches: dict[tuple[str, int], _Batch] = {}
        self.batched = 0  # records in self.batches
        self._partitions: dict[str, list[int]] = {}
        self._partitioner = KeyHashPartitioner()

    def use(self, producer: Any) -> None:
        """Produce with ``producer`` from now on (batched if it has aiokafka's batch methods)."""
        self.producer = producer
        self._batching = all(
            callable(getattr(producer, name, None))
            for name in ("partitions_for", "create_batch", "send_batch")
        )

    def begin(self, tracker: AckTracker) -> None:
        """A new connection streams: its records settle against ``tracker``."""
        self.tracker = tracker
        # Batches of an earlier connection were never sent: their rows are streamed again.
        self.batches.clear()
        self.batched = 0
        self._partitions.clear()

    @property
    def pending(self) -> set[asyncio.Future[Any] | asyncio.Task[None]]:
        """Sends and replacements Kafka has not answered yet."""
        return set(self.in_flight) | set(self.replacements)

    def wake(self) -> None:
        """Wake a send blocked on backpressure so it sees a stop or a failure."""
        self._room.set()

    def recover(self) -> None:
        """A transient failure was waited out: the next connection produces again."""
        self.failure = None
        self._room.set()

    def fail(self, failure: BaseException) -> None:
        """Stop confirming at a record Kafka did not take (the first failure is kept)."""
        if self.failure is None:
            self.failure = failure
            if not kafka_transient(failure):
                log.error(
                    "a record was not acknowledged; stopping without confirming it: %r", failure
                )
        self._room.set()

    # --- producing ----------------------------------------------------------------------

    def try_append(self, txn: Any, intent: Converted) -> bool:
        """Append a valid intent to its open partition batch synchronously; False if not done.

        Done only when: batching, room under ``max_in_flight``, no failure, the
        record an intent within ``max_record_bytes``, and its partition's batch
        open with room for it. Otherwise nothing happened yet and the caller goes
        the general way (:meth:`produce`): same accounting and order as there.
        """
        tracker = self.tracker
        assert tracker is not None
        if (
            type(intent) is not CapturedIntent
            or not self._batching
            or tracker.records_outstanding >= self._max_in_flight
            or self.failure is not None
        ):
            return False
        value = orjson.dumps(intent.document)  # intent.dumps(), without the call
        shaper = self._shaper
        topic = shaper.topic_name[intent.topic]
        partitions = self._partitions.get(topic)
        if len(value) > shaper.max_record_bytes or partitions is None:
            return False
        key = intent.partition_key
        batch = self.batches.get((topic, self._partitioner(key, partitions, partitions)))
        if batch is None or not batch.builder.append(
            timestamp=None, key=key, value=value, headers=shaper.intent_headers(intent)
        ):
            return False
        self._stats.intents += 1
        tracker.record_sent(txn)
        batch.entries.append((txn, intent))
        self.batched += 1
        return True

    async def produce(
        self, txn: Any, table: str, converted: Converted, row: Row, *, too_large: bool = False
    ) -> None:
        """Produce one row's record (reduced if too large), waiting for room first."""
        tracker = self.tracker
        assert tracker is not None
        if not await self._wait_for_room(tracker):
            # Leave the row unsent: its transaction stays open in the tracker,
            # so nothing at or past it is confirmed, and the slot replays it.
            return
        record, value = self._shaper.producible(converted, row)
        self._shaper.count(table, converted, record, too_large)
        tracker.record_sent(txn)
        if self._batching and await self._append(tracker, txn, record, value):
            return
        try:
            future = await self._send(record, value)
            watched: Outgoing = record
        except PER_RECORD_ERRORS as exc:
            # Refused before it left (e.g. over max_request_size): send the minimal form.
            try:
                future = await self._send(self._shaper.minimal(record, exc))
            except KafkaError as failure:
                self.fail(failure)
                return
            watched = MINIMAL
        except KafkaError as exc:
            # E.g. no metadata while the brokers are away: its transaction stays
            # outstanding, so nothing at or past it is confirmed; the relay resumes
            # from the slot (transient) or stops (permanent).
            self.fail(exc)
            return
        self._watch(future, tracker, txn, watched)

    async def _wait_for_room(self, tracker: AckTracker) -> bool:
        """Wait until fewer than ``max_in_flight`` records are outstanding; False if stopping."""
        while tracker.records_outstanding >= self._max_in_flight:
            if self._stopping() or self.failure is not None:
                return False
            if self.batches:
                # Records waiting in unsent batches count as outstanding: send them
                # before waiting for acknowledgements that would otherwise never come.
                await self.send_batches()
                continue
            self._room.clear()
            await self._room.wait()
        return True

    async def _send(self, record: Outgoing, value: bytes | None = None) -> asyncio.Future[Any]:
        """Hand one record to the producer; ``value`` is its encoding when already made."""
        topic, key = self._shaper.route(record)
        if self._transactions is not None and not self._transactions.open:
            await self._transactions.begin(self)
        future: asyncio.Future[Any] = await self.producer.send(
            topic,
            record.dumps() if value is None else value,
            key=key,
            headers=self._shaper.headers(record),
        )
        return future

    async def _partitions_of(self, topic: str) -> list[int] | None:
        partitions = self._partitions.get(topic)
        if partitions is None:
            try:
                partitions = sorted(await self.producer.partitions_for(topic))
            except KafkaError as exc:
                # Like a send failing for want of metadata: the record stays outstanding.
                self.fail(exc)
                return None
            self._partitions[topic] = partitions
        return partitions

    async def _append(self, tracker: AckTracker, txn: Any, record: Outgoing, value: bytes) -> bool:
        """Add a record to its partition's batch; False if it must go alone (:meth:`_send`).

        A batch is sent when full, before the relay waits for WAL or for
        acknowledgements (backpressure), and on drain.
        """
        topic, key = self._shaper.route(record)
        partitions = await self._partitions_of(topic)
        if partitions is None:
            return True
        partition = self._partitioner(key, partitions, partitions)
        headers = self._shaper.headers(record)
        batch = self.batches.get((topic, partition))
        for _ in range(2):
            if batch is None:
                batch = _Batch(topic, partition, self.producer.create_batch(), tracker)
                self.batches[(topic, partition)] = batch
            if batch.builder.append(timestamp=None, key=key, value=value, headers=headers):
                batch.entries.append((txn, record))
                self.batched += 1
                return True
            if not batch.entries:
                # Larger than an empty batch: produced alone, where a refusal has its remedy.
                # Everything before it on the partition is handed to the producer first.
                del self.batches[(topic, partition)]
                return False
            await self._send_batch(batch)
            if self.failure is not None:
                return True
            batch = None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send_batch(self, batch: _Batch) -> None:
        if self.batches.get((batch.topic, batch.partition)) is batch:
            del self.batches[(batch.topic, batch.partition)]
            self.batched -= len(batch.entries)
        # Closed: a record sent alone later must not slip into it through the producer.
        batch.builder.close()
        try:
            if self._transactions is not None and not self._transactions.open:
                await self._transactions.begin(self)
            future: asyncio.Future[Any] = await self.producer.send_batch(
                batch.builder, batch.topic, partition=batch.partition
            )
        except KafkaError as exc:
            # E.g. no room in the producer's queue within its timeout: these records stay
            # outstanding, nothing at or past them is confirmed; resume from the slot.
            self.fail(exc)
            return
        self._stats.batches += 1
        self.in_flight.add(future)
        future.add_done_callback(lambda f: self._on_batch_ack(f, batch))

    async def send_batches(self) -> None:
        """Hand every open batch to the producer (in the order they were opened)."""
        while self.batches and self.failure is None:
            await self._send_batch(next(iter(self.batches.values())))

    async def flush(self) -> None:
        """Send the batches and wait until Kafka answered everything (callbacks run too)."""
        await self.send_batches()
        await self.producer.flush()
        # flush() returns once Kafka answered; the ack callbacks may not
        # have run yet. asyncio.wait never cancels the sends themselves.
        while self.in_flight or self.replacements:
            await asyncio.wait(self.pending)

    # --- settlement -----------------------------------------------------------------------

    def _watch(
        self, future: asyncio.Future[Any], tracker: AckTracker, txn: Any, record: Outgoing
    ) -> None:
        self.in_flight.add(future)
        # Bind this connection's tracker: after a reconnect, late acks of the old
        # connection's records must not count against the new tracker.
        future.add_done_callback(lambda f: self._on_ack(f, tracker, txn, record))

    def _spawn(self, replacement: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(replacement)
        self.replacements.add(task)
        task.add_done_callback(self.replacements.discard)

    async def _replace(
        self, tracker: AckTracker, txn: Any, record: Outgoing, exc: Exception
    ) -> None:
        try:
            future = await self._send(self._shaper.minimal(record, exc))
        except KafkaError as failure:
            self.fail(failure)
            return
        # The minimal form is never replaced again: a refusal of it stops the relay.
        self._watch(future, tracker, txn, MINIMAL)

    def _stale(self, tracker: AckTracker) -> bool:
        # Exactly-once: an ended session's record; its transaction is aborted, whatever
        # Kafka says.
        return self._transactions is not None and tracker is not self.tracker

    def _on_ack(
        self, future: asyncio.Future[Any], tracker: AckTracker, txn: Any, record: Outgoing
    ) -> None:
        self.in_flight.discard(future)
        if self._stale(tracker):
            return
        acked = self._stats.acked
        self._settle(_outcome(future), tracker, txn, record)
        ACKED.inc(self._stats.acked - acked)

    def _on_batch_ack(self, future: asyncio.Future[Any], batch: _Batch) -> None:
        self.in_flight.discard(future)
        if self._stale(batch.tracker):
            return
        failure = _outcome(future)
        if (
            isinstance(failure, PER_RECORD_ERRORS)
            and len(batch.entries) > 1
            and self.failure is None
        ):
            # Kafka refused the batch as a whole (e.g. larger than the broker takes):
            # that says nothing about each record. Send them one by one; only a record
            # refused on its own becomes a minimal rejection (:meth:`_settle`).
            self._spawn(self._send_each(batch))
            return
        if failure is None:
            self._settle_batch(batch)
            return
        acked = self._stats.acked
        for txn, record in batch.entries:
            self._settle(failure, batch.tracker, txn, record)
        ACKED.inc(self._stats.acked - acked)

    def _settle_batch(self, batch: _Batch) -> None:
        """Kafka acknowledged the whole batch: settle per transaction, not per record.

        Entries are in WAL order, so each transaction's records are consecutive.
        """
        tracker, entries = batch.tracker, batch.entries
        count, start = len(entries), 0
        try:
            while start < count:
                txn = entries[start][0]
                end = start + 1
                while end < count and entries[end][0] is txn:
                    end += 1
                tracker.record_acked(txn, end - start)
                start = end
        except AckOrderError as exc:
            # Never confirm past what does not add up: stop; restart from the slot.
            self.fail(exc)
            return
        self._stats.acked += count
        self.kafka_ok = True
        ACKED.inc(count)
        if tracker.records_outstanding < self._max_in_flight:
            self._room.set()

    async def _send_each(self, batch: _Batch) -> None:
        for txn, record in batch.entries:
            try:
                future = await self._send(record)
            except PER_RECORD_ERRORS as exc:
                await self._replace(batch.tracker, txn, record, exc)
                continue
            except KafkaError as failure:
                self.fail(failure)
                return
            self._watch(future, batch.tracker, txn, record)

    def _settle(
        self, failure: BaseException | None, tracker: AckTracker, txn: Any, record: Outgoing
    ) -> None:
        """Account for Kafka's answer (``failure`` None: acknowledged) about one record."""
        if (
            isinstance(failure, PER_RECORD_ERRORS)
            and record is not MINIMAL
            and self.failure is None
        ):
            # Kafka will never take this record: its transaction stays outstanding
            # until the minimal rejection replacing it is acknowledged.
            self._spawn(self._replace(tracker, txn, record, failure))
            return
        if failure is None:
            try:
                tracker.record_acked(txn)
            except AckOrderError as exc:
                failure = exc
        if failure is not None:
            # Never confirm past a record Kafka did not take: its transaction keeps
            # an outstanding record in the tracker forever. Stop; restart from the slot.
            self.fail(failure)
            return
        self._stats.acked += 1
        self.kafka_ok = True
        if tracker.records_outstanding < self._max_in_flight:
            self._room.set()
