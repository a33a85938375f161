"""``zapstream topics ensure``, and the start-up check of the topics a deployable needs.

Tansu (dev and tests) auto-creates unknown topics with 4 partitions, and Faust
tables crash with PartitionsMismatch when a changelog's partition count differs
from its source topic's, so nothing may be left to auto-creation. An existing
topic with a different partition count is an error, not something to paper over.

Reading metadata must never create a topic either: a Metadata request naming a
topic lets a broker with ``auto.create.topics.enable`` (Kafka's default, and
Tansu) create it with *its* partition count. So every read here asks for the
metadata of all topics (a null topic list), which creates nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from connectors.failures import Backoff, OutageLog
from connectors.ops.config_errors import StartupRefused
from streams.contract import (
    BULK_INTENTS,
    CONTROLS,
    DEAD,
    INTENTS,
    INVALID,
    STATE,
    TopicSpec,
    topic_specs,
)
from streams.settings import KafkaSettings

log = logging.getLogger(__name__)

ENSURE_HINT = "run `zapstream topics ensure`"


class TopicMismatch(StartupRefused):
    """A topic is missing, or exists with another partition count than zapstream needs."""


_NEEDS: dict[str, tuple[str, ...] | None] = {
    "worker": None,  # every topic: it reads intents and controls, writes the rest, owns changelogs
    "relay": (INTENTS, BULK_INTENTS, INVALID, CONTROLS),
    "sink": (STATE, INVALID, DEAD),
    "webhook": (INTENTS, DEAD),
}


def deployable_topic_specs(deployable: str, kafka: KafkaSettings) -> list[TopicSpec]:
    """The topics ``zapstream <deployable>`` reads or writes, with their partition counts."""
    names = _NEEDS[deployable]
    specs = topic_specs(kafka.partitions)
    return specs if names is None else [s for s in specs if s.name in names]


def worker_topic_specs(kafka: KafkaSettings) -> list[TopicSpec]:
    """Every topic ``zapstream worker`` reads or writes, changelogs (state, parked) included."""
    return deployable_topic_specs("worker", kafka)


def relay_topic_specs(kafka: KafkaSettings) -> list[TopicSpec]:
    """The topics ``zapstream relay`` produces to."""
    return deployable_topic_specs("relay", kafka)


def _admin(kafka: KafkaSettings) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=kafka.bootstrap_servers, client_id="zapstream-admin"
    )


async def _partition_counts(admin: AIOKafkaAdminClient) -> dict[str, int]:
    # describe_topics() without names sends Metadata with a null topic list: all
    # topics, and no auto-creation (naming a topic could create it).
    described = await admin.describe_topics()
    return {str(d["topic"]): len(d["partitions"]) for d in described}


async def partition_counts(kafka: KafkaSettings) -> dict[str, int]:
    """Every topic of the cluster and its partition count; creates nothing."""
    admin = _admin(kafka)
    with _quiet_aiokafka():
        await admin.start()
    try:
        return await _partition_counts(admin)
    finally:
        await admin.close()


@contextlib.contextmanager
def _quiet_aiokafka() -> Iterator[None]:
    """aiokafka logs each failed bootstrap as an ERROR; the caller reports the failure itself."""
    logger = logging.getLogger("aiokafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def topic_problems(counts: dict[str, int], specs: list[TopicSpec]) -> list[str]:
    """One line per topic in ``specs`` that is missing or has another partition count."""
    problems = []
    for spec in specs:
        have = counts.get(spec.name)
        if have is None:
            problems.append(f"topic {spec.name} does not exist: {ENSURE_HINT}")
        elif have != spec.partitions:
            problems.append(mismatch_message(spec, have))
    return problems


def mismatch_message(spec: TopicSpec, have: int) -> str:
    if spec.partitions == 1:
        need = f"zapstream needs {spec.partitions} partition"
        fix = "delete it and run `zapstream topics ensure`"
    else:
        need = f"ZAPSTREAM_KAFKA_PARTITIONS says {spec.partitions}"
        fix = (
            f"run `zapstream topics ensure` on a fresh cluster, or set "
            f"ZAPSTREAM_KAFKA_PARTITIONS={have} if every partitioned topic has {have}"
        )
    return f"topic {spec.name} has {have} partitions, {need}: {fix}"


async def partition_counts_when_reachable(
    kafka: KafkaSettings, *, first_delay_s: float = 0.5, max_delay_s: float = 10.0
) -> dict[str, int]:
    """:func:`partition_counts`, waiting out a broker that cannot be reached yet.

    A broker that is down or not up yet is transient for a long-running service:
    retried with the edges' capped, jittered :class:`~connectors.failures.Backoff`
    for as long as it lasts, logged once when the outage starts and once when it
    ends (:class:`~connectors.failures.OutageLog`).
    """
    backoff = Backoff(first_delay_s, max_delay_s)
    outage = OutageLog("Kafka", log)
    brokers = ",".join(kafka.bootstrap_servers)
    while True:
        try:
            counts = await partition_counts(kafka)
        except KafkaConnectionError as exc:
            delay_s = backoff.next_delay_s()
            outage.failed(f"{exc} (ZAPSTREAM_KAFKA_BROKERS={brokers})", delay_s)
            await asyncio.sleep(delay_s)
            continue
        outage.recovered()
        return counts


async def require_topics(kafka: KafkaSettings, specs: list[TopicSpec]) -> None:
    """Refuse to start (:class:`TopicMismatch`) unless every topic exists as ``specs`` say.

    Run before a worker or relay starts, so it never runs on auto-created topics.
    An unreachable broker is waited for (:func:`partition_counts_when_reachable`).
    """
    problems = topic_problems(await partition_counts_when_reachable(kafka), specs)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TopicMismatch(problems[0] + more)


async def ensure_topics(kafka: KafkaSettings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Create the missing topics; return the names created now."""
    specs = specs if specs is not None else topic_specs(kafka.partitions)
    admin = _admin(kafka)
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
