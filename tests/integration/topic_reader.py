"""Read a whole Kafka topic from the start, for assertions on what the relay produced."""

from __future__ import annotations

import asyncio
import dataclasses

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient


@dataclasses.dataclass(frozen=True, slots=True)
class TopicRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    timestamp_ms: int = 0


async def _partitions(bootstrap: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics()
    finally:
        await admin.close()
    return next((len(d["partitions"]) for d in described if d["topic"] == topic), 0)


async def _read(bootstrap: str, topic: str, timeout_s: float) -> list[TopicRecord]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=8 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            # An unassigned consumer's metadata names no topic on Apache Kafka (Tansu's lists
            # them all): ask for every topic's, which names none and so creates none.
            partitions = [
                TopicPartition(topic, p) for p in range(await _partitions(bootstrap, topic))
            ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        out: list[TopicRecord] = []
        async with asyncio.timeout(timeout_s):
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                batch = await consumer.getmany(timeout_ms=500)
                for tp, messages in batch.items():
                    for m in messages:
                        out.append(
                            TopicRecord(
                                tp.partition,
                                m.offset,
                                m.key,
                                m.value or b"",
                                dict(m.headers),
                                m.timestamp,
                            )
                        )
        return out
    finally:
        await consumer.stop()


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[TopicRecord]:
    """Every record of ``topic`` that exists now, across partitions."""
    return asyncio.run(_read(bootstrap, topic, timeout_s))


async def _end_offsets(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)  # puts the topic in the consumer's metadata, as _read does
        ends = await consumer.end_offsets(tps)
        return sum(ends.values())
    finally:
        await consumer.stop()


def end_offsets_sum(bootstrap: str, topic: str, partitions: int) -> int:
    """The sum of ``topic``'s end offsets over its ``partitions``: it grows as records land
    (on Tansu it lags a multi-record batch's tail, but grows all the same)."""
    return asyncio.run(_end_offsets(bootstrap, topic, partitions))
