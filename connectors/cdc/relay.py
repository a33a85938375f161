"""The CDC relay: outbox rows from PostgreSQL logical replication into Kafka.

``zapstream relay`` runs one :class:`OutboxRelay`. It

1. makes sure the publication (inserts only, so state write-back into
   ``outbox_jobs`` never echoes into the stream) and the pgoutput slot exist
   (see :mod:`connectors.cdc.provisioning`);
2. streams the slot with ``START_REPLICATION`` (see :mod:`connectors.cdc.replication_stream`;
   the relay sees it only as a :class:`~connectors.cdc.source.ReplicationSource`);
3. turns each inserted row into an ``IntentCaptured`` on ``zapstream.intents``
   keyed by instance and conversation, or an ``IntentRejected`` on
   ``zapstream.invalid`` with the reason (an ``outbox_commands`` row becomes a
   ``CommandRequested`` on ``zapstream.intents``, an ``outbox_controls`` row a
   ``ControlChanged`` on ``zapstream.controls``); records are appended to one batch per
   partition (the partition aiokafka's, Faust's and the Java client's murmur2
   partitioner gives the key) and a batch is produced when full, when no more
   WAL is at hand (after a 2 ms linger) or before the relay waits for room;
4. confirms to PostgreSQL only the end LSN of transactions whose records Kafka
   acknowledged, through :class:`~connectors.cdc.acks.AckTracker`.

Killed at any point, a restarted relay resumes from the slot's confirmed
position: nothing is lost, and transactions produced but not yet confirmed are
produced again (the worker drops the duplicates). PostgreSQL lets one consumer
stream a slot at a time, so a second relay waits as a hot standby, retrying
every ``standby_retry_s``, and takes over when the first one's connection ends.
SIGTERM drains: stop reading WAL, wait for Kafka to acknowledge what is in
flight (bounded by ``drain_timeout_s``), confirm it, close.

Beside the stream, a :class:`~connectors.cdc.slot_monitor.SlotMonitor` on an
ordinary connection exports the slot's lag and retained WAL (also while this
relay is a standby or waits for Kafka) and, while streaming, writes a WAL
heartbeat every ``heartbeat_interval_s`` so an idle outbox does not pin WAL.
The metrics port serves ``/metrics``, ``/healthz`` and ``/readyz`` (200 only
while streaming; see :mod:`connectors.cdc.metrics`).

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
  exceed ``max_record_bytes``, and a row with a column longer than that is
  rejected on its size before anything parses it (the decoder leaves the value
  undecoded; see :func:`~connectors.cdc.outbox_rows.oversized_rejection`).
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
from typing import Any, TypeAlias

import psycopg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    IllegalOperation,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordListTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner, murmur2

from connectors.cdc.acks import AckOrderError, AckTracker
from connectors.cdc.failures import (
    Backoff,
    OutageLog,
    RelayConfigError,
    classify_exception,
)
from connectors.cdc.lsn import Lsn
from connectors.cdc.metrics import (
    ACKED,
    ACTIVE,
    COMMIT_TO_READ,
    CONFIRMED_LSN,
    INVALID_ROWS,
    ROWS,
    TRANSACTIONS,
    LatencyWindow,
)
from connectors.cdc.outbox_rows import (
    INTENT_COLUMNS,
    CapturedIntent,
    command_row_to_record,
    control_row_to_record,
    minimal_rejection,
    oversized_rejection,
    reduced_rejection,
    replay_row_to_record,
    row_to_intent,
    with_cut_values,
)
from connectors.cdc.pgoutput import Begin, Commit, Insert, PgOutputDecoder
from connectors.cdc.provisioning import (
    COMMANDS_TABLE,
    CONTROLS_TABLE,
    OUTBOX_TABLE,
    PUBLISHED_TABLES,
    REPLAYS_TABLE,
    ProvisioningError,
    ensure_replication,
)
from connectors.cdc.replication_messages import PrimaryKeepalive, XLogData, pg_timestamp_to_unix
from connectors.cdc.replication_stream import (
    ReplicationError,
    ReplicationStream,
    ReplicationStreamClosed,
    SlotInUse,
    SlotNotFound,
)
from connectors.cdc.settings import RelaySettings
from connectors.cdc.slot_monitor import SlotMonitor
from connectors.cdc.source import ReplicationSource
from connectors.cdc.transactions import (
    KafkaPosition,
    already_in_kafka,
    position_partition,
    read_position,
    resume_point,
    transactional_id,
)
from connectors.http_endpoints import MetricsServer
from streams.kernel.contract import (
    CONTROLS,
    HEADER_JOB_ID,
    HEADER_LSN,
    HEADER_SCHEMA,
    INTENTS,
    INVALID,
    CommandRequested,
    ControlChanged,
    IntentCaptured,
    IntentRejected,
    Record,
    intents_topic,
)
from streams.kernel.kafka_outage import KafkaOutageWatch
from streams.kernel.producer_stop import stop_producer

log = logging.getLogger(__name__)

Outgoing: TypeAlias = Record | CapturedIntent
"""What the relay produces: a contract record, or an intent already in its JSON form."""
Converted: TypeAlias = (
    CapturedIntent | IntentCaptured | CommandRequested | ControlChanged | IntentRejected
)

_CONVERTERS: dict[str, Callable[..., Converted]] = {
    OUTBOX_TABLE: row_to_intent,
    COMMANDS_TABLE: command_row_to_record,
    REPLAYS_TABLE: replay_row_to_record,
    CONTROLS_TABLE: control_row_to_record,
}

_JOB_ID_COLUMNS: dict[str, str] = {
    OUTBOX_TABLE: "id",
    COMMANDS_TABLE: "job_id",
    REPLAYS_TABLE: "job_id",
}
"""The column naming a row's job, for a rejection built without converting the row."""

_SCHEMA_HEADERS: dict[type, bytes] = {
    cls: cls.SCHEMA.encode()
    for cls in (IntentCaptured, CommandRequested, ControlChanged, IntentRejected, CapturedIntent)
}
"""The ``zapstream-schema`` header value of each record type the relay produces."""

_INVALID_RULE = INVALID_ROWS.labels(reason="rule")
_INVALID_TOO_LARGE = INVALID_ROWS.labels(reason="too_large")
_INVALID_REFUSED = INVALID_ROWS.labels(reason="refused")


class _NotConverted:
    """The row was not converted yet (see :meth:`OutboxRelay._append_intent`)."""


_NOT_CONVERTED = _NotConverted()

_BATCH_LINGER_S = 0.002
"""How long batches wait for more WAL once the source has none at hand (cf. linger.ms)."""
_BATCH_HOLD_S = 0.010
"""How long batches may wait for Kafka to answer earlier ones (see OutboxRelay._stream)."""
_BATCH_POLL_S = 0.0005
"""How often a held batch looks whether Kafka answered, while no WAL comes."""
_BATCH_FULL_RECORDS = 5_000
"""Records waiting in batches beyond which they are sent without lingering."""

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


__all__ = [
    "KeyHashPartitioner",
    "OutboxRelay",
    "RelayConfigError",
    "RelayError",
    "RelayStats",
    "build_producer",
]


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
    batches: int = 0
    """Partition batches handed to the producer (records sent alone not counted)."""
    kafka_commits: int = 0
    """Kafka transactions committed (``exactly_once``)."""
    skipped: int = 0
    """PostgreSQL transactions replayed by the slot but already in Kafka (``exactly_once``)."""
    started: float = dataclasses.field(default_factory=time.monotonic)


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


class OutboxRelay:
    """Streams outbox inserts into Kafka, confirming only what Kafka acknowledged.

    The collaborators default to production ones and can be injected (tests do):
    ``producer`` (an :class:`AIOKafkaProducer` or anything with its
    ``start``/``stop``/``send``/``flush``; with ``partitions_for``/``create_batch``/
    ``send_batch`` too, records are produced in batches), ``source_factory`` (a new
    :class:`~connectors.cdc.source.ReplicationSource` per connection attempt) and
    ``provision`` (makes sure the publication and slot exist, returns the slot's
    confirmed LSN) and ``monitor`` (the :class:`~connectors.cdc.slot_monitor.SlotMonitor`
    exporting the slot's lag and writing heartbeats; by default one on ``postgres.dsn``
    when the source is the production one, none when a ``source_factory`` is injected).

    :meth:`readiness` (``/readyz``) says whether this relay streams the slot now.
    """

    def __init__(
        self,
        settings: RelaySettings,
        producer: AIOKafkaProducer | None = None,
        *,
        source_factory: Callable[[], ReplicationSource] | None = None,
        provision: Callable[[], Awaitable[Lsn]] | None = None,
        monitor: SlotMonitor | None = None,
        clock: Callable[[], float] = time.time,
        position_reader: Callable[[], Awaitable[KafkaPosition | None]] | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._latency = LatencyWindow()
        self._read_lag = LatencyWindow("commit->read", COMMIT_TO_READ)
        self._metrics = MetricsServer(
            settings.metrics_port,
            bind_local=settings.metrics_bind_local,
            log=log,
            ready=self.readiness,
        )
        # What /readyz reports: connecting, standby or streaming (see readiness()).
        self._state = "connecting"
        # False from a Kafka failure until Kafka acknowledges a record again.
        self._kafka_ok = True
        if monitor is None and source_factory is None:
            monitor = SlotMonitor(
                settings.postgres.service_dsn,
                settings.slot,
                query_timeout_s=settings.postgres.query_timeout_s,
                interval_s=settings.slot_metrics_interval_s,
                heartbeat_interval_s=settings.heartbeat_interval_s,
                streaming=self.is_streaming,
            )
        self._monitor = monitor
        self._producer = producer or build_producer(settings)
        # Exactly-once (connectors.cdc.transactions): a transactional producer per streaming
        # session, started only once this relay holds the slot (a standby's InitProducerId
        # would fence the active relay); None of this is used without it.
        self._eos = settings.exactly_once
        self._make_producer: Callable[[], Any] = (
            (lambda: producer) if producer is not None else (lambda: build_producer(settings))
        )
        self._producer_spent = False
        self._read_position = position_reader or (lambda: read_position(settings))
        self._txn_open = False
        self._txn_due = 0.0
        self._kafka_committed = Lsn(0)  # what the last Kafka commit reached (reportable)
        self._skip_before = Lsn(0)  # transactions whose commit starts before it are in Kafka
        self._system_id: str | None = None
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
        # aiokafka's own errors (a broker away, a leader moving): one outage, logged above.
        self._kafka_watch = KafkaOutageWatch("relay", settings.kafka, target=self._kafka_outage)
        # Replacements for records Kafka refused, so the drain waits for them too.
        self._replacements: set[asyncio.Task[None]] = set()
        # The LSN header of the transaction being produced, encoded once for all its records.
        self._lsn_text = ""
        self._lsn_header = b""
        # Batched produce (aiokafka's create_batch/send_batch, see start()): one future
        # per partition batch instead of one per record.
        self._batching = False
        self._batches: dict[tuple[str, int], _Batch] = {}
        self._batched = 0  # records in self._batches
        self._partitions: dict[str, list[int]] = {}
        self._partitioner = KeyHashPartitioner()
        # Records are routed by logical topic (CapturedIntent.topic too); this names them
        # under ZAPSTREAM_KAFKA_TOPIC_PREFIX.
        self._topic_name = settings.kafka.names.by_logical()

    @property
    def stats(self) -> RelayStats:
        return self._stats

    @property
    def confirmed(self) -> Lsn:
        return self._reported

    def is_streaming(self) -> bool:
        """This relay streams the slot now (not a standby, not reconnecting)."""
        return self._state == "streaming"

    def readiness(self) -> tuple[bool, str]:
        """(ready, why) for ``/readyz``: ready only while streaming with Kafka taking records."""
        if self._stopping.is_set():
            return False, "stopping"
        if self._state != "streaming":
            return False, self._state
        if self._failure is not None or not self._kafka_ok:
            return False, "kafka unavailable"
        return True, "streaming"

    def _set_state(self, state: str) -> None:
        self._state = state
        ACTIVE.set(1 if state == "streaming" else 0)

    @property
    def commit_to_ack(self) -> LatencyWindow:
        """Commit->Kafka-ack latencies of recent transactions (:mod:`connectors.cdc.metrics`)."""
        return self._latency

    @property
    def commit_to_read(self) -> LatencyWindow:
        """Commit->Begin-read latencies (PostgreSQL's share of commit->ack)."""
        return self._read_lag

    async def __aenter__(self) -> OutboxRelay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the Kafka producer, retrying with backoff while the brokers are unreachable."""
        if self._started:
            return
        try:
            self._metrics.start()
        except OSError as exc:
            raise RelayConfigError(
                f"cannot serve metrics on port {self.settings.metrics_port} ({exc}): set "
                "ZAPSTREAM_RELAY_METRICS_PORT to a free port, or 0 to switch metrics off"
            ) from exc
        self._set_state("connecting")
        await self._kafka_watch.start()
        if self._monitor is not None:
            # Before Kafka: the slot's lag is exported while the producer waits for brokers.
            await self._monitor.start()
        # A producer without the batch methods (a test's fake) gets one send per record.
        producer = self._producer
        self._batching = all(
            callable(getattr(producer, name, None))
            for name in ("partitions_for", "create_batch", "send_batch")
        )
        if self._eos:
            # The transactional producer starts once this relay holds the slot (run()).
            self._started = True
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
                self._kafka_ok = False
                self._kafka_outage.failed(repr(exc))
                if await self._sleep(backoff.next_delay_s()):
                    return
        self._kafka_outage.recovered()
        self._kafka_ok = True
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
        self._set_state("stopped")
        try:
            if self._monitor is not None:
                await self._monitor.stop()
            if self._started:
                # An idempotent producer never lets a batch expire: with Kafka down its
                # stop() would wait for ever (aio-libs/aiokafka#1101); bounded here. What it
                # held was never confirmed to PostgreSQL, so the next relay produces it again.
                await stop_producer(self._producer, self.settings.drain_timeout_s, what="the relay")
        finally:
            await self._kafka_watch.stop()
            await asyncio.to_thread(self._metrics.stop)

    def _replication_stream(self) -> ReplicationSource:
        s = self.settings
        return ReplicationStream(
            s.postgres.dsn,
            slot=s.slot,
            publication=s.publication,
            connect_timeout_s=s.postgres.connect_timeout_s,
            silence_timeout_s=s.replication_timeout_s,
        )

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
                self._set_state("standby")
                if not announced_standby:
                    log.info("relay standby: slot %s is streamed by another relay; waiting", s.slot)
                    announced_standby = True
                await self._sleep(s.standby_retry_s)
                continue
            except SlotNotFound:
                await source.close()
                self._set_state("connecting")
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
                self._set_state("connecting")
                self._pg_failed(exc)
                await self._sleep(backoff.next_delay_s())
                continue
            self._pg_outage.recovered()
            backoff.reset()
            announced_standby = False
            self._set_state("streaming")
            try:
                if self._eos:
                    await self._begin_session(source, confirmed)
                if self._failure is None:
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
                if not self._eos:  # exactly-once: the open transaction goes with its producer
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(s.drain_timeout_s):
                            await self._producer.flush()
                confirmed = self._reported
                await self._sleep(backoff.next_delay_s())
            finally:
                self._set_state("connecting")
                await source.close()
                if self._eos:
                    await self._end_session()
            if self._failure is not None:
                failure = self._failure
                if isinstance(failure, ProducerFenced):
                    raise RelayError(
                        f"fenced: another relay produces as {transactional_id(s)} (it took "
                        "the slot); this one stops without committing"
                    ) from failure
                if not kafka_transient(failure):
                    raise RelayError("Kafka did not acknowledge a record") from failure
                # E.g. a batch expired while the brokers were away: confirm nothing past
                # it, let the rest settle, and stream again from the slot's position.
                self._kafka_ok = False
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

    # --- exactly-once (connectors.cdc.transactions) -------------------------------------

    async def _begin_session(self, source: ReplicationSource, confirmed: Lsn) -> None:
        """This relay holds the slot: start a transactional producer, read Kafka's position.

        The producer's InitProducerId fences the relay that streamed before and aborts
        what it left open; then the position its last commit stored says which replayed
        transactions Kafka already holds. A Kafka failure is noted (``_fail``) like a
        failed send: the session ends and :meth:`run` retries (or stops, if permanent).
        """
        s = self.settings
        if self._producer_spent:
            self._producer = self._make_producer()  # an aiokafka producer starts only once
        self._producer_spent = True
        try:
            async with asyncio.timeout(s.kafka.request_timeout_s):
                await self._producer.start()
                stored = await self._read_position()
        except TimeoutError:
            self._fail(KafkaTimeoutError("no transactional producer within the request timeout"))
            return
        except KafkaError as exc:
            if not kafka_transient(exc) and not isinstance(exc, ProducerFenced):
                raise RelayConfigError(
                    f"Kafka refused the relay's transactions as {transactional_id(s)} ({exc!r}): "
                    "with ACLs, allow it Write and Describe on that transactional id and Read "
                    "on that group; or set ZAPSTREAM_RELAY_EXACTLY_ONCE=false"
                ) from exc
            self._fail(exc)
            return
        identity = getattr(source, "identity", None)
        self._system_id = getattr(identity, "system_id", None)
        resume = resume_point(stored, slot=s.slot, system_id=self._system_id)
        self._skip_before = resume if resume is not None else Lsn(0)
        self._txn_open = False
        self._kafka_ok = True
        self._kafka_outage.recovered()
        confirmed = max(confirmed, self._reported)
        if resume is not None and resume > confirmed:
            # Committed in Kafka but never confirmed (the last relay died in between).
            log.info(
                "exactly-once: Kafka holds the slot's records up to %s, past the confirmed %s; "
                "transactions before it are skipped",
                resume,
                confirmed,
            )
            await source.send_status(flush=resume)
            self._reported = resume
            CONFIRMED_LSN.set(resume.value)

    async def _end_session(self) -> None:
        """Drop the session's producer; an open transaction is aborted by the next one's start."""
        self._tracker = None  # late answers about this session's records are ignored
        self._txn_open = False
        for task in self._replacements:
            task.cancel()
        producer = self._producer
        try:
            async with asyncio.timeout(self.settings.drain_timeout_s):
                await producer.stop()
        except (TimeoutError, KafkaError) as exc:
            log.debug("exactly-once: the session's producer did not stop cleanly: %r", exc)
            sender = getattr(producer, "_sender", None)  # aiokafka's, still retrying
            if sender is not None:
                with contextlib.suppress(Exception):
                    await sender.close()
        self._in_flight.clear()
        self._replacements.clear()

    async def _begin_txn(self) -> None:
        """Open the Kafka transaction the next records go into (raises KafkaError)."""
        tracker = self._tracker
        assert tracker is not None
        try:
            await self._producer.begin_transaction()
        except IllegalOperation as exc:  # not a KafkaError: the producer is in a bad state
            raise KafkaError(f"cannot begin a Kafka transaction: {exc}") from exc
        self._txn_open = True
        self._txn_due = time.monotonic() + self.settings.transaction_interval_s
        # Nothing was open: everything acknowledged so far is committed, confirmable.
        self._kafka_committed = max(self._kafka_committed, tracker.confirmed)

    async def _commit_txn(self, source: ReplicationSource, *, draining: bool = False) -> None:
        """Commit the open Kafka transaction with the position it reaches, then confirm it.

        Called at a PostgreSQL transaction boundary only: every record produced belongs
        to a transaction whose Commit was read. The records must all be acknowledged
        first (one Kafka refused is replaced in this transaction); on any failure
        nothing is committed and the session ends (:meth:`_end_session`).
        """
        tracker = self._tracker
        assert tracker is not None
        await self._send_batches()
        while (self._in_flight or self._replacements) and self._failure is None:
            if self._stopping.is_set() and not draining:
                return  # the drain commits, bounded (or leaves it to be aborted)
            await asyncio.wait(
                set(self._in_flight) | set(self._replacements),
                timeout=self.settings.status_interval_s,
            )
        if self._failure is not None:
            return
        lsn = tracker.confirmed
        if tracker.records_outstanding or tracker.pending_transactions:
            self._fail(RelayError("a Kafka transaction would commit records not acknowledged"))
            return
        position = KafkaPosition(lsn, self.settings.slot, self._system_id)
        try:
            await self._producer.send_offsets_to_transaction(
                {position_partition(self.settings): (0, position.metadata())},
                transactional_id(self.settings),
            )
            await self._producer.commit_transaction()
        except (KafkaError, IllegalOperation) as exc:
            self._fail(exc if isinstance(exc, KafkaError) else KafkaError(str(exc)))
            return
        self._txn_open = False
        self._kafka_committed = max(self._kafka_committed, lsn)
        self._stats.kafka_commits += 1
        await self._report(source)

    def _log_summary(self) -> None:
        log.info(
            "relay stopped: %d transactions, %d intents, %d rejected (%d reduced), "
            "%d batches, confirmed %s, %.1fs; %s; %s",
            self._stats.transactions,
            self._stats.intents,
            self._stats.rejected,
            self._stats.reduced,
            self._stats.batches,
            self._reported,
            time.monotonic() - self._stats.started,
            self._latency.summary(),
            self._read_lag.summary(),
        )
        if self._eos:
            log.info(
                "relay exactly-once: %d Kafka transactions committed, %d replayed PostgreSQL "
                "transactions skipped (already in Kafka)",
                self._stats.kafka_commits,
                self._stats.skipped,
            )

    def _on_acknowledged(self, commit_ts_us: int, acked_at: float) -> None:
        """A transaction's last record was acknowledged: observe its commit->ack latency."""
        self._latency.observe(acked_at - pg_timestamp_to_unix(commit_ts_us))

    async def _stream(self, source: ReplicationSource, confirmed: Lsn) -> Lsn:
        s = self.settings
        eos = self._eos
        if eos:
            # The session may have confirmed what Kafka held (_begin_session).
            confirmed = max(confirmed, self._reported)
            self._kafka_committed = confirmed
        skip_before = self._skip_before  # exactly-once: replayed transactions Kafka holds
        skipping = False
        tracker = AckTracker(confirmed, on_acknowledged=self._on_acknowledged, clock=self._clock)
        self._tracker = tracker
        self._reported = max(self._reported, confirmed)
        # outbox_jobs rows carry only the columns an intent is made of (the rest are
        # stepped over); a row that needs them all is decoded again (see below).
        # Size before parse: a value over max_record_bytes is never decoded (nor parsed);
        # its row becomes a rejection on its size (see _produce_oversized).
        decoder = PgOutputDecoder(
            columns={OUTBOX_TABLE: INTENT_COLUMNS},
            max_value_bytes=s.max_record_bytes,
            oversized_head_bytes=s.rejected_value_max_bytes,
        )
        decode = decoder.decode
        stats = self._stats
        rows_counted = stats.intents + stats.rejected
        # Batches of an earlier connection were never sent: their rows are streamed again.
        self._batches.clear()
        self._batched = 0
        self._partitions.clear()
        log.info("relay streaming slot %s from %s", s.slot, confirmed)
        txn: Any = None
        committed_at: str | None = None
        lsn_text = str(confirmed)
        next_status = time.monotonic() + s.status_interval_s
        # When the batches must go at the latest: the first moment the source ran
        # dry with batches waiting, plus the linger. None while nothing lingers.
        linger_until: float | None = None
        hold_until = 0.0
        while not self._stopping.is_set() and self._failure is None:
            if self._batches:
                # Batches fill while WAL is already at hand; once the source has
                # nothing buffered they are sent, before waiting for more.
                message = source.read_nowait()
                if message is None and self._batched < _BATCH_FULL_RECORDS:
                    # A moment's linger: under load more WAL is on its way and fills
                    # the batches further (fewer, larger produce requests). Bounded
                    # from the first dry read, not from each message: WAL trickling
                    # in every millisecond (small transactions) must not hold the
                    # batches back until they fill.
                    now = time.monotonic()
                    if linger_until is None:
                        linger_until = now + _BATCH_LINGER_S
                        hold_until = now + _BATCH_HOLD_S
                    if self._in_flight and now < hold_until:
                        # Kafka is still answering earlier batches, and aiokafka keeps
                        # one request in flight per broker: sent now, these would only
                        # wait behind it (and the relay with them). Keep filling them
                        # meanwhile (bounded by _BATCH_HOLD_S): fewer, larger requests.
                        message = await source.read(timeout_s=_BATCH_POLL_S)
                        if message is None:
                            continue
                    elif now < linger_until:
                        message = await source.read(timeout_s=linger_until - now)
                if message is None:
                    await self._send_batches()
                    linger_until = None
                    continue
            else:
                linger_until = None
                message = None
                if self._txn_open and txn is None:
                    # Exactly-once, at a transaction boundary with no more WAL at hand:
                    # commit now rather than hold read_committed consumers until the interval.
                    message = source.read_nowait()
                    if message is None:
                        await self._commit_txn(source)
                        continue
                if message is None:
                    message = await source.read(timeout_s=s.status_interval_s)
            if type(message) is XLogData:
                decoded = decode(message.payload)
                kind = type(decoded)
                if kind is Insert and not skipping:
                    assert isinstance(decoded, Insert)
                    table = decoded.relation.name
                    if table == OUTBOX_TABLE:
                        # The common case first, without a coroutine (see _append_intent).
                        row = decoded.new
                        if decoded.oversized:
                            # A column the intent is made of is too large to parse.
                            full = decoder.decode_complete(message.payload)
                            assert isinstance(full, Insert)
                            await self._produce_oversized(txn, table, full, lsn_text, committed_at)
                            converted = None
                        else:
                            converted = self._append_intent(txn, row, lsn_text, committed_at)
                        if converted is not None:
                            if not decoded.complete:
                                # A rejection carries (and a reduction cuts) every column; one
                                # the intent does not read may be oversized: its head, cut.
                                full = decoder.decode_complete(message.payload)
                                assert isinstance(full, Insert)
                                row = with_cut_values(full.new, full.oversized)
                                if not isinstance(converted, CapturedIntent):
                                    converted = _NOT_CONVERTED  # rejected: again, whole row
                            await self._produce(txn, table, row, lsn_text, committed_at, converted)
                    elif table in PUBLISHED_TABLES:
                        if decoded.oversized:
                            await self._produce_oversized(
                                txn, table, decoded, lsn_text, committed_at
                            )
                        else:
                            await self._produce(txn, table, decoded.new, lsn_text, committed_at)
                elif kind is Begin:
                    assert isinstance(decoded, Begin)
                    commit_ts_us = decoded.commit_ts_us
                    txn = tracker.begin(commit_ts_us)
                    self._read_lag.observe(self._clock() - pg_timestamp_to_unix(commit_ts_us))
                    # One datetime per transaction, for the records' committed_at.
                    committed_at = decoded.commit_ts.isoformat()
                    lsn_text = str(decoded.final_lsn)
                    if eos:
                        # Replayed by the slot, but committed to Kafka by an earlier relay:
                        # its inserts are not produced again.
                        skipping = already_in_kafka(decoded.final_lsn, skip_before)
                elif kind is Commit:
                    assert isinstance(decoded, Commit)
                    tracker.commit(txn, decoded.end_lsn)
                    stats.transactions += 1
                    TRANSACTIONS.inc()
                    rows = stats.intents + stats.rejected
                    ROWS.inc(rows - rows_counted)
                    rows_counted = rows
                    txn = None
                    if skipping:
                        stats.skipped += 1
                        skipping = False
            elif isinstance(message, PrimaryKeepalive):
                tracker.keepalive(message.wal_end)
                if message.reply_requested:
                    await self._report(source, force=True)
            now = time.monotonic()
            if eos and txn is None and self._txn_open and now >= self._txn_due:
                # Exactly-once: the interval passed; this is a transaction boundary.
                await self._commit_txn(source)
            if now >= next_status:
                await self._report(source)
                next_status = now + s.status_interval_s
        await self._drain(source, at_boundary=txn is None)
        # Exactly-once: only what was confirmed is known to be committed in Kafka.
        return self._reported if self._eos else tracker.confirmed

    def _append_intent(
        self, txn: Any, row: dict[str, str | None], lsn: str, committed_at: str | None
    ) -> Converted | _NotConverted | None:
        """Produce an ``outbox_jobs`` row synchronously if nothing special applies; None if done.

        Done only when: batching, room under ``max_in_flight``, no failure, the
        row a valid intent within ``max_record_bytes``, and its partition's
        batch open with room for it. Otherwise nothing happened yet: the caller
        goes the general way (:meth:`_produce`) with what is returned (the
        converted row, or ``_NOT_CONVERTED``). Same accounting and order as there.
        """
        tracker = self._tracker
        assert tracker is not None
        if (
            not self._batching
            or tracker.records_outstanding >= self.settings.max_in_flight
            or self._failure is not None
        ):
            return _NOT_CONVERTED
        intent = row_to_intent(row, lsn=lsn, committed_at=committed_at)
        if type(intent) is not CapturedIntent:
            return intent
        value = intent.dumps()
        topic = self._topic_name[intent.topic]
        partitions = self._partitions.get(topic)
        if len(value) > self.settings.max_record_bytes or partitions is None:
            return intent
        key = intent.partition_key
        batch = self._batches.get((topic, self._partitioner(key, partitions, partitions)))
        if batch is None or not batch.builder.append(
            timestamp=None, key=key, value=value, headers=self._headers(intent)
        ):
            return intent
        self._stats.intents += 1
        tracker.record_sent(txn)
        batch.entries.append((txn, intent))
        self._batched += 1
        return None

    async def _produce_oversized(
        self, txn: Any, table: str, insert: Insert, lsn: str, committed_at: str | None
    ) -> None:
        """Produce the rejection of a row with a value over ``max_record_bytes``, unparsed.

        The decoder left those values undecoded (``insert.oversized``); the rejection names
        their sizes and the setting and carries their heads (see ``oversized_rejection``).
        """
        s = self.settings
        assert insert.oversized
        rejection = oversized_rejection(
            row=insert.new,
            oversized=insert.oversized,
            job_id_column=_JOB_ID_COLUMNS.get(table),
            limit_bytes=s.max_record_bytes,
            lsn=lsn,
            committed_at=committed_at,
            max_record_bytes=s.max_record_bytes,
            max_value_bytes=s.rejected_value_max_bytes,
        )
        row = with_cut_values(insert.new, insert.oversized)
        await self._produce(txn, table, row, lsn, committed_at, rejection, too_large=True)

    async def _produce(
        self,
        txn: Any,
        table: str,
        row: dict[str, str | None],
        lsn: str,
        committed_at: str | None,
        converted: Converted | _NotConverted = _NOT_CONVERTED,
        *,
        too_large: bool = False,
    ) -> None:
        tracker = self._tracker
        assert tracker is not None
        while tracker.records_outstanding >= self.settings.max_in_flight:
            if self._stopping.is_set() or self._failure is not None:
                # Leave the row unsent: its transaction stays open in the tracker,
                # so nothing at or past it is confirmed, and the slot replays it.
                return
            if self._batches:
                # Records waiting in unsent batches count as outstanding: send them
                # before waiting for acknowledgements that would otherwise never come.
                await self._send_batches()
                continue
            self._room.clear()
            await self._room.wait()
        if isinstance(converted, _NotConverted):
            converted = _CONVERTERS[table](row, lsn=lsn, committed_at=committed_at)
        record, value = self._producible(converted, row)
        if type(record) is IntentRejected:
            self._stats.rejected += 1
            rule = type(converted) is IntentRejected and not too_large
            (_INVALID_RULE if rule else _INVALID_TOO_LARGE).inc()
            if too_large:
                self._stats.reduced += 1  # reduced before it came here (_produce_oversized)
            log.warning("%s row for job %s rejected: %s", table, record.job_id, record.reason)
        else:
            self._stats.intents += 1
        tracker.record_sent(txn)
        if self._batching and await self._append(tracker, txn, record, value):
            return
        try:
            future = await self._send(record, value)
            watched: Outgoing = record
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

    def _producible(self, record: Converted, row: dict[str, str | None]) -> tuple[Converted, bytes]:
        """The record and its encoding, or a reduced rejection if it is over ``max_record_bytes``.

        The record is encoded once, here: the bytes measured are the bytes produced.
        """
        s = self.settings
        value = record.dumps()
        size = len(value)
        if size <= s.max_record_bytes:
            return record, value
        self._stats.reduced += 1
        if isinstance(record, IntentRejected):
            reason = record.reason
        else:
            reason = f"record too large: {size} bytes over the relay's {s.max_record_bytes}"
        job_id = getattr(record, "job_id", None)
        reduced = reduced_rejection(
            job_id=job_id,
            reason=reason,
            row=row,
            lsn=record.lsn,
            committed_at=getattr(record, "committed_at", None),
            max_record_bytes=s.max_record_bytes,
            max_value_bytes=s.rejected_value_max_bytes,
        )
        return reduced, reduced.dumps()

    def _minimal(self, record: Outgoing, exc: BaseException) -> IntentRejected:
        self._stats.reduced += 1
        if isinstance(record, CapturedIntent):
            record = record.record()
        if not isinstance(record, IntentRejected):
            _INVALID_REFUSED.inc()
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
        elif isinstance(record, ControlChanged):
            reference = {"id": str(record.control_id)}
        else:
            reference = None
        return minimal_rejection(
            job_id=job_id if isinstance(job_id, int) else None,
            reason=f"record too large or refused by Kafka: {exc!r}",
            lsn=str(getattr(record, "lsn", "0/0")),
            committed_at=getattr(record, "committed_at", None),
            row=reference,
        )

    def _route(self, record: Outgoing) -> tuple[str, bytes]:
        """Topic and key: intents by conversation, controls by target, rejections by job id."""
        topic, key = self._route_logical(record)
        return self._topic_name[topic], key

    @staticmethod
    def _route_logical(record: Outgoing) -> tuple[str, bytes]:
        """The logical topic (streams.kernel.contract) and the key."""
        if isinstance(record, CapturedIntent):
            return record.topic, record.partition_key
        if isinstance(record, IntentCaptured):
            # Operational and bulk intents travel apart (streams.kernel.contract.BULK_INTENTS).
            return intents_topic(record.priority), record.partition_key
        if isinstance(record, CommandRequested):
            return INTENTS, record.partition_key
        if isinstance(record, ControlChanged):
            # One partition, compacted by "<kind>:<target>": every worker reads every control.
            return CONTROLS, record.partition_key
        assert isinstance(record, IntentRejected)
        return INVALID, str(record.job_id).encode()

    def _headers(self, record: Outgoing) -> list[tuple[str, bytes]]:
        lsn: str = getattr(record, "lsn", "0/0")
        if lsn != self._lsn_text:
            # Every record of a transaction carries the same LSN: encode it once.
            self._lsn_text, self._lsn_header = lsn, lsn.encode()
        return [
            (HEADER_SCHEMA, _SCHEMA_HEADERS[type(record)]),
            (HEADER_LSN, self._lsn_header),
            (HEADER_JOB_ID, str(getattr(record, "job_id", None)).encode()),
        ]

    async def _send(self, record: Outgoing, value: bytes | None = None) -> asyncio.Future[Any]:
        """Hand one record to the producer; ``value`` is its encoding when already made."""
        topic, key = self._route(record)
        if self._eos and not self._txn_open:
            await self._begin_txn()
        future: asyncio.Future[Any] = await self._producer.send(
            topic,
            record.dumps() if value is None else value,
            key=key,
            headers=self._headers(record),
        )
        return future

    async def _append(self, tracker: AckTracker, txn: Any, record: Outgoing, value: bytes) -> bool:
        """Add a record to its partition's batch; False if it must go alone (:meth:`_send`).

        The partition is the one aiokafka's (Faust's, Java's) murmur2 partitioner
        gives the key. A batch is sent when full, before the relay waits for WAL
        (:meth:`_stream`) or for acknowledgements (backpressure), and on drain.
        Kafka answers for the whole batch; each record is then settled as if
        sent alone, so the ack accounting is the per-record one.
        """
        topic, key = self._route(record)
        partitions = self._partitions.get(topic)
        if partitions is None:
            try:
                partitions = sorted(await self._producer.partitions_for(topic))
            except KafkaError as exc:
                # Like a send failing for want of metadata: the record stays outstanding.
                self._fail(exc)
                return True
            self._partitions[topic] = partitions
        partition = self._partitioner(key, partitions, partitions)
        headers = self._headers(record)
        batch = self._batches.get((topic, partition))
        for _ in range(2):
            if batch is None:
                batch = _Batch(topic, partition, self._producer.create_batch(), tracker)
                self._batches[(topic, partition)] = batch
            if batch.builder.append(timestamp=None, key=key, value=value, headers=headers):
                batch.entries.append((txn, record))
                self._batched += 1
                return True
            if not batch.entries:
                # Larger than an empty batch: produced alone, where a refusal has its remedy.
                # Everything before it on the partition is handed to the producer first.
                del self._batches[(topic, partition)]
                return False
            await self._send_batch(batch)
            if self._failure is not None:
                return True
            batch = None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send_batch(self, batch: _Batch) -> None:
        if self._batches.get((batch.topic, batch.partition)) is batch:
            del self._batches[(batch.topic, batch.partition)]
            self._batched -= len(batch.entries)
        # Closed: a record sent alone later must not slip into it through the producer.
        batch.builder.close()
        try:
            if self._eos and not self._txn_open:
                await self._begin_txn()
            future: asyncio.Future[Any] = await self._producer.send_batch(
                batch.builder, batch.topic, partition=batch.partition
            )
        except KafkaError as exc:
            # E.g. no room in the producer's queue within its timeout: these records stay
            # outstanding, nothing at or past them is confirmed; resume from the slot.
            self._fail(exc)
            return
        self._stats.batches += 1
        self._in_flight.add(future)
        future.add_done_callback(lambda f: self._on_batch_ack(f, batch))

    async def _send_batches(self) -> None:
        """Hand every open batch to the producer (in the order they were opened)."""
        while self._batches and self._failure is None:
            await self._send_batch(next(iter(self._batches.values())))

    def _watch(
        self, future: asyncio.Future[Any], tracker: AckTracker, txn: Any, record: Outgoing
    ) -> None:
        self._in_flight.add(future)
        # Bind this connection's tracker: after a reconnect, late acks of the old
        # connection's records must not count against the new tracker.
        future.add_done_callback(lambda f: self._on_ack(f, tracker, txn, record))

    async def _replace(
        self, tracker: AckTracker, txn: Any, record: Outgoing, exc: Exception
    ) -> None:
        try:
            future = await self._send(self._minimal(record, exc))
        except KafkaError as failure:
            self._fail(failure)
            return
        # The minimal form is never replaced again: a refusal of it stops the relay.
        self._watch(future, tracker, txn, _MINIMAL)

    def _on_ack(
        self, future: asyncio.Future[Any], tracker: AckTracker, txn: Any, record: Outgoing
    ) -> None:
        self._in_flight.discard(future)
        if self._eos and tracker is not self._tracker:
            return  # an ended session's record: its transaction is aborted, whatever Kafka says
        acked = self._stats.acked
        self._settle(_outcome(future), tracker, txn, record)
        ACKED.inc(self._stats.acked - acked)

    def _on_batch_ack(self, future: asyncio.Future[Any], batch: _Batch) -> None:
        self._in_flight.discard(future)
        if self._eos and batch.tracker is not self._tracker:
            return  # an ended session's batch (see _on_ack)
        failure = _outcome(future)
        if (
            isinstance(failure, PER_RECORD_ERRORS)
            and len(batch.entries) > 1
            and self._failure is None
        ):
            # Kafka refused the batch as a whole (e.g. larger than the broker takes):
            # that says nothing about each record. Send them one by one; only a record
            # refused on its own becomes a minimal rejection (:meth:`_settle`).
            task = asyncio.get_running_loop().create_task(self._send_each(batch))
            self._replacements.add(task)
            task.add_done_callback(self._replacements.discard)
            return
        if failure is None:
            self._settle_batch(batch)
            return
        acked = self._stats.acked
        for txn, record in batch.entries:
            self._settle(failure, batch.tracker, txn, record)
        ACKED.inc(self._stats.acked - acked)

    def _settle_batch(self, batch: _Batch) -> None:
        """Kafka acknowledged the whole batch: :meth:`_settle` per transaction, not per record.

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
            self._fail(exc)
            return
        self._stats.acked += count
        self._kafka_ok = True
        ACKED.inc(count)
        if tracker.records_outstanding < self.settings.max_in_flight:
            self._room.set()

    async def _send_each(self, batch: _Batch) -> None:
        for txn, record in batch.entries:
            try:
                future = await self._send(record)
            except PER_RECORD_ERRORS as exc:
                await self._replace(batch.tracker, txn, record, exc)
                continue
            except KafkaError as failure:
                self._fail(failure)
                return
            self._watch(future, batch.tracker, txn, record)

    def _settle(
        self, failure: BaseException | None, tracker: AckTracker, txn: Any, record: Outgoing
    ) -> None:
        """Account for Kafka's answer (``failure`` None: acknowledged) about one record."""
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
        self._kafka_ok = True
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
        if self._txn_open:
            # Exactly-once: acknowledged is not committed; confirm what the last commit reached.
            confirmed = self._kafka_committed
        if confirmed < self._reported:
            raise RelayError(f"confirmed LSN would move back from {self._reported} to {confirmed}")
        if confirmed > self._reported or force:
            await source.send_status(flush=confirmed)
            self._reported = confirmed
            CONFIRMED_LSN.set(confirmed.value)

    async def _drain(self, source: ReplicationSource, *, at_boundary: bool = True) -> None:
        """Wait (bounded) for Kafka to acknowledge what is in flight, then confirm it.

        Exactly-once: commit the open Kafka transaction if the relay stopped at a
        PostgreSQL transaction boundary (``at_boundary``); inside one it is left open, to be
        aborted by the next relay's start: a commit would hold part of a transaction
        that the slot replays whole.
        """
        if self._failure is not None:
            return
        if self._eos:
            if self._txn_open and at_boundary:
                try:
                    async with asyncio.timeout(self.settings.drain_timeout_s):
                        await self._commit_txn(source, draining=True)
                except TimeoutError:
                    log.warning("drain: the Kafka transaction did not commit within the bound")
            with contextlib.suppress(ReplicationError):
                await self._report(source, force=True)
            return
        try:
            async with asyncio.timeout(self.settings.drain_timeout_s):
                await self._send_batches()
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


def _outcome(future: asyncio.Future[Any]) -> BaseException | None:
    """What a done send future says: None if Kafka acknowledged, else the failure."""
    # exception() raises CancelledError on a cancelled future: ask cancelled() first.
    if future.cancelled():
        return RelayError("Kafka send was cancelled")
    return future.exception()


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
