"""The Apache Kafka dev/test broker (devtools.stack.kafka_broker) on real JVMs, and its cost.

One KRaft node: ``zapstream topics ensure`` creates the topics on it, records go round
trip, a SIGKILL and a restart on the same log dirs keep records and committed offsets,
and producing to a topic nobody created fails (auto-creation is off, as in production).
Three nodes: a replication-factor-3 topic with ``min.insync.replicas=2`` keeps taking
``acks=all`` writes with the leader of most of its partitions SIGKILLed. And the
pipeline on it: relay and worker deliver every message once and in order.

Each test prints its figures (start times, RSS, idle CPU).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from devtools.bench.support import cpu_seconds, proc_status_mib
from devtools.stack.delivery_audit import audit
from devtools.stack.kafka_broker import KafkaBroker, KafkaCluster, kafka_metadata, kafka_version
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import INTENTS, topic_specs
from streams.kernel.settings import BrokerFlavor, KafkaSettings
from streams.kernel.topics_check import partition_counts
from tests.integration.support import (
    Arrivals,
    enqueue_conversations,
    wait_for_status,
    wait_until,
    zapstream,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with KafkaBroker() as node:
        print(
            f"\nApache Kafka {kafka_version()} (KRaft, 1 node): storage format "
            f"{node.last_format_s:.1f} s, JVM start to first metadata {node.last_start_s:.1f} s, "
            f"RSS {proc_status_mib(node.pid, 'VmRSS'):.0f} MiB"
        )
        yield node


def kafka_env(bootstrap: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
    env.update(
        {
            "PYTHONPATH": str(REPO_ROOT),
            "ZAPSTREAM_KAFKA_BROKERS": bootstrap,
            "ZAPSTREAM_KAFKA_FLAVOR": "kafka",
            "ZAPSTREAM_KAFKA_PARTITIONS": str(PARTITIONS),
        }
    )
    env.update(extra)
    return env


def settings(bootstrap: str) -> KafkaSettings:
    return KafkaSettings(brokers=bootstrap, flavor=BrokerFlavor.KAFKA, partitions=PARTITIONS)


async def produce(
    bootstrap: str, topic: str, values: list[bytes], *, key_of: int = 8
) -> list[tuple[int, int]]:
    """Send ``values`` with ``acks=all`` and idempotence, keyed by their index mod ``key_of``;
    return (partition, offset) of each."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=str(i % key_of).encode())
            for i, value in enumerate(values)
        ]
        return [(m.partition, m.offset) for m in await asyncio.gather(*futures)]
    finally:
        await producer.stop()


async def read_all(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0
) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of the first ``expected`` records of ``topic``, from the start."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        found: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while len(found) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            found.extend(
                (r.partition, r.offset, r.value or b"") for rs in batch.values() for r in rs
            )
        return found
    finally:
        await consumer.stop()


# --------------------------------------------------------------------------- one node


def test_topics_ensure_creates_every_topic_and_records_go_round_trip(broker: KafkaBroker) -> None:
    env = kafka_env(broker.bootstrap)
    code, out, err = zapstream(["topics", "ensure"], env)
    assert code == 0, err
    assert out.startswith("topics created: ") and INTENTS in out
    code, out, _ = zapstream(["topics", "ensure"], env)
    assert (code, out.strip()) == (0, "topics created: none (all exist)")
    counts = asyncio.run(partition_counts(settings(broker.bootstrap)))
    assert {s.name: s.partitions for s in topic_specs(PARTITIONS)}.items() <= counts.items()

    values = [f"round-trip-{i}".encode() for i in range(200)]
    sent = asyncio.run(produce(broker.bootstrap, INTENTS, values))
    got = asyncio.run(read_all(broker.bootstrap, INTENTS, len(values)))
    assert sorted(got) == sorted((p, o, v) for (p, o), v in zip(sent, values, strict=True))
    # Keyed: each key on one partition, in the order sent.
    by_partition: dict[int, list[bytes]] = {}
    for partition, _, value in sorted(got):
        by_partition.setdefault(partition, []).append(value)
    for partition, in_log in by_partition.items():
        assert in_log == [v for (p, _), v in zip(sent, values, strict=True) if p == partition]


def test_producing_to_a_topic_nobody_created_fails(broker: KafkaBroker) -> None:
    topic = f"never-created-{uuid.uuid4().hex[:8]}"

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=3000)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"x")
        finally:
            await producer.stop()

    with pytest.raises(KafkaError):
        asyncio.run(send())
    assert topic not in kafka_metadata(broker.listen_port, None).topics


def test_sigkill_and_restart_on_the_same_log_dirs_keep_records_and_offsets(
    broker: KafkaBroker,
) -> None:
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    group = f"group-{uuid.uuid4().hex[:8]}"

    async def create_and_commit() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
        finally:
            await admin.close()
        await produce(broker.bootstrap, topic, [f"v{i}".encode() for i in range(500)])
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            # Assigned, not subscribed: a commit without a group join (generation -1).
            consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
            await consumer.commit({TopicPartition(topic, 0): 7, TopicPartition(topic, 1): 11})
        finally:
            await consumer.stop()

    async def committed() -> dict[int, int | None]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            return {p: await consumer.committed(TopicPartition(topic, p)) for p in (0, 1)}
        finally:
            await consumer.stop()

    asyncio.run(create_and_commit())
    before = sorted(asyncio.run(read_all(broker.bootstrap, topic, 500)))
    assert len(before) == 500
    pid = broker.pid
    broker.kill()
    assert not Path(f"/proc/{pid}").exists()  # kill() waited for it and reaped it
    broker.restart()
    print(f"\nrestart after SIGKILL to first metadata: {broker.last_start_s:.1f} s")
    assert broker.pid != pid
    assert sorted(asyncio.run(read_all(broker.bootstrap, topic, 500))) == before
    # Right after the restart the broker may not know the topic's partitions yet (the CI run
    # logged NotLeaderForPartition): its OffsetFetch answers UNKNOWN_TOPIC_OR_PARTITION,
    # which aiokafka's committed() turns into None (a warning, no retry): a CI run read None
    # for both. Lost offsets never come back, so this still fails on them.
    wait_until(
        lambda: asyncio.run(committed()) == {0: 7, 1: 11},
        30,
        "the group's committed offsets after the restart",
        interval_s=1.0,
    )


def test_what_one_node_costs(broker: KafkaBroker) -> None:
    """RSS after start and after a light load, and idle CPU over 10 s, from /proc."""
    rss_start = proc_status_mib(broker.pid, "VmRSS")
    topic = f"load-{uuid.uuid4().hex[:8]}"

    async def load() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]
            )
        finally:
            await admin.close()
        await produce(broker.bootstrap, topic, [os.urandom(512) for _ in range(20_000)])

    started = time.monotonic()
    asyncio.run(load())
    assert len(asyncio.run(read_all(broker.bootstrap, topic, 20_000, timeout_s=60))) == 20_000
    load_s = time.monotonic() - started
    rss_load = proc_status_mib(broker.pid, "VmRSS")
    window_s = 10.0
    cpu_before, wall_before = cpu_seconds(broker.pid), time.monotonic()
    # The window is the measurement itself, not a wait for a condition.
    time.sleep(window_s)
    idle = (cpu_seconds(broker.pid) - cpu_before) / (time.monotonic() - wall_before)
    print(
        f"\nApache Kafka node: RSS {rss_start:.0f} MiB after start, {rss_load:.0f} MiB after "
        f"20,000 x 512 B produced and read ({load_s:.1f} s), "
        f"VmHWM {proc_status_mib(broker.pid, 'VmHWM'):.0f} MiB; idle CPU "
        f"{idle * 100:.1f}% of a core over {window_s:g} s"
    )
    assert rss_load < 1024, "one node should stay well under 1 GiB"
    assert idle < 0.25, "an idle node should use a small fraction of a core"


# --------------------------------------------------------------------------- three nodes


def test_three_nodes_keep_taking_acks_all_writes_with_the_leader_of_most_partitions_killed() -> (
    None
):
    with KafkaCluster(nodes=3) as cluster:
        print(f"\nApache Kafka 3-node cluster: start to all serving {cluster.last_start_s:.1f} s")
        topic = f"replicated-{uuid.uuid4().hex[:8]}"

        async def create() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
            await admin.start()
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            topic,
                            num_partitions=6,
                            replication_factor=3,
                            topic_configs={"min.insync.replicas": "2"},
                        )
                    ]
                )
            finally:
                await admin.close()

        asyncio.run(create())
        wait_until(
            lambda: all(len(p.isr) == 3 for p in cluster.metadata([topic]).topics[topic][1]),
            30,
            "every partition's ISR at 3 nodes",
        )
        first = [f"before-{i}".encode() for i in range(300)]
        asyncio.run(produce(cluster.bootstrap, topic, first))

        victim = cluster.leader_of_most_partitions(topic)
        led = sum(
            1 for leader in cluster.partition_leaders(topic).values() if leader == victim.node_id
        )
        victim.kill()
        killed_at = time.monotonic()
        second = [f"after-{i}".encode() for i in range(300)]
        asyncio.run(produce(cluster.bootstrap, topic, second))
        failover_s = time.monotonic() - killed_at
        leaders = cluster.partition_leaders(topic)
        assert victim.node_id not in leaders.values() and -1 not in leaders.values()

        got = asyncio.run(read_all(cluster.bootstrap, topic, 600))
        assert sorted(v for _, _, v in got) == sorted(first + second)
        # Per key (one partition each), the log holds the order sent.
        for key in range(8):
            sent = [v for batch in (first, second) for i, v in enumerate(batch) if i % 8 == key]
            in_log = [v for _, _, v in sorted(got) if v in set(sent)]
            assert in_log == sent

        victim.restart()
        wait_until(
            lambda: all(len(p.isr) == 3 for p in cluster.metadata([topic]).topics[topic][1]),
            60,
            f"node {victim.node_id} back in every partition's ISR",
        )
        print(
            f"killed node {victim.node_id} (led {led} of 6 partitions): 300 acks=all writes "
            f"done {failover_s:.1f} s after the SIGKILL; restart to first metadata "
            f"{victim.last_start_s:.1f} s; RSS "
            + ", ".join(
                f"node {n.node_id} {proc_status_mib(n.pid, 'VmRSS'):.0f} MiB" for n in cluster.nodes
            )
        )


# --------------------------------------------------------------------------- the pipeline


def test_the_pipeline_on_apache_kafka_delivers_every_message_once_and_in_order() -> None:
    with LocalPipeline(partitions=PARTITIONS, broker="kafka") as pipeline:
        assert pipeline.broker_description == f"Apache Kafka {kafka_version()} (KRaft, 1 node)"
        started = time.monotonic()
        pipeline.start_relay()
        pipeline.start_worker()
        ready_s = time.monotonic() - started
        keys = enqueue_conversations(
            pipeline.dsn, uuid.uuid4().hex[:8], messages=500, conversations=25
        )
        enqueued = time.monotonic()
        arrivals = Arrivals(pipeline)
        arrivals.wait_for(keys, timeout_s=120)
        delivered_s = time.monotonic() - enqueued
        wait_for_status(pipeline.dsn, keys, "ACCEPTED", 60)
        report = audit(keys, arrivals.refresh())
        print(
            f"\npipeline on {pipeline.broker_description}: relay + worker ready in "
            f"{ready_s:.1f} s, 500 messages at the gateway {delivered_s:.1f} s after enqueue; "
            f"duplicates {report.duplicate_count}, order violations "
            f"{len(report.order_violations)}"
        )
        assert report.accepted_unique == 500
        assert report.duplicate_count == 0 and not report.order_violations
