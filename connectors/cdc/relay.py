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

Beside the stream, while this relay streams the slot,
:class:`~connectors.cdc.scheduled_release.ScheduledRelease` releases due scheduled
jobs (``SCHEDULED`` rows, which the relay does not publish) through ``outbox_replays``.
And a :class:`~connectors.cdc.slot_monitor.SlotMonitor` on an
ordinary connection exports the slot's lag and retained WAL (also while this
relay is a standby or waits for Kafka) and, while streaming, writes a WAL
heartbeat every ``heartbeat_interval_s`` so an idle outbox does not pin WAL.
The metrics port serves ``/metrics``, ``/healthz`` and ``/readyz`` (200 only
while streaming; see :mod:`connectors.cdc.metrics`).

The relay is split by concept. :class:`OutboxRelay` is the service (a
:class:`~streams.kernel.runtime.service.Service`: its producer, health endpoint
and slot monitor, start and stop); :class:`~connectors.cdc.supervisor.SlotSupervisor`
provisions, stands by, reconnects (its :class:`~connectors.cdc.supervisor.SlotState`);
:class:`~connectors.cdc.streaming.Streamer` streams one connection and drains it;
the sans-IO :class:`~connectors.cdc.assembler.TransactionAssembler` turns pgoutput
into transactions and records; :mod:`connectors.cdc.shaping` converts, reduces,
routes and labels each record; :class:`~connectors.cdc.publisher.Publisher`
produces partition batches and settles Kafka's answers;
:mod:`connectors.cdc.exactly_once` holds the Kafka transactions of ``exactly_once``.

Failures are classified once (:mod:`connectors.cdc.failures`):

- PostgreSQL away (connection refused or closed, SQLSTATE 08/53/57...): the
  relay reconnects with capped, jittered backoff for as long as it takes,
  logging the outage once when it starts and once when it ends. A slot found
  missing on reconnect is recreated; on start and on every reconnect a slot gap
  (the slot new or recreated) is restreamed by the relay itself, with one line and a
  metric, and a slot behind the position recorded in ``outbox_relay_slots`` is reported
  (it streams that part again itself) (:mod:`connectors.cdc.slot_gap`).
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
  wal_level not logical, slot with another plugin):
  :class:`~streams.kernel.failures.StartRefused` with one line naming the
  setting; ``zapstream relay`` exits 2.
- Kafka refusing or cancelling a record in any other way: the relay confirms
  nothing past it and :meth:`OutboxRelay.run` raises :class:`RelayError`; the
  restarted relay replays from the slot.

What the relay asks pgoutput for, on every PostgreSQL from 15 to 18 (``make test`` runs the
relay and outbox suites on 15 and 18): ``proto_version '1'`` and ``publication_names`` (its
one publication), nothing else; ``messages 'true'`` only where a
:class:`~connectors.cdc.replication_stream.ReplicationStream` is built to read
``pg_logical_emit_message`` (not by the relay). Version 1 is what every server since 10 speaks
byte for byte, so one decoder reads 15 and 18 alike; 15 offers versions up to 3, 16 to 18 up
to 4. What the later versions add is left off on purpose:

- ``streaming`` (version 2+; ``parallel`` needs 4): in-progress transactions in chunks, with
  ``S``/``E``/``c``/``A`` messages and an xid in every change. Without it a large transaction
  reaches the relay at its commit, spilled to disk by the server past
  ``logical_decoding_work_mem``, and the relay, which acknowledges only whole committed
  transactions anyway, never holds or produces rows that may still abort. Measured
  (``python -m devtools.bench.large_transaction``, docs/concepts/architecture.md): below
  ~100,000 rows per transaction nothing spills and both deliver alike; above, streaming
  would save PostgreSQL ~2 s at 300,000 rows while the relay's own 5.4 s to Kafka remain.
- ``two_phase`` (version 3+): prepared transactions; an outbox row counts once committed.
- ``binary 'true'``: the decoder reads text values (jsonb as text is what it parses).
- ``origin`` (16+): the default, ``any``, is the only sensible value for one primary.

One difference between the versions matters: from 18 on, pgoutput skips a publication that
does not exist at the decoded WAL position with a WARNING where 15 fails with ERROR 42704, so
the stream would go quiet while the slot is confirmed past rows never sent;
:class:`~connectors.cdc.replication_stream.ReplicationStream` turns that WARNING into the same
permanent error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from connectors.cdc.exactly_once import KafkaTransactions
from connectors.cdc.failures import Backoff, OutageLog, RelayError, refused
from connectors.cdc.lsn import Lsn
from connectors.cdc.metrics import LatencyWindow, RelayStats
from connectors.cdc.publisher import KeyHashPartitioner, Publisher, build_producer
from connectors.cdc.scheduled_release import ScheduledRelease
from connectors.cdc.settings import RelaySettings
from connectors.cdc.shaping import RecordShaper
from connectors.cdc.slot_gap import GapOutcome
from connectors.cdc.slot_monitor import SlotMonitor
from connectors.cdc.source import ReplicationSource
from connectors.cdc.streaming import Streamer
from connectors.cdc.supervisor import SlotState, SlotSupervisor
from connectors.cdc.transactions import KafkaPosition, read_position
from streams.kernel.kafka_outage import KafkaOutageWatch
from streams.kernel.producer_stop import stop_producer
from streams.kernel.runtime.health import HealthEndpoint
from streams.kernel.runtime.outage import share_one_line
from streams.kernel.runtime.service import Service

log = logging.getLogger(__name__)

__all__ = [
    "KeyHashPartitioner",
    "OutboxRelay",
    "RelayError",
    "RelayStats",
    "SlotState",
    "build_producer",
]


class OutboxRelay(Service):
    """The relay as a service: start the producer, run the supervisor, drain, stop.

    The collaborators default to production ones and can be injected (tests do):
    ``producer`` (an :class:`AIOKafkaProducer` or anything with its
    ``start``/``stop``/``send``/``flush``; with ``partitions_for``/``create_batch``/
    ``send_batch`` too, records are produced in batches), ``source_factory`` (a new
    :class:`~connectors.cdc.source.ReplicationSource` per connection attempt),
    ``provision`` (makes sure the publication and slot exist, returns the slot's
    confirmed LSN) and ``monitor`` (the :class:`~connectors.cdc.slot_monitor.SlotMonitor`
    exporting the slot's lag and writing heartbeats; by default one on ``postgres.dsn``
    when the source is the production one, none when a ``source_factory`` is injected) and
    ``resolve_gap`` (finds and restreams a slot gap, :mod:`connectors.cdc.slot_gap`; by
    default the database's with the production source, none with an injected one).

    :meth:`readiness` (``/readyz``) says whether this relay streams the slot now.
    """

    name = "relay"

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
        release: ScheduledRelease | None = None,
        resolve_gap: Callable[[str | None], Awaitable[GapOutcome]] | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        # Started first, stopped last, not as a child: /metrics serves while the
        # producer still waits for Kafka.
        self._health = HealthEndpoint(
            settings.metrics_port,
            bind_local=settings.metrics_bind_local,
            readiness=self.readiness,
            name="relay",
            logger=log,
        )
        if monitor is None and source_factory is None:
            monitor = SlotMonitor.of_relay(settings, streaming=self.is_streaming)
        self._monitor = monitor
        if release is None and source_factory is None:
            release = ScheduledRelease.of_relay(settings, streaming=self.is_streaming)
        self._release = release
        self._stats = RelayStats()
        shaper = RecordShaper(settings, self._stats)
        self._route = shaper.route  # where a record goes (tests of the topic names ask)
        stopping = self._stopping
        # Exactly-once (connectors.cdc.exactly_once): a transactional producer per session.
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
        self._producer_live = False  # started by on_start (never: a stop came first)
        self._streamer = Streamer(
            settings,
            self._publisher,
            shaper,
            self._stats,
            transactions=self._eos,
            stopping=stopping,
            clock=clock,
        )
        self._kafka_outage = OutageLog("Kafka", log)
        # aiokafka's own errors (a broker away, a leader moving): one outage, logged above.
        self._kafka_watch = KafkaOutageWatch("relay", settings.kafka, target=self._kafka_outage)
        self._supervisor = SlotSupervisor(
            settings,
            self._publisher,
            self._streamer,
            transactions=self._eos,
            new_source=source_factory,
            provision=provision,
            resolve=resolve_gap,
            sleep=self._sleep,
            stopping=stopping,
            kafka_outage=self._kafka_outage,
        )
        share_one_line(
            self._supervisor.pg_outage,
            *(part.outage for part in (monitor, release) if part is not None),
        )

    def _stopping(self) -> bool:
        return self.stop_requested

    @property
    def stats(self) -> RelayStats:
        return self._stats

    @property
    def confirmed(self) -> Lsn:
        return self._streamer.reported

    @property
    def slot_state(self) -> SlotState:
        return self._supervisor.state

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
        return self._supervisor.state is SlotState.STREAMING

    def readiness(self) -> tuple[bool, str]:
        """(ready, why) for ``/readyz``: ready only while streaming with Kafka taking records."""
        if self.stop_requested:
            return False, "stopping"
        if self._supervisor.state is not SlotState.STREAMING:
            return False, self._supervisor.state.value
        if self._publisher.failure is not None or not self._publisher.kafka_ok:
            return False, "kafka unavailable"
        return True, "streaming"

    # --- lifecycle ----------------------------------------------------------------------

    async def on_start(self) -> None:
        """Start the Kafka producer, retrying with backoff while the brokers are unreachable."""
        try:
            await self._health.start()
        except OSError as exc:
            raise refused(
                f"cannot serve metrics on port {self.settings.metrics_port} ({exc}): set "
                "ZAPSTREAM_RELAY_METRICS_PORT to a free port, or 0 to switch metrics off",
                dependency="config",
            ) from exc
        self._supervisor.set_state(SlotState.CONNECTING)
        await self._kafka_watch.start()
        if self._monitor is not None:
            # Before Kafka: the slot's lag is exported while the producer waits for brokers.
            await self._monitor.start()
        if self._release is not None:
            # Releases only while this relay streams the slot (a standby never does).
            await self._release.start()
        self._publisher.use(self._publisher.producer)
        # Exactly-once: the transactional producer starts once this relay holds the slot.
        self._producer_live = self._eos is not None or await self._start_producer()

    async def _start_producer(self) -> bool:
        """Start the producer, waiting out Kafka outages; False if a stop came first."""
        backoff = Backoff(self.settings.reconnect_initial_s, self.settings.reconnect_max_s)
        while True:
            try:
                await self._publisher.producer.start()
                break
            except KafkaError as exc:
                if not exc.retriable:
                    raise refused(
                        f"Kafka refused the relay: {exc!r}; check ZAPSTREAM_KAFKA_BROKERS",
                        dependency="kafka",
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
        super().request_stop()
        # Wake a send blocked on backpressure so it sees the stop.
        self._publisher.wake()

    async def on_stop(self) -> None:
        self.request_stop()
        self._supervisor.set_state(SlotState.STOPPED)
        try:
            if self._release is not None:
                await self._release.stop()
            if self._monitor is not None:
                await self._monitor.stop()
            if self._producer_live:
                # An idempotent producer never lets a batch expire: with Kafka down its
                # stop() would wait for ever (aio-libs/aiokafka#1101); bounded here. What it
                # held was never confirmed to PostgreSQL, so the next relay produces it again.
                await stop_producer(
                    self._publisher.producer, self.settings.drain_timeout_s, what="the relay"
                )
        finally:
            await self._kafka_watch.stop()
            await self._health.stop()

    async def _sleep(self, delay_s: float) -> bool:
        """Wait ``delay_s`` or until a stop is requested; True if stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait_stop_requested(), delay_s)
        return self.stop_requested

    # --- the main body ------------------------------------------------------------------

    async def run(self) -> None:
        """Stream until :meth:`request_stop`; wait as a standby while another relay has the slot.

        Transient PostgreSQL and Kafka failures are waited out. Raises
        :class:`~streams.kernel.failures.StartRefused` for a permanent one and
        :class:`RelayError` once Kafka refused or cancelled a record for good.
        """
        await self._supervisor.run()
        if self._eos is not None:
            log.info(
                "relay exactly-once: %d Kafka transactions committed, %d replayed PostgreSQL "
                "transactions skipped (already in Kafka)",
                self._stats.kafka_commits,
                self._stats.skipped,
            )

    def summary(self) -> str:
        """What this relay did (the closing line's text)."""
        stats = self._stats
        return (
            f"{stats.transactions} transactions, {stats.intents} intents, {stats.rejected} "
            f"rejected ({stats.reduced} reduced), {stats.batches} batches, confirmed "
            f"{self._streamer.reported}, {time.monotonic() - stats.started:.1f}s; "
            f"{self.commit_to_ack.summary()}; {self.commit_to_read.summary()}"
            + (f"; {self._release.summary()}" if self._release is not None else "")
        )
