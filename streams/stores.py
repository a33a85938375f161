"""The worker's Faust-backed stores: job states and published outcomes.

Each implements a port of :mod:`streams.job_processor` (``JobStore``, ``Publisher``)
and makes every write durable in Kafka before it returns. The parked
conversations' store is :class:`streams.parking.ParkingLot`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any

from streams import metrics
from streams.faust_adapter.hooks import kafka_producer
from streams.kernel.contract import (
    DEFAULT_NAMES,
    STATE,
    AttemptFinished,
    JobDead,
    StatusChanged,
    TopicNames,
    job_state_key,
)
from streams.metrics import ATTEMPTS_BY, STATES_BY


def compact(raw: bytes) -> bytes:
    """``raw`` in an allocation of its own size.

    orjson returns small ``bytes`` inside allocations of several KB that are never
    shrunk (measured with orjson 3.13: a 500-byte state held 4,120 bytes, its copy
    538), and these tables hold one value per job or conversation.
    """
    return bytes(memoryview(raw))


class KafkaWriter:
    """Sends records with the Faust app's own aiokafka producer.

    Faust's ``Topic.send`` wraps every record in a ``FutureMessage`` and runs it
    through the channel and producer layers (measured: about 60% more CPU per record
    than ``AIOKafkaProducer.send``); the worker awaits every acknowledgement itself
    and needs none of that. The producer is the same one Faust configured (acks,
    batching), so the records go out in the same order they would through Faust.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int | None = None
    ) -> Awaitable[Any]:
        """Queue the record; the returned future completes when Kafka acknowledged it."""
        producer = kafka_producer(self.app)
        future: Awaitable[Any] = await producer.send(topic, value, key=key, partition=partition)
        return future


class FaustJobStore:
    """Job states in the ``jobs`` table; ``put`` waits for Kafka to acknowledge the changelog.

    Faust's own ``table[key] = value`` goes through its producer buffer, whose flush
    before each offset commit never finishes while lanes keep writing; we send the
    changelog record ourselves to the partition of the conversation (co-partitioning)
    and update the table's local store first, so a lane reading the job in the
    meantime already sees the new state.
    """

    def __init__(
        self,
        table: Any,
        writer: KafkaWriter,
        topic: str = STATE,
        *,
        on_stored: Callable[[bytes, StatusChanged], None] | None = None,
    ) -> None:
        """``topic``: the table's changelog (``KafkaSettings.names.state`` in a worker);
        ``on_stored``: called with each state's key and state once the local store holds
        it (the dedup horizon indexes settled jobs there, :mod:`streams.dedup_horizon`)."""
        self.table = table
        self.writer = writer
        self.topic = topic
        self.on_stored: Callable[[bytes, StatusChanged], None] = on_stored or (lambda k, s: None)

    def get(self, job_id: int) -> StatusChanged | None:
        raw = self.table.data.get(job_state_key(job_id))
        return StatusChanged.loads(raw) if raw is not None else None

    async def put(self, state: StatusChanged, partition: int) -> None:
        await (await self.send(state, partition))

    async def send(self, state: StatusChanged, partition: int) -> Awaitable[Any]:
        """Store ``state`` locally and queue its changelog record; await the result for the ack."""
        key, value = job_state_key(state.job_id), compact(state.dumps())
        self.table.data[key] = value
        self.on_stored(key, state)
        ack = await self.writer.send(self.topic, key, value, partition)
        STATES_BY(state.status).inc()
        return ack


class _Settled:
    """An acknowledgement that is already there: an attempt record not published."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator: awaiting it returns at once


class FaustPublisher:
    """Dead jobs to ``zapstream.dead``; attempt outcomes counted, and published to
    ``zapstream.results`` only with ``publish_attempts`` (``ZAPSTREAM_WORKER_PUBLISH_ATTEMPTS``:
    nothing in zapstream reads that topic)."""

    def __init__(
        self,
        writer: KafkaWriter,
        names: TopicNames = DEFAULT_NAMES,
        *,
        publish_attempts: bool = False,
    ) -> None:
        self.writer = writer
        self.results = names.results
        self.dead = names.dead
        self.publish_attempts = publish_attempts

    async def attempt_finished(self, record: AttemptFinished, key: bytes) -> Awaitable[Any]:
        ATTEMPTS_BY(record.gateway, record.instance_id, record.outcome).inc()
        if not self.publish_attempts:
            return _Settled()
        return await self.writer.send(self.results, key, record.dumps())

    async def job_dead(self, record: JobDead) -> None:
        await (await self.writer.send(self.dead, str(record.job_id).encode(), record.dumps()))
        metrics.DEAD.inc()
