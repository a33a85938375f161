"""Consumer lag of a consumer group, in records and in seconds, read from outside the group.

A group's members cannot report their own lag while they are down, which is
when it matters. :class:`LagMonitor` reads it the way kafka-lag-exporter and
kminion do, with a consumer that joins no group
(:func:`streams.kafka_reader.group_less_consumer`), every
``ZAPSTREAM_LAG_INTERVAL_S`` (a :class:`~streams.kernel.runtime.periodic.Periodic`):

1. the group's committed offset of each partition of its topics (the admin
   client's OffsetFetch, with the partitions named: Tansu cannot answer it
   without them); a partition the group never committed on counts from its
   earliest offset, where the worker (``auto_offset_reset=earliest``) would start;
2. each partition's latest offset (the offset the next record gets), from
   ListOffsets or from the high watermark of a fetch response
   (``ZAPSTREAM_KAFKA_END_OFFSETS``; Tansu's ListOffsets is wrong after batched
   produces, its fetch responses are right);
3. the first record the group has not consumed (the one at its committed
   offset), fetched for its timestamp.

Lag is latest minus committed; lag in seconds is the age of that first
unconsumed record, 0 when the lag is 0. Unlike kafka-lag-exporter, which
interpolates the time from a table of past offsets, this reads the record
itself: exact, at the price of one small fetch per lagging partition.

Each worker runs one for its own group (``ZAPSTREAM_WORKER_LAG_MONITOR``), so
every worker exports every partition of the group, whichever owns it: aggregate
with ``max`` across instances, never ``sum``. ``zapstream lag-monitor`` runs it
alone, so the lag stays visible (and alertable) while every worker is down.

The arithmetic (:func:`partition_lag`, :class:`GroupLag`) is sans-IO.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import Gauge

from streams.kafka_reader import admin_client, group_less_consumer
from streams.kernel.failures import StartRefused, classify_kafka_security
from streams.kernel.runtime.periodic import Periodic
from streams.kernel.runtime.service import Service
from streams.kernel.settings import EndOffsetSource, KafkaSettings

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

log = logging.getLogger(__name__)

GROUP_OFFSET = Gauge(
    "kafka_consumergroup_group_offset",
    "The consumer group's committed offset of the partition (the next record it will consume)",
    ["group", "topic", "partition"],
)
GROUP_LAG = Gauge(
    "kafka_consumergroup_group_lag",
    "Records of the partition the consumer group has not committed: latest offset minus "
    "committed offset",
    ["group", "topic", "partition"],
)
GROUP_LAG_SECONDS = Gauge(
    "kafka_consumergroup_group_lag_seconds",
    "Age of the oldest record of the partition the consumer group has not committed (now "
    "minus its timestamp); 0 when the group is caught up",
    ["group", "topic", "partition"],
)
GROUP_MAX_LAG = Gauge(
    "kafka_consumergroup_group_max_lag",
    "The highest lag in records of any partition of the consumer group",
    ["group"],
)
GROUP_MAX_LAG_SECONDS = Gauge(
    "kafka_consumergroup_group_max_lag_seconds",
    "The highest lag in seconds of any partition of the consumer group",
    ["group"],
)
GROUP_SUM_LAG = Gauge(
    "kafka_consumergroup_group_sum_lag",
    "Records the consumer group has not committed, summed over its partitions",
    ["group"],
)
LATEST_OFFSET = Gauge(
    "kafka_partition_latest_offset",
    "The partition's latest offset: the offset the next record produced to it will get",
    ["topic", "partition"],
)
LAST_READ = Gauge(
    "zapstream_lag_monitor_last_read_timestamp_seconds",
    "When the consumer group's lag was last read from Kafka (Unix time); the lag series keep "
    "their last values while Kafka cannot be read, so alert when this stops moving",
    ["group"],
)


# --- the arithmetic (sans-IO) -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition's lag for one group."""

    topic: str
    partition: int
    committed: int | None
    """The group's committed offset; None: it never committed on this partition."""
    latest: int
    lag: int
    lag_seconds: float | None
    """None: lagging, but the first unconsumed record could not be read in time."""


def partition_lag(
    topic: str,
    partition: int,
    *,
    committed: int | None,
    earliest: int,
    latest: int,
    first_unconsumed_ms: int | None,
    now_s: float,
    drained: bool = False,
) -> PartitionLag:
    """Lag of a partition from its offsets and the timestamp of the first unconsumed record.

    ``earliest`` stands in for ``committed`` when the group never committed (it would
    start there). A committed offset past ``latest`` (a stale latest offset) is no lag.
    A record stamped in the future (clock skew between producer and monitor) is 0 s old.
    ``drained``: between the committed offset and ``latest`` lie only offsets no consumer
    is handed (transaction markers, aborted records: the relay's exactly-once), no lag.
    """
    position = committed if committed is not None else earliest
    lag = 0 if drained else max(latest - position, 0)
    seconds: float | None
    if lag == 0:
        seconds = 0.0
    elif first_unconsumed_ms is None or first_unconsumed_ms < 0:
        seconds = None
    else:
        seconds = max(now_s - first_unconsumed_ms / 1000.0, 0.0)
    return PartitionLag(topic, partition, committed, latest, lag, seconds)


@dataclasses.dataclass(frozen=True, slots=True)
class GroupLag:
    """A group's lag over the partitions read this time."""

    group: str
    partitions: tuple[PartitionLag, ...]
    unread: int = 0
    """Partitions whose latest offset could not be read in time (left out above)."""

    @property
    def max_lag(self) -> int:
        return max((p.lag for p in self.partitions), default=0)

    @property
    def sum_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def max_lag_seconds(self) -> float | None:
        """None when a lagging partition's age is unknown and no other one is known to be older."""
        known = [p.lag_seconds for p in self.partitions if p.lag_seconds is not None]
        unknown = any(p.lag_seconds is None for p in self.partitions)
        if unknown and not any(s > 0 for s in known):
            return None
        return max(known, default=0.0)


# --- reading Kafka ------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _FirstRecords:
    timestamps_ms: dict[TopicPartition, int] = dataclasses.field(default_factory=dict)
    highwaters: dict[TopicPartition, int] = dataclasses.field(default_factory=dict)
    drained: set[TopicPartition] = dataclasses.field(default_factory=set)
    """No record to consume at or after the position: only transaction markers (and
    aborted records) up to the last stable offset. A group whose last read was a
    transaction's last record commits the offset of its commit marker."""


class LagMonitor(Service):
    """Reads and exports the lag of ``groups`` (group -> the topics it consumes) periodically.

    A :class:`~streams.kernel.runtime.service.Service`: its reading timer is a child (after
    ``health``, the deployable's metrics endpoint, when given); Kafka is connected to (and
    reconnected) by the readings themselves, and closed on stop.
    """

    name = "lag monitor"

    def __init__(
        self,
        kafka: KafkaSettings,
        groups: Mapping[str, Sequence[str]],
        *,
        interval_s: float = 10.0,
        read_timeout_s: float = 5.0,
        client_id: str = "zapstream-lag-monitor",
        clock: Callable[[], float] = time.time,
        health: Service | None = None,
    ) -> None:
        super().__init__()
        self.kafka = kafka
        self.groups = {group: list(topics) for group, topics in groups.items()}
        self.interval_s = interval_s
        self.read_timeout_s = read_timeout_s
        self.client_id = client_id
        self.clock = clock
        self.source = kafka.end_offset_source
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._missing_topics: set[str] = set()
        self.readings = 0
        """Readings that succeeded (every group read)."""
        self.failed_readings = 0
        self._refused: StartRefused | None = None
        if health is not None:
            # Serving before the first reading: ``zapstream lag-monitor``'s /metrics.
            self.add_child(health)
        self._every = Periodic("lag monitor", interval_s, self.read_once, logger=log)
        self.add_child(self._every)

    async def run(self) -> None:
        """``zapstream lag-monitor``'s body: say what is watched once serving, then wait."""
        log.info(
            "lag monitor watching %s every %.0fs (%s)",
            ", ".join(f"{g} on {'+'.join(t)}" for g, t in self.groups.items()),
            self.interval_s,
            self.source,
        )
        await self.wait_stop_requested()
        if self._refused is not None:
            raise self._refused

    async def on_stop(self) -> None:
        # The timer (a child) stopped first: no reading uses the clients any more.
        await self._close_clients()

    async def stop(self) -> None:
        await super().stop()
        # A reading outside the timer (read_once on a monitor never started: a one-off
        # reading) opens clients too; stop closes them whatever the state.
        await self._close_clients()

    def summary(self) -> str:
        return (
            f"{self.readings} readings of {len(self.groups)} groups, {self.failed_readings} failed"
        )

    async def read_once(self) -> list[GroupLag]:
        """Read every group's lag and export it; raises when Kafka cannot be read."""
        try:
            lags = await self._read_all()
        except Exception as exc:
            # Start afresh at the next reading: new connections, new metadata.
            self.failed_readings += 1
            await self._close_clients()
            problem = classify_kafka_security(exc)
            if problem is None:
                raise
            # Refused by the broker (login, ACLs): every reading would be; the monitor
            # stops and ``zapstream lag-monitor`` says why in one line (exit 2).
            self._refused = StartRefused(problem, dependency="kafka")
            self.request_stop()
            return []
        self.readings += 1
        return lags

    async def _read_all(self) -> list[GroupLag]:
        from aiokafka import TopicPartition

        consumer, admin = await self._connect()
        known = await self._topic_partitions(admin)
        results = []
        for group, topics in self.groups.items():
            present = [t for t in topics if t in known]
            self._warn_missing(set(topics) - set(present))
            tps = [TopicPartition(topic, p) for topic in present for p in known[topic]]
            if not tps:
                continue
            lag = await self._read_group(consumer, admin, group, tps)
            self._export(lag)
            results.append(lag)
        return results

    async def _connect(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        if self._consumer is not None and self._admin is not None:
            return self._consumer, self._admin
        admin = admin_client(self.kafka, self.client_id)
        consumer = group_less_consumer(
            self.kafka,
            self.client_id,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.kafka.consumer_fetch_max_wait_ms,
            max_partition_fetch_bytes=64 * 1024,
        )
        try:
            await admin.start()
            await consumer.start()
        except BaseException:
            await asyncio.gather(consumer.stop(), admin.close(), return_exceptions=True)
            raise
        self._consumer, self._admin = consumer, admin
        return consumer, admin

    async def _close_clients(self) -> None:
        consumer, admin, self._consumer, self._admin = self._consumer, self._admin, None, None
        if consumer is not None:
            await consumer.stop()
        if admin is not None:
            await admin.close()

    def _warn_missing(self, missing: set[str]) -> None:
        new = missing - self._missing_topics
        if new:
            log.warning("lag monitor: topics %s do not exist (yet); not watched", sorted(new))
        self._missing_topics = (self._missing_topics | missing) & missing

    @staticmethod
    async def _topic_partitions(admin: AIOKafkaAdminClient) -> dict[str, list[int]]:
        """Every topic's partitions, from one Metadata request for all topics (a null topic
        list: naming a topic could auto-create it).

        Asked each reading, not taken from the consumer's own metadata: an unassigned
        consumer's names no topic on Apache Kafka (its bootstrap asks for none; Tansu
        answers with all) until its periodic refresh ``metadata_max_age_s`` later, so the
        monitor read nothing for its first minute, and a new topic for up to a minute.
        """
        described = await admin.describe_topics()
        return {
            str(d["topic"]): sorted(int(p["partition"]) for p in d["partitions"])
            for d in described
            if d["partitions"]
        }

    async def _read_group(
        self,
        consumer: AIOKafkaConsumer,
        admin: AIOKafkaAdminClient,
        group: str,
        tps: list[TopicPartition],
    ) -> GroupLag:
        offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
        committed: dict[TopicPartition, int | None] = {}
        for tp in tps:
            meta = offsets.get(tp)
            committed[tp] = meta.offset if meta is not None and meta.offset >= 0 else None
        never = [tp for tp, offset in committed.items() if offset is None]
        earliest: dict[TopicPartition, int] = (
            await consumer.beginning_offsets(never) if never else {}
        )
        position = {tp: c if c is not None else earliest.get(tp, 0) for tp, c in committed.items()}
        if self.source is EndOffsetSource.LIST_OFFSETS:
            latest: dict[TopicPartition, int] = await consumer.end_offsets(tps)
            first = await self._first_records(
                consumer, {tp: p for tp, p in position.items() if latest.get(tp, 0) > p}
            )
        else:
            first = await self._first_records(consumer, position)
            latest = first.highwaters
        now = self.clock()
        lags = tuple(
            partition_lag(
                tp.topic,
                tp.partition,
                committed=committed[tp],
                earliest=earliest.get(tp, 0),
                latest=latest[tp],
                first_unconsumed_ms=first.timestamps_ms.get(tp),
                now_s=now,
                drained=tp in first.drained,
            )
            for tp in tps
            if tp in latest  # no answer in time (high watermark): keep the last values
        )
        return GroupLag(group, lags, unread=len(tps) - len(lags))

    async def _first_records(
        self, consumer: AIOKafkaConsumer, positions: Mapping[TopicPartition, int]
    ) -> _FirstRecords:
        """Fetch the record at each position: its timestamp, and the partition's high watermark."""
        found = _FirstRecords()
        if not positions:
            return found
        consumer.assign(list(positions))  # a fresh assignment: no stale high watermark
        for tp, offset in positions.items():
            consumer.seek(tp, offset)
        pending = set(positions)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.read_timeout_s
        try:
            while pending and (left := deadline - loop.time()) > 0:
                batches = await consumer.getmany(
                    *pending, timeout_ms=int(min(left, 0.5) * 1000) or 1, max_records=len(pending)
                )
                for tp, records in batches.items():
                    if tp in pending and records:
                        found.timestamps_ms[tp] = records[0].timestamp
                        self._done(consumer, tp, found, pending)
                for tp in list(pending):
                    # Answered without records: the position is the end of the partition.
                    highwater = consumer.highwater(tp)
                    if consumer.last_poll_timestamp(tp) is None or highwater is None:
                        continue
                    if highwater <= positions[tp]:
                        self._done(consumer, tp, found, pending)
                        continue
                    # Or read_committed skipped to the last stable offset without a record:
                    # only transaction markers (or aborted records) were left.
                    stable = consumer.last_stable_offset(tp)
                    if stable is not None and stable > positions[tp]:
                        if await consumer.position(tp) >= stable:
                            found.drained.add(tp)
                            self._done(consumer, tp, found, pending)
        finally:
            # Until the next reading, fetch nothing more.
            consumer.pause(*positions)
        if pending:
            log.debug("lag monitor: no answer in time for %d partitions", len(pending))
        return found

    @staticmethod
    def _done(
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        found: _FirstRecords,
        pending: set[Any],
    ) -> None:
        highwater = consumer.highwater(tp)
        if highwater is not None:
            found.highwaters[tp] = highwater
        consumer.pause(tp)
        pending.discard(tp)

    def _export(self, lag: GroupLag) -> None:
        group = lag.group
        for p in lag.partitions:
            labels = (group, p.topic, str(p.partition))
            LATEST_OFFSET.labels(p.topic, str(p.partition)).set(p.latest)
            GROUP_LAG.labels(*labels).set(p.lag)
            if p.committed is not None:
                GROUP_OFFSET.labels(*labels).set(p.committed)
            if p.lag_seconds is not None:
                GROUP_LAG_SECONDS.labels(*labels).set(p.lag_seconds)
        if lag.unread:
            # A partial reading would understate the group's totals: keep the last ones.
            return
        GROUP_MAX_LAG.labels(group).set(lag.max_lag)
        GROUP_SUM_LAG.labels(group).set(lag.sum_lag)
        max_seconds = lag.max_lag_seconds
        if max_seconds is not None:
            GROUP_MAX_LAG_SECONDS.labels(group).set(max_seconds)
        LAST_READ.labels(group).set(self.clock())
