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

The relay is split by concept: this module is the supervisor (provisioning,
standby, reconnect, drain; its :class:`SlotState`); one connection is streamed by
:class:`~connectors.cdc.streaming.Streamer`, whose payloads the sans-IO
:class:`~connectors.cdc.assembler.TransactionAssembler` turns into transactions and
records; :mod:`connectors.cdc.shaping` converts, reduces, routes and labels each
record; :class:`~connectors.cdc.publisher.Publisher` produces them in partition
batches and settles Kafka's answers; :mod:`connectors.cdc.exactly_once` holds the
Kafka transactions of ``exactly_once``.

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
import enum
import logging
import time
from collections.abc import Awaitable, Callable

import psycopg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, ProducerFenced

from connectors.cdc.exactly_once import KafkaTransactions
from connectors.cdc.failures import (
    Backoff,
    OutageLog,
    RelayConfigError,
    RelayError,
    classify_exception,
)
from connectors.cdc.lsn import Lsn
from connectors.cdc.metrics import ACTIVE, LatencyWindow, RelayStats
from connectors.cdc.provisioning import ProvisioningError, ensure_replication
from connectors.cdc.publisher import KeyHashPartitioner, Publisher, build_producer, kafka_transient
from connectors.cdc.replication_stream import (
    ReplicationError,
    ReplicationStream,
    ReplicationStreamClosed,
    SlotInUse,
    SlotNotFound,
)
from connectors.cdc.settings import RelaySettings
from connectors.cdc.shaping import RecordShaper
from connectors.cdc.slot_monitor import SlotMonitor
from connectors.cdc.source import ReplicationSource
from connectors.cdc.streaming import Streamer
from connectors.cdc.transactions import KafkaPosition, read_position, transactional_id
from connectors.http_endpoints import MetricsServer
from streams.kernel.kafka_outage import KafkaOutageWatch
from streams.kernel.producer_stop import stop_producer

log = logging.getLogger(__name__)

__all__ = [
    "KeyHashPartitioner",
    "OutboxRelay",
    "RelayConfigError",
    "RelayError",
    "RelayStats",
    "SlotState",
    "build_producer",
]


class SlotState(enum.Enum):
    """Where this relay stands with the slot (``/readyz``'s reason while not streaming)."""

    CONNECTING = "connecting"
    STANDBY = "standby"
    """Another relay streams the slot; this one retries every ``standby_retry_s``."""
    STREAMING = "streaming"
    STOPPED = "stopped"


class _Lifecycle(enum.Enum):
    """The relay's own life (start once, stop once)."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"


class OutboxRelay:
    """Supervises the relay: provisioning, standby, reconnects, drain (see the module docstring).

    The collaborators default to production ones and can be injected (tests do):
    ``producer`` (an :class:`AIOKafkaProducer` or anything with its
    ``start``/``stop``/``send``/``flush``; with ``partitions_for``/``create_batch``/
    ``send_batch`` too, records are produced in batches), ``source_factory`` (a new
    :class:`~connectors.cdc.source.ReplicationSource` per connection attempt),
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
        self._metrics = MetricsServer(
            settings.metrics_port,
            bind_local=settings.metrics_bind_local,
            log=log,
            ready=self.readiness,
        )
        self._state = SlotState.CONNECTING
        self._lifecycle = _Lifecycle.CREATED
        self._stopping = asyncio.Event()
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
        self._new_source = source_factory or self._replication_stream
        self._provision = provision or self._ensure_replication
        self._stats = RelayStats()
        shaper = RecordShaper(settings, self._stats)
        stopping = self._stopping.is_set
        # Exactly-once (connectors.cdc.exactly_once): None of it is used without it.
        self._eos = (
            KafkaTransactions(
                settings,
                self._stats,
                make_producer=(
                    (lambda: producer)
                    if producer is not None
                    else (lambda: build_producer(settings))
                ),
                read_position=position_reader or (lambda: read_position(settings)),
                stopping=stopping,
            )
            if settings.exactly_once
            else None
        )
        self._publisher = Publisher(
            settings,
            producer or build_producer(settings),
            shaper,
            self._stats,
            stopping=stopping,
            transactions=self._eos,
        )
        self._streamer = Streamer(
            settings,
            self._publisher,
            shaper,
            self._stats,
            transactions=self._eos,
            stopping=stopping,
            clock=clock,
        )
        self._route = shaper.route
        self._pg_outage = OutageLog("PostgreSQL", log)
        self._kafka_outage = OutageLog("Kafka", log)
        # aiokafka's own errors (a broker away, a leader moving): one outage, logged above.
        self._kafka_watch = KafkaOutageWatch("relay", settings.kafka, target=self._kafka_outage)

    @property
    def stats(self) -> RelayStats:
        return self._stats

    @property
    def confirmed(self) -> Lsn:
        return self._streamer.reported

    @property
    def state(self) -> SlotState:
        return self._state

    @property
    def commit_to_ack(self) -> LatencyWindow:
        """Commit->Kafka-ack latencies of recent transactions (:mod:`connectors.cdc.metrics`)."""
        return self._streamer.commit_to_ack

    @property
    def commit_to_read(self) -> LatencyWindow:
        """Commit->Begin-read latencies (PostgreSQL's share of commit->ack)."""
        return self._streamer.commit_to_read

    def is_streaming(self) -> bool:
        """This relay streams the slot now (not a standby, not reconnecting)."""
        return self._state is SlotState.STREAMING

    def readiness(self) -> tuple[bool, str]:
        """(ready, why) for ``/readyz``: ready only while streaming with Kafka taking records."""
        if self._stopping.is_set():
            return False, "stopping"
        if self._state is not SlotState.STREAMING:
            return False, self._state.value
        if self._publisher.failure is not None or not self._publisher.kafka_ok:
            return False, "kafka unavailable"
        return True, "streaming"

    def _set_state(self, state: SlotState) -> None:
        self._state = state
        ACTIVE.set(1 if state is SlotState.STREAMING else 0)

    # --- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> OutboxRelay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the Kafka producer, retrying with backoff while the brokers are unreachable."""
        if self._lifecycle is not _Lifecycle.CREATED:
            return
        try:
            self._metrics.start()
        except OSError as exc:
            raise RelayConfigError(
                f"cannot serve metrics on port {self.settings.metrics_port} ({exc}): set "
                "ZAPSTREAM_RELAY_METRICS_PORT to a free port, or 0 to switch metrics off"
            ) from exc
        self._set_state(SlotState.CONNECTING)
        await self._kafka_watch.start()
        if self._monitor is not None:
            # Before Kafka: the slot's lag is exported while the producer waits for brokers.
            await self._monitor.start()
        self._publisher.use(self._publisher.producer)
        # Exactly-once: the transactional producer starts once this relay holds the slot.
        if self._eos is not None or await self._start_producer():
            self._lifecycle = _Lifecycle.RUNNING

    async def _start_producer(self) -> bool:
        """Start the producer, waiting out Kafka outages; False if a stop came first."""
        backoff = self._backoff()
        while True:
            try:
                await self._publisher.producer.start()
                break
            except KafkaError as exc:
                if not exc.retriable:
                    raise RelayConfigError(
                        f"Kafka refused the relay: {exc!r}; check ZAPSTREAM_KAFKA_BROKERS"
                    ) from exc
                self._publisher.kafka_ok = False
                self._kafka_outage.failed(repr(exc))
                if await self._sleep(backoff.next_delay_s()):
                    return False
        self._kafka_outage.recovered()
        self._publisher.kafka_ok = True
        return True

    def request_stop(self) -> None:
        """Ask :meth:`run` to drain and return (signal handlers call this)."""
        self._stopping.set()
        # Wake a send blocked on backpressure so it sees the stop.
        self._publisher.wake()

    async def stop(self) -> None:
        if self._lifecycle is _Lifecycle.STOPPED:
            return
        started = self._lifecycle is _Lifecycle.RUNNING
        self._lifecycle = _Lifecycle.STOPPED
        self.request_stop()
        self._set_state(SlotState.STOPPED)
        try:
            if self._monitor is not None:
                await self._monitor.stop()
            if started:
                # An idempotent producer never lets a batch expire: with Kafka down its
                # stop() would wait for ever (aio-libs/aiokafka#1101); bounded here. What it
                # held was never confirmed to PostgreSQL, so the next relay produces it again.
                await stop_producer(
                    self._publisher.producer, self.settings.drain_timeout_s, what="the relay"
                )
        finally:
            await self._kafka_watch.stop()
            await asyncio.to_thread(self._metrics.stop)

    def _backoff(self) -> Backoff:
        return Backoff(self.settings.reconnect_initial_s, self.settings.reconnect_max_s)

    async def _sleep(self, delay_s: float) -> bool:
        """Wait ``delay_s`` or until a stop is requested; True if stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay_s)
        return self._stopping.is_set()

    # --- provisioning -------------------------------------------------------------------

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
                return await self._provision()
            except ProvisioningError as exc:
                raise RelayConfigError(str(exc)) from exc
            except psycopg.Error as exc:
                self._pg_failed(exc)
                if await self._sleep(backoff.next_delay_s()):
                    return None
        return None

    def _pg_failed(self, exc: BaseException) -> None:
        """Permanent: raise RelayConfigError. Transient: note the outage (logged once)."""
        verdict = classify_exception(exc)
        if not verdict.retriable:
            raise RelayConfigError(f"PostgreSQL: {verdict.problem}") from exc
        self._pg_outage.failed(verdict.problem)

    # --- supervision --------------------------------------------------------------------

    async def run(self) -> None:
        """Stream until :meth:`request_stop`; wait as a standby while another relay has the slot.

        Transient PostgreSQL and Kafka failures are waited out. Raises
        :class:`RelayConfigError` for a permanent one and :class:`RelayError`
        once Kafka refused or cancelled a record for good.
        """
        backoff = self._backoff()
        confirmed = await self._provision_until_ready(backoff)
        announced_standby = False
        while confirmed is not None and not self._stopping.is_set():
            source = self._new_source()
            try:
                await source.start(Lsn(0))
            except SlotInUse:
                await source.close()
                self._pg_outage.recovered()
                self._set_state(SlotState.STANDBY)
                if not announced_standby:
                    log.info(
                        "relay standby: slot %s is streamed by another relay; waiting",
                        self.settings.slot,
                    )
                    announced_standby = True
                await self._sleep(self.settings.standby_retry_s)
                continue
            except SlotNotFound:
                await source.close()
                confirmed = await self._recreate_slot(confirmed, backoff)
                continue
            except ReplicationError as exc:
                await source.close()
                self._set_state(SlotState.CONNECTING)
                self._pg_failed(exc)
                await self._sleep(backoff.next_delay_s())
                continue
            self._pg_outage.recovered()
            backoff.reset()
            announced_standby = False
            confirmed = await self._session(source, confirmed, backoff)
        self._log_summary()

    async def _recreate_slot(self, confirmed: Lsn, backoff: Backoff) -> Lsn | None:
        self._set_state(SlotState.CONNECTING)
        log.warning(
            "replication slot %s is missing; recreating it. Rows committed while it "
            "was missing are not streamed: run `zapstream outbox restream --older-than "
            "<age>` to send them",
            self.settings.slot,
        )
        provisioned = await self._provision_until_ready(backoff)
        return None if provisioned is None else max(confirmed, provisioned)

    async def _session(self, source: ReplicationSource, confirmed: Lsn, backoff: Backoff) -> Lsn:
        """Stream one connection to its end; the LSN the next one resumes from."""
        self._set_state(SlotState.STREAMING)
        try:
            if self._eos is not None:
                await self._begin_eos_session(source, confirmed)
            if self._publisher.failure is None:
                confirmed = await self._streamer.stream(source, confirmed)
        except ReplicationStreamClosed as exc:
            if not exc.retriable:
                raise RelayConfigError(
                    f"PostgreSQL ended replication: {classify_exception(exc).problem}"
                ) from exc
            # PostgreSQL restarted or the connection dropped: what Kafka acknowledged
            # but PostgreSQL did not hear about is replayed from the slot (duplicates
            # the worker drops), nothing is skipped.
            self._pg_outage.failed(f"replication connection lost: {exc}")
            if self._eos is None:  # exactly-once: the open transaction goes with its producer
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.drain_timeout_s):
                        await self._publisher.producer.flush()
            confirmed = self._streamer.reported
            await self._sleep(backoff.next_delay_s())
        finally:
            self._set_state(SlotState.CONNECTING)
            await source.close()
            if self._eos is not None:
                await self._eos.end_session(self._publisher)
        return await self._after_session(confirmed, backoff)

    async def _begin_eos_session(self, source: ReplicationSource, confirmed: Lsn) -> None:
        assert self._eos is not None
        resume = await self._eos.begin_session(
            self._publisher, source, max(confirmed, self._streamer.reported)
        )
        if self._publisher.failure is None:
            self._kafka_outage.recovered()
        if resume is not None:
            await self._streamer.confirm(source, resume)

    async def _after_session(self, confirmed: Lsn, backoff: Backoff) -> Lsn:
        """Raise for a permanent Kafka failure; wait out a transient one."""
        failure = self._publisher.failure
        if failure is None:
            if self._kafka_outage.ongoing and self._publisher.tracker is not None:
                self._kafka_outage.recovered()
            return confirmed
        if isinstance(failure, ProducerFenced):
            raise RelayError(
                f"fenced: another relay produces as {transactional_id(self.settings)} (it took "
                "the slot); this one stops without committing"
            ) from failure
        if not kafka_transient(failure):
            raise RelayError("Kafka did not acknowledge a record") from failure
        # E.g. a batch expired while the brokers were away: confirm nothing past
        # it, let the rest settle, and stream again from the slot's position.
        self._publisher.kafka_ok = False
        self._kafka_outage.failed(repr(failure))
        pending = self._publisher.pending
        if pending:
            await asyncio.wait(pending, timeout=self.settings.drain_timeout_s)
        self._publisher.recover()
        await self._sleep(backoff.next_delay_s())
        return self._streamer.reported

    def _log_summary(self) -> None:
        stats = self._stats
        log.info(
            "relay stopped: %d transactions, %d intents, %d rejected (%d reduced), "
            "%d batches, confirmed %s, %.1fs; %s; %s",
            stats.transactions,
            stats.intents,
            stats.rejected,
            stats.reduced,
            stats.batches,
            self._streamer.reported,
            time.monotonic() - stats.started,
            self.commit_to_ack.summary(),
            self.commit_to_read.summary(),
        )
        if self._eos is not None:
            log.info(
                "relay exactly-once: %d Kafka transactions committed, %d replayed PostgreSQL "
                "transactions skipped (already in Kafka)",
                stats.kafka_commits,
                stats.skipped,
            )
