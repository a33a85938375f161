"""``zapstream topics ensure``: create every topic up front with explicit partitions.

Tansu (dev and tests) auto-creates unknown topics with 4 partitions, and Faust
tables crash with PartitionsMismatch when a changelog's partition count differs
from its source topic's, so nothing may be left to auto-creation. An existing
topic with a different partition count is an error, not something to paper over.
"""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.contract import TopicSpec, topic_specs
from streams.settings import KafkaSettings

log = logging.getLogger(__name__)


class TopicMismatch(RuntimeError):
    """A topic exists with another partition count than zapstream needs."""


async def ensure_topics(kafka: KafkaSettings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Create the missing topics; return the names created now."""
    specs = specs if specs is not None else topic_specs(kafka.partitions)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=kafka.bootstrap_servers, client_id="zapstream-admin"
    )
    await admin.start()
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
        described = await admin.describe_topics([s.name for s in specs])
        counts = {d["topic"]: len(d["partitions"]) for d in described}
        for spec in specs:
            if counts.get(spec.name) != spec.partitions:
                raise TopicMismatch(
                    f"topic {spec.name} has {counts.get(spec.name)} partitions, "
                    f"zapstream needs {spec.partitions} (ZAPSTREAM_KAFKA_PARTITIONS)"
                )
        return [s.name for s in missing]
    finally:
        await admin.close()
