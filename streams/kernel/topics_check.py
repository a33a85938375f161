"""The start-up check of the topics a deployable needs (``zapstream topics ensure`` creates them).

Every deployable (relay, worker, sink, webhook) runs :func:`require_topics` before it
starts: a topic that is missing or has another partition count is a refused start
(:class:`TopicMismatch`, a :class:`~streams.kernel.failures.StartRefused`: one line,
exit 2). The operator command that creates them is :mod:`connectors.ops.topics`.

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

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError

from streams.kernel.contract import TopicSpec, topic_specs
from streams.kernel.failures import StartRefused, classify_kafka_security
from streams.kernel.kafka_access import DOCS, component_topics
from streams.kernel.runtime.backoff import Backoff
from streams.kernel.runtime.outage import OutageLog
from streams.kernel.settings import KafkaSettings

log = logging.getLogger(__name__)

ENSURE_HINT = "run `zapstream topics ensure`"


class TopicMismatch(StartRefused):
    """A topic is missing, or exists with another partition count than zapstream needs."""


class KafkaSecurityRefused(StartRefused):
    """The brokers' TLS certificate does not verify, or they refuse the SASL login."""


_NEEDS = ("relay", "worker", "sink", "webhook")
"""The deployables that check their topics at start: each the topics its Kafka access
(:mod:`streams.kernel.kafka_access`) says it reads or writes, and no other (with ACLs
it may not even see another)."""


def all_topic_specs(kafka: KafkaSettings) -> list[TopicSpec]:
    """Every topic ``zapstream topics ensure`` creates: partitions, configs, the topic prefix."""
    return topic_specs(kafka.partitions, names=kafka.names)


def deployable_topic_specs(deployable: str, kafka: KafkaSettings) -> list[TopicSpec]:
    """The topics ``zapstream <deployable>`` reads or writes, with their partition counts."""
    wanted = set(component_topics(deployable, kafka.names))
    return [s for s in all_topic_specs(kafka) if s.name in wanted]


def worker_topic_specs(kafka: KafkaSettings) -> list[TopicSpec]:
    """Every topic ``zapstream worker`` reads or writes, changelogs (state, parked) included
    (not ``zapstream.invalid``: the relay writes it, the sink reads it)."""
    return deployable_topic_specs("worker", kafka)


def relay_topic_specs(kafka: KafkaSettings) -> list[TopicSpec]:
    """The topics ``zapstream relay`` produces to."""
    return deployable_topic_specs("relay", kafka)


def _admin(kafka: KafkaSettings) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(client_id="zapstream-admin", **kafka.client_options())


async def kafka_security_problem(kafka: KafkaSettings, timeout_s: float = 10.0) -> str | None:
    """After a failed bootstrap: why, if TLS or SASL is to blame (one line), else None.

    aiokafka's bootstrap logs each broker's error and raises "unable to bootstrap",
    which reads like a broker that is down. One more connection to each bootstrap
    server, with the clients' options, shows the real cause
    (:func:`~streams.kernel.failures.classify_kafka_security`).
    """
    protocol = kafka.security_protocol
    if not (protocol.uses_tls or protocol.uses_sasl):
        return None
    from aiokafka.conn import collect_hosts, create_conn

    options = kafka.security_options()
    for host, port, _ in collect_hosts(kafka.bootstrap_servers, randomize=False):
        try:
            conn = await asyncio.wait_for(
                create_conn(host, port, client_id="zapstream-check", **options), timeout_s
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            problem = classify_kafka_security(exc)
        except KafkaError as exc:
            problem = classify_kafka_security(exc)
        else:
            conn.close()
            continue
        if problem is not None:
            return problem
    return None


async def _started_admin(kafka: KafkaSettings) -> AIOKafkaAdminClient:
    """A started admin client; a TLS or SASL refusal raises :class:`KafkaSecurityRefused`."""
    admin = _admin(kafka)
    try:
        with _quiet_aiokafka():
            await admin.start()
    except KafkaConnectionError:
        await admin.close()
        problem = await kafka_security_problem(kafka)
        if problem is not None:
            raise KafkaSecurityRefused(problem) from None
        raise
    return admin


async def _partition_counts(admin: AIOKafkaAdminClient) -> dict[str, int]:
    # describe_topics() without names sends Metadata with a null topic list: all
    # topics, and no auto-creation (naming a topic could create it).
    described = await admin.describe_topics()
    return {str(d["topic"]): len(d["partitions"]) for d in described}


async def partition_counts(kafka: KafkaSettings) -> dict[str, int]:
    """Every topic of the cluster and its partition count; creates nothing."""
    admin = await _started_admin(kafka)
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


def acl_hidden_message(kafka: KafkaSettings, topics: list[str], deployable: str | None) -> str:
    """A topic the SASL user cannot see: missing, or hidden by the broker's ACLs."""
    from streams.kernel.kafka_access import access_table

    user = kafka.sasl_username
    more = f" (and {len(topics) - 1} more)" if len(topics) > 1 else ""
    access = access_table(kafka.names).get(deployable or "")
    needs = f"; {access.needs_line(topics[0])}" if access is not None else ""
    return (
        f"Kafka user {user} cannot see topic {topics[0]}{more}: it does not exist ({ENSURE_HINT}) "
        f"or the broker's ACLs do not allow this user to describe it: check "
        f"ZAPSTREAM_KAFKA_SASL_USERNAME (each component has a Kafka user of its own) and the "
        f"user's ACLs ({DOCS}){needs}"
    )


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
    retried with the edges' capped, jittered :class:`~streams.kernel.runtime.backoff.Backoff`
    for as long as it lasts, logged once when the outage starts and once when it
    ends (:class:`~streams.kernel.runtime.outage.OutageLog`).
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


async def require_topics(
    kafka: KafkaSettings, specs: list[TopicSpec], deployable: str | None = None
) -> None:
    """Refuse to start (:class:`TopicMismatch`) unless every topic exists as ``specs`` say.

    Run before a worker or relay starts, so it never runs on auto-created topics.
    An unreachable broker is waited for (:func:`partition_counts_when_reachable`).
    With SASL, a broker lists only the topics the user may describe: a missing topic
    may be one its ACLs hide, and the line says so, naming the user and what
    ``deployable`` needs on it.
    """
    counts = await partition_counts_when_reachable(kafka)
    if kafka.security_protocol.uses_sasl:
        hidden = [s.name for s in specs if s.name not in counts]
        if hidden:
            raise TopicMismatch(acl_hidden_message(kafka, hidden, deployable))
    problems = topic_problems(counts, specs)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TopicMismatch(problems[0] + more)
