"""How far the state sink has written ``zapstream.state`` into PostgreSQL, as a time.

The dedup horizon (:mod:`streams.dedup_horizon`) may forget a settled job only
once PostgreSQL holds its last state: after that, ``outbox_jobs`` recognises a
late redelivery (:mod:`streams.kernel.job_history`); before, the worker's table is the
only record that the job was sent, and forgetting it could send it twice.

The state sink commits its consumer group's offset on ``zapstream.state`` only
after the rows are committed in PostgreSQL, so its committed offset ``C`` of a
partition means "every record before ``C`` is in PostgreSQL". The worker needs a
time, since the table holds states, not offsets: the CreateTime of record
``C - 1`` (stamped by the worker that sent it). A state changed before that time,
less ``margin_s`` (the moment between a state's change and its send, and clock
skew between workers after a rebalance), was sent before record ``C - 1`` and is
in PostgreSQL.

:meth:`SinkProgress.refresh` asks Kafka for the sink group's committed offsets of
the partitions this worker owns and reads the one record before each; a
partition the sink has not committed on yet has no time, so nothing of it is
forgotten. When the committed offset is the partition's high watermark (from the
fetch response, which Tansu reports correctly), the sink has everything, and the
time is when we asked. While the sink lags, the table grows instead of losing the only record.

The worker runs :meth:`SinkProgress.refresh` from a
:class:`streams.kernel.runtime.periodic.Periodic`: an error (Kafka away included) is counted
and logged once per outage, what is known stays, and the worker keeps running.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client import Gauge

from streams.kafka_reader import admin_client, group_less_consumer
from streams.kernel.contract import STATE
from streams.kernel.runtime.service import Service
from streams.kernel.settings import KafkaSettings

log = logging.getLogger(__name__)

SINK_DURABLE_AGE = Gauge(
    "zapstream_dedup_sink_durable_age_seconds",
    "Age of the newest job state known to be in PostgreSQL, per zapstream.state partition "
    "this worker owns (the dedup horizon forgets nothing newer)",
    ["partition"],
)


class SinkProgress(Service):
    """Per partition of ``zapstream.state``: the time before which every state is in PostgreSQL.

    A service of the worker (its Kafka clients open on start, close on stop); the worker's
    Faust timer calls :meth:`refresh`.
    """

    name = "sink progress"

    def __init__(
        self,
        kafka: KafkaSettings,
        group_id: str,
        *,
        margin_s: float = 10.0,
        topic: str = STATE,
        client_id: str = "zapstream-worker-sink-progress",
    ) -> None:
        super().__init__()
        self.kafka = kafka
        self.group_id = group_id
        self.margin_s = margin_s
        self.topic = topic
        self.client_id = client_id
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._offsets: dict[int, int] = {}
        self._until: dict[int, dt.datetime] = {}
        self._warned = False

    async def on_start(self) -> None:
        self._admin = admin_client(self.kafka, self.client_id)
        await self._admin.start()
        self._consumer = group_less_consumer(self.kafka, self.client_id)
        await self._consumer.start()

    async def on_stop(self) -> None:
        admin, consumer, self._admin, self._consumer = self._admin, self._consumer, None, None
        if consumer is not None:
            await consumer.stop()
        if admin is not None:
            await admin.close()

    def durable_until(self, partition: int) -> dt.datetime | None:
        """States of ``partition`` changed before this are in PostgreSQL; None: none known."""
        return self._until.get(partition)

    async def refresh(self, partitions: Iterable[int]) -> None:
        """Read the sink's committed offsets of ``partitions`` and the time of the record before."""
        if self._admin is None or self._consumer is None:
            return
        tps = [TopicPartition(self.topic, p) for p in sorted(set(partitions))]
        if not tps:
            return
        # Kafka away: what is known stays and the horizon waits, nothing is lost. The
        # error goes to the timer (streams.kernel.runtime.periodic.Periodic): logged
        # once per outage and counted, not a line every dedup_sink_check_s.
        committed = await self._admin.list_consumer_group_offsets(self.group_id, partitions=tps)
        moved = {
            tp: meta.offset
            for tp, meta in committed.items()
            if meta is not None and meta.offset > 0
        }
        if moved:
            await self._read_times(moved)
        self._report(tps)

    async def _read_times(self, moved: dict[TopicPartition, int]) -> None:
        consumer = self._consumer
        assert consumer is not None
        consumer.assign(list(moved))
        for tp, offset in moved.items():
            consumer.seek(tp, offset - 1)
        pending = dict(moved)
        asked = dt.datetime.now(dt.UTC)
        for _ in range(5):
            if not pending:
                break
            batches = await consumer.getmany(*pending, timeout_ms=1000, max_records=len(pending))
            for tp, records in batches.items():
                offset = pending.pop(tp, None)
                if offset is None or not records:
                    continue
                record = records[0]
                if record.offset >= offset:
                    # Record offset-1 is gone (compacted away): no time we can vouch for.
                    continue
                self._offsets[tp.partition] = offset
                margin = dt.timedelta(seconds=self.margin_s)
                highwater = consumer.highwater(tp)
                if highwater is not None and offset >= highwater:
                    # The sink has every record of the partition: everything sent
                    # before we asked is written (an idle outbox forgets its last jobs too).
                    self._until[tp.partition] = asked - margin
                else:
                    sent = dt.datetime.fromtimestamp(record.timestamp / 1000, dt.UTC)
                    self._until[tp.partition] = sent - margin

    def _report(self, tps: list[TopicPartition]) -> None:
        now = dt.datetime.now(dt.UTC)
        unknown = [tp.partition for tp in tps if tp.partition not in self._until]
        for tp in tps:
            until = self._until.get(tp.partition)
            if until is not None:
                SINK_DURABLE_AGE.labels(str(tp.partition)).set((now - until).total_seconds())
        if unknown and not self._warned:
            self._warned = True
            log.warning(
                "dedup horizon: the state sink (consumer group %r) has not committed on %s "
                "partitions %s yet; their settled jobs stay in the table until it has "
                "(is `zapstream sink` running with ZAPSTREAM_SINK_GROUP_ID=%s?)",
                self.group_id,
                self.topic,
                unknown,
                self.group_id,
            )
        elif not unknown:
            self._warned = False
