"""``zapstream topics ensure``: create every Kafka topic with explicit partitions.

Tansu (dev and tests) auto-creates unknown topics with 4 partitions, and Faust
tables crash with PartitionsMismatch when a changelog's partition count differs
from its source topic's, so nothing may be left to auto-creation. An existing
topic with a different partition count is an error, not something to paper over.

An operator command: the deployables' start-up check of the same topics is
:mod:`streams.kernel.topics_check`.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.kernel.contract import TopicSpec
from streams.kernel.settings import KafkaSettings
from streams.kernel.topics_check import (
    TopicMismatch,
    _partition_counts,
    _started_admin,
    all_topic_specs,
    mismatch_message,
)

log = logging.getLogger(__name__)

CREATED_VISIBLE_S = 30.0
"""How long ``topics ensure`` waits for topics it created to appear in the metadata: a KRaft
broker answers CreateTopics once the controller committed them, and its own metadata cache
learns of them a moment later (Tansu: at once)."""


async def ensure_topics(kafka: KafkaSettings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Create the missing topics (default: every topic, under the topic prefix); return the
    names created now."""
    specs = specs if specs is not None else all_topic_specs(kafka)
    admin = await _started_admin(kafka)
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            new = [
                NewTopic(
                    name=s.name,
                    num_partitions=s.partitions,
                    replication_factor=kafka.replication_factor,
                    topic_configs=dict(s.configs),
                )
                for s in missing
            ]
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                log.info("another process created the topics first")
        counts = await _partition_counts(admin)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CREATED_VISIBLE_S
        while any(s.name not in counts for s in missing) and loop.time() < deadline:
            await asyncio.sleep(0.1)
            counts = await _partition_counts(admin)
        for spec in specs:
            have = counts.get(spec.name)
            if have is None:
                raise TopicMismatch(f"topic {spec.name} was not created: check the broker's log")
            if have != spec.partitions:
                raise TopicMismatch(mismatch_message(spec, have))
        return [s.name for s in missing]
    finally:
        await admin.close()
