"""Four guarantees only Apache Kafka gives, proved on a real Kafka 4.4 broker.

1. The relay's idempotent producer (``acks=all``, ``enable_idempotence``): with the
   services' Kafka connections cut mid-batch, again and again, zapstream.intents holds
   every job exactly once and each conversation's records in outbox order.
2. Lag from ListOffsets (the lag monitor's Kafka default) is exact after batched
   produce requests, per partition and summed, before and after a partial commit.
3. With ``auto.create.topics.enable=false``: ``zapstream topics ensure`` creates every
   topic the contract names (partitions, cleanup policy, retention as the broker
   describes them), and the relay and the worker refuse to start (exit 2, one line)
   on a missing topic or a wrong partition count, creating nothing.
4. Consumer-group joins: how long a worker (Faust) and the state sink take from start to
   their first assignment with ``group.initial.rebalance.delay.ms`` at 0 (tests) and at
   3000 (Kafka's default, production), and how long the rebalance takes when a second
   worker joins and when one is SIGKILLed (the session timeout); after the kill the dead
   worker's partitions are reassigned and processing resumes.

Real processes throughout: PostgreSQL, Kafka JVMs, the gateway simulator, relay,
workers, sink and lag monitor as ``zapstream`` subprocesses. Each test prints its
figures; none asserts a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from connectors.ops.topics import ensure_topics
from devtools.stack.delivery_audit import KEY_IN_TEXT, audit
from devtools.stack.devstack import ManagedProcess
from devtools.stack.kafka_broker import KafkaBroker, kafka_metadata
from devtools.stack.local_pipeline import REPO_ROOT, LocalPipeline
from streams.kernel.contract import HEADER_JOB_ID, INTENTS
from streams.kernel.settings import KafkaSettings
from streams.kernel.topics_check import all_topic_specs
from tests.integration.support import Arrivals, enqueue_conversations, wait_until, zapstream
from tests.integration.topic_reader import read_topic

pytestmark = pytest.mark.integration

PARTITIONS = 4


@dataclasses.dataclass
class Stack:
    """The module's pipeline: Apache Kafka behind a proxy the tests can cut, and a relay."""

    pipeline: LocalPipeline
    relay: ManagedProcess


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with LocalPipeline(
        partitions=PARTITIONS, broker="kafka", proxied=True, with_sink=False
    ) as pipeline:
        relay = pipeline.start_relay()
        yield Stack(pipeline, relay)


# --------------------------------------------------------------------------- 1. idempotence


def _jobs(dsn: str, keys: list[str]) -> dict[int, bytes]:
    """Job id -> the record key the relay gives it (instance and conversation)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, instance_id, conversation_key FROM outbox_jobs "
            "WHERE idempotency_key = ANY(%s)",
            (keys,),
        ).fetchall()
    return {int(i): f"{instance}\x1f{conversation}".encode() for i, instance, conversation in rows}


def _at_least(counter: list[int], n: int) -> Callable[[], bool]:
    return lambda: counter[0] >= n


ROWS = 3_000
CONVERSATIONS = 300
CUTS = 4
CUT_S = 1.5
DROP_S = 0.3


def test_cut_connections_mid_batch_add_no_duplicate_and_keep_each_conversation_in_order(
    stack: Stack,
) -> None:
    pipeline, relay = stack.pipeline, stack.relay
    proxy = pipeline.kafka_proxy
    assert proxy is not None
    since = relay.log_offset()
    dropped_before = proxy.replies_dropped
    run = uuid.uuid4().hex[:8]
    committed = [0]

    def pace(n: int) -> None:
        committed[0] = n
        time.sleep(0.05)  # the application's rate: the stream outlasts the cuts

    keys: list[str] = []
    writer = threading.Thread(
        target=lambda: keys.extend(
            enqueue_conversations(
                pipeline.dsn,
                run,
                messages=ROWS,
                conversations=CONVERSATIONS,
                per_transaction=25,
                after_transaction=pace,
            )
        )
    )
    writer.start()
    cuts = 0
    try:
        for i in range(CUTS):
            # Mid-stream: rows keep committing while the relay produces them.
            at = (i + 1) * ROWS // (CUTS + 2)
            wait_until(_at_least(committed, at), 60, f"{at} rows committed")
            # Produce requests reach the broker, which appends them; their acknowledgements
            # are lost with the connection: the producer must retry what Kafka already has.
            proxy.drop_replies()
            time.sleep(DROP_S)  # the fault's shape, not a wait for a condition
            proxy.cut()
            cuts += 1
            time.sleep(CUT_S)
            proxy.restore()
    finally:
        proxy.restore()
        writer.join(timeout=120)
    written_at = time.monotonic()
    assert len(keys) == ROWS

    jobs = _jobs(pipeline.dsn, keys)
    assert len(jobs) == ROWS

    def produced() -> list[tuple[int, int, int, bytes | None]]:
        out = []
        for r in read_topic(pipeline.kafka.bootstrap, INTENTS):
            job = r.headers.get(HEADER_JOB_ID, b"")
            if job.isdigit() and int(job) in jobs:
                out.append((r.partition, r.offset, int(job), r.key))
        return out

    records = produced()
    deadline = time.monotonic() + 60
    while len({job for _, _, job, _ in records}) < ROWS and time.monotonic() < deadline:
        time.sleep(0.5)
        records = produced()
    caught_up_s = time.monotonic() - written_at

    counts = Counter(job for _, _, job, _ in records)
    duplicates = sum(n - 1 for n in counts.values())
    missing = ROWS - len(counts)
    by_key: dict[bytes | None, list[int]] = defaultdict(list)
    for _, _, job, key in sorted(records):  # partition, then offset: the log's order
        by_key[key].append(job)
    outbox_order: dict[bytes, list[int]] = defaultdict(list)
    for job in sorted(jobs):  # one writer, in commit order: ids are each conversation's order
        outbox_order[jobs[job]].append(job)
    # A record whose job id is not above every earlier one of its conversation's is out of
    # order (a retried batch appended after later ones would be); and each conversation's
    # log, once, must be its outbox rows, all of them, in id order.
    violations = sum(
        1 for in_log in by_key.values() for a, b in zip(in_log, in_log[1:], strict=False) if b <= a
    )
    wrong_keys = [k for k, ids in outbox_order.items() if list(dict.fromkeys(by_key[k])) != ids]
    # A relay that gave up on Kafka would stream the slot again from its confirmed position
    # (duplicates idempotence cannot catch): it logs that line at each (re)start.
    restreams = relay.log_path.read_bytes()[since:].count(b"relay streaming slot")
    print(
        f"\n[idempotent relay] rows={ROWS} conversations={CONVERSATIONS} records={len(records)} "
        f"duplicates={duplicates} order_violations={violations} missing={missing} "
        f"cuts={cuts} (each {DROP_S:g} s of dropped acknowledgements, then {CUT_S:g} s cut) "
        f"acknowledgement_bytes_dropped={proxy.replies_dropped - dropped_before} "
        f"relay_restreams={restreams} all_in_kafka={caught_up_s:.1f}s_after_the_last_commit"
    )
    assert missing == 0
    assert duplicates == 0, [j for j, n in counts.items() if n > 1][:10]
    assert violations == 0 and not wrong_keys, wrong_keys[:5]
    assert len(by_key) == CONVERSATIONS
    assert proxy.replies_dropped > dropped_before, "no answer was lost: nothing to retry"
    assert restreams == 0, "the relay restreamed the slot: not the producer's own retries"


# --------------------------------------------------------------------------- 2. exact lag

LAG_RECORDS = {0: 487, 1: 1_203, 2: 0, 3: 650}
"""Records produced to each partition of the lag test's topic (partition 2: none)."""
LAG_COMMITS = {0: 300, 1: 1_203, 3: 1}
"""What the group then consumes and commits: part, all, nothing (2), one record."""
RECORDS_PER_BATCH = 100


async def _produce_in_batches(bootstrap: str, topic: str) -> dict[int, list[int]]:
    """Produce LAG_RECORDS in record batches of up to RECORDS_PER_BATCH (each one produce
    entry, several per request: the producer lingers); return each batch's base offset."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=50
    )
    await producer.start()
    try:
        sent: dict[int, list[Any]] = defaultdict(list)
        for partition, count in LAG_RECORDS.items():
            i = 0
            while i < count:
                batch = producer.create_batch()
                while i < count and batch.record_count() < RECORDS_PER_BATCH:
                    value = f"lag-{partition}-{i}".encode()
                    assert batch.append(key=None, value=value, timestamp=None) is not None
                    i += 1
                sent[partition].append(await producer.send_batch(batch, topic, partition=partition))
        return {p: [(await f).offset for f in futures] for p, futures in sent.items()}
    finally:
        await producer.stop()


async def _consume_and_commit(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """Read each partition up to LAG_COMMITS as ``group`` and commit there; return how many
    records were read per partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = {p: TopicPartition(topic, p) for p in LAG_COMMITS}
        consumer.assign(list(tps.values()))
        await consumer.seek_to_beginning(*tps.values())
        read: Counter[int] = Counter()
        async with asyncio.timeout(60):
            while any(read[p] < n for p, n in LAG_COMMITS.items()):
                for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                    read[tp.partition] += sum(
                        1 for r in records if r.offset < LAG_COMMITS[tp.partition]
                    )
        await consumer.commit({tps[p]: n for p, n in LAG_COMMITS.items()})
        return dict(read)
    finally:
        await consumer.stop()


async def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
        )
    finally:
        await admin.close()


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=5.0).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@dataclasses.dataclass(frozen=True)
class _Reading:
    latest: dict[int, float]
    lag: dict[int, float]
    lag_seconds: dict[int, float]
    committed: dict[int, float]
    sum_lag: float | None
    max_lag: float | None


def _reading(url: str, group: str, topic: str) -> _Reading:
    samples = _samples(url)

    def per_partition(name: str, **labels: str) -> dict[int, float]:
        out = {}
        for (n, ls), value in samples.items():
            d = dict(ls)
            if (
                n == name
                and d.get("topic") == topic
                and all(d.get(k) == v for k, v in labels.items())
            ):
                out[int(d["partition"])] = value
        return out

    return _Reading(
        latest=per_partition("kafka_partition_latest_offset"),
        lag=per_partition("kafka_consumergroup_group_lag", group=group),
        lag_seconds=per_partition("kafka_consumergroup_group_lag_seconds", group=group),
        committed=per_partition("kafka_consumergroup_group_offset", group=group),
        sum_lag=samples.get(("kafka_consumergroup_group_sum_lag", (("group", group),))),
        max_lag=samples.get(("kafka_consumergroup_group_max_lag", (("group", group),))),
    )


def test_lag_from_list_offsets_is_exact_after_batched_produce(stack: Stack) -> None:
    pipeline = stack.pipeline
    bootstrap = pipeline.kafka.bootstrap
    run = uuid.uuid4().hex[:8]
    topic, group = f"guarantees-lag-{run}", f"guarantees-lag-{run}"
    asyncio.run(_create_topic(bootstrap, topic, len(LAG_RECORDS)))
    bases = asyncio.run(_produce_in_batches(bootstrap, topic))
    # Each batch is one record batch in the log: its base offset is the count before it.
    for partition, offsets in bases.items():
        assert offsets == list(range(0, LAG_RECORDS[partition], RECORDS_PER_BATCH))
    total = sum(LAG_RECORDS.values())

    monitor, url = pipeline.start_lag_monitor(
        f"lag-monitor-{run}",
        env={"ZAPSTREAM_LAG_INTERVAL_S": "1", "ZAPSTREAM_LAG_GROUPS": json.dumps({group: [topic]})},
    )
    try:
        monitor.wait_for_log(r"lag monitor watching .*\(list_offsets\)", timeout_s=5)
        # Within a second or two (a minute, before the monitor asked the admin client for
        # the topics' partitions rather than its unassigned consumer's metadata).
        wait_until(lambda: _reading(url, group, topic).sum_lag is not None, 30, "a first reading")
        before = _reading(url, group, topic)
        read = asyncio.run(_consume_and_commit(bootstrap, topic, group))
        wait_until(
            lambda: _reading(url, group, topic).committed.get(0) == LAG_COMMITS[0],
            30,
            "a reading after the commit",
        )
        after = _reading(url, group, topic)
    finally:
        monitor.terminate(timeout_s=15)

    left = {p: n - LAG_COMMITS.get(p, 0) for p, n in LAG_RECORDS.items()}
    print(
        f"\n[lag from ListOffsets] {total} records in "
        f"{sum(len(o) for o in bases.values())} batches of up to {RECORDS_PER_BATCH}; "
        f"produced {LAG_RECORDS}\n  before any commit: latest {before.latest} lag {before.lag} "
        f"sum {before.sum_lag} max {before.max_lag}\n  after reading {read} and committing "
        f"{LAG_COMMITS}: lag {after.lag} sum {after.sum_lag} max {after.max_lag} lag_seconds "
        + str({p: round(s, 1) for p, s in after.lag_seconds.items()})
    )
    assert before.latest == LAG_RECORDS
    assert before.lag == LAG_RECORDS
    assert (before.sum_lag, before.max_lag) == (total, max(LAG_RECORDS.values()))
    assert before.committed == {}
    assert after.latest == LAG_RECORDS
    assert after.committed == LAG_COMMITS
    assert after.lag == left
    assert (after.sum_lag, after.max_lag) == (sum(left.values()), max(left.values()))
    assert after.lag_seconds[1] == 0 and after.lag_seconds[2] == 0
    assert after.lag_seconds[0] > 0 and after.lag_seconds[3] > 0


# --------------------------------------------------------------------------- 3. no auto-creation

REBALANCE_DELAY_PRODUCTION_MS = 3000
"""``group.initial.rebalance.delay.ms``: Kafka's default, what a production cluster runs."""


@pytest.fixture(scope="module")
def production_broker() -> Iterator[KafkaBroker]:
    """A second node, with Kafka's own group.initial.rebalance.delay.ms and no topic yet."""
    with KafkaBroker(
        config={"group.initial.rebalance.delay.ms": str(REBALANCE_DELAY_PRODUCTION_MS)}
    ) as node:
        yield node


def _service_env(pipeline: LocalPipeline, bootstrap: str) -> dict[str, str]:
    """What an operator's ``zapstream`` sees: the pipeline's settings on another broker."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
    env.update(pipeline.env())
    env.update({"PYTHONPATH": str(REPO_ROOT), "ZAPSTREAM_KAFKA_BROKERS": bootstrap})
    return env


async def _describe(
    bootstrap: str, topics: list[str]
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The broker's own configuration, and each topic's, as DescribeConfigs answers."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        resources = [ConfigResource(ConfigResourceType.BROKER, "1")] + [
            ConfigResource(ConfigResourceType.TOPIC, t) for t in topics
        ]
        configs: dict[tuple[int, str], dict[str, str]] = {}
        for response in await admin.describe_configs(resources):
            for error, message, kind, name, entries, *_ in response.resources:
                assert error == 0, (name, message)
                configs[(kind, name)] = {e[0]: e[1] for e in entries}
    finally:
        await admin.close()
    broker = configs.pop((int(ConfigResourceType.BROKER), "1"))
    return broker, {name: c for (_, name), c in configs.items()}


async def _admin_do(bootstrap: str, action: Callable[[AIOKafkaAdminClient], Any]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await action(admin)
    finally:
        await admin.close()


def _zapstream_topics(node: KafkaBroker) -> dict[str, PartitionsAndReplicas]:
    """zapstream's topics in the broker's metadata: partitions and replicas of each."""
    metadata = kafka_metadata(node.listen_port, None)  # every topic; names none, creates none
    return {
        name: PartitionsAndReplicas(len(parts), {len(p.replicas) for p in parts})
        for name, (error, parts) in metadata.topics.items()
        if name.startswith("zapstream.") and error == 0
    }


@dataclasses.dataclass(frozen=True)
class PartitionsAndReplicas:
    partitions: int
    replicas: set[int]


def _refused(command: str, env: dict[str, str], *needles: str) -> str:
    """Run ``zapstream COMMAND``; it must exit 2 with one line holding every needle."""
    code, out, err = zapstream(command.split(), env, timeout_s=90)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (command, code, out, err)
    assert len(lines) == 1, (command, err)
    for needle in needles:
        assert needle in lines[0], (command, needle, lines[0])
    return lines[0]


def test_topics_ensure_creates_the_contract_and_services_refuse_missing_or_wrong_topics(
    stack: Stack, production_broker: KafkaBroker
) -> None:
    """On a broker that never auto-creates: nothing exists until ``topics ensure``, and a
    refused start creates nothing either."""
    node = production_broker
    env = _service_env(stack.pipeline, node.bootstrap)
    specs = all_topic_specs(KafkaSettings(partitions=PARTITIONS))  # what topics ensure creates
    names = [s.name for s in specs]
    broker_config, _ = asyncio.run(_describe(node.bootstrap, []))
    assert broker_config["auto.create.topics.enable"] == "false"
    if _zapstream_topics(node):  # another test of this module ran first on this node
        asyncio.run(
            _admin_do(node.bootstrap, lambda a: a.delete_topics(list(_zapstream_topics(node))))
        )
        wait_until(lambda: not _zapstream_topics(node), 30, "zapstream's topics deleted")

    # Missing: both refuse, naming the topic and the command; no topic appears.
    refusals = [
        _refused(c, env, "does not exist: run `zapstream topics ensure`")
        for c in ("relay", "worker")
    ]
    assert _zapstream_topics(node) == {}

    # Wrong partition count: refused, naming the setting; topics ensure refuses it too.
    wrong = 3
    asyncio.run(_admin_do(node.bootstrap, lambda a: a.create_topics([NewTopic(INTENTS, wrong, 1)])))
    wait_until(lambda: INTENTS in _zapstream_topics(node), 30, f"{INTENTS} in the metadata")
    mismatch = (
        f"topic {INTENTS} has {wrong} partitions, ZAPSTREAM_KAFKA_PARTITIONS says {PARTITIONS}"
    )
    refusals += [_refused(c, env, mismatch) for c in ("relay", "worker", "topics ensure")]
    assert _zapstream_topics(node)[INTENTS].partitions == wrong

    # Deleted and ensured: every topic of the contract, as the contract says.
    asyncio.run(_admin_do(node.bootstrap, lambda a: a.delete_topics([INTENTS])))
    wait_until(lambda: INTENTS not in _zapstream_topics(node), 30, f"{INTENTS} deleted")
    code, out, err = zapstream(["topics", "ensure"], env)
    assert (code, out.strip()) == (0, f"topics created: {INTENTS}"), err
    assert zapstream(["topics", "ensure"], env)[1].strip() == "topics created: none (all exist)"
    have = _zapstream_topics(node)
    _, configs = asyncio.run(_describe(node.bootstrap, names))
    auto_create = broker_config["auto.create.topics.enable"]
    print(f"\n[no auto-creation] auto.create.topics.enable={auto_create}")
    for line in refusals:
        print(f"  refused: {line}")
    for spec in specs:
        got = {k: configs[spec.name][k] for k in spec.configs}
        print(f"  {spec.name}: {have[spec.name].partitions} partitions, {got}")
        assert have[spec.name] == PartitionsAndReplicas(spec.partitions, {1})
        assert got == dict(spec.configs), spec.name
    assert set(have) == set(names)


# --------------------------------------------------------------------------- 4. group joins

WORKER_GROUP = "zapstream-worker"
SINK_GROUP = "zapstream-state-sink"


@dataclasses.dataclass(frozen=True)
class GroupSnapshot:
    """One DescribeGroups answer: when it came, the group's state, each member's partitions."""

    at: float
    state: str
    members: dict[str, frozenset[TopicPartition]]

    def owner_count(self, topic: str) -> int:
        return sum(1 for tps in self.members.values() if any(tp.topic == topic for tp in tps))

    def partitions_of(self, member: str, topic: str) -> set[int]:
        return {tp.partition for tp in self.members.get(member, ()) if tp.topic == topic}

    @property
    def stable(self) -> bool:
        return self.state == "Stable" and all(self.members.values())


class GroupWatch:
    """Asks the broker about ``group`` every 50 ms from a thread; keeps every change seen.

    The group coordinator's own view (DescribeGroups), so a member counts as consuming
    from the moment its assignment is in the group's Stable generation.
    """

    def __init__(self, bootstrap: str, group: str) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.snapshots: list[GroupSnapshot] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._ready = threading.Event()

    def __enter__(self) -> GroupWatch:
        self._thread.start()
        assert self._ready.wait(30), f"no DescribeGroups answer for {self.group}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _run(self) -> None:
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            while not self._stop.is_set():
                try:
                    [response] = await admin.describe_consumer_groups([self.group])
                except KafkaError as exc:
                    # A new broker creates its offsets topic (the coordinators) on demand.
                    assert exc.retriable, exc
                    await asyncio.sleep(0.1)
                    continue
                [(error, _, state, _, _, members, *_)] = response.groups
                if error:
                    # 14/15/16: the coordinator is loading, not elected yet or moved: ask again.
                    assert error in (14, 15, 16), error
                    await asyncio.sleep(0.1)
                    continue
                snapshot = GroupSnapshot(
                    time.monotonic(),
                    state,
                    {
                        member_id: frozenset(
                            ConsumerProtocolMemberAssignment.decode(assignment).partitions()
                            if assignment
                            else ()
                        )
                        for member_id, _, _, _, assignment in members
                    },
                )
                with self._lock:
                    last = self.snapshots[-1] if self.snapshots else None
                    if last is None or (last.state, last.members) != (state, snapshot.members):
                        self.snapshots.append(snapshot)
                self._ready.set()
                await asyncio.sleep(0.05)
        finally:
            await admin.close()

    def first(
        self, predicate: Callable[[GroupSnapshot], bool], after: float, timeout_s: float, what: str
    ) -> GroupSnapshot:
        """The first snapshot taken after ``after`` (monotonic) that satisfies ``predicate``."""
        found: list[GroupSnapshot] = []

        def seen() -> bool:
            with self._lock:
                found[:] = [s for s in self.snapshots if s.at >= after and predicate(s)][:1]
            return bool(found)

        wait_until(seen, timeout_s, f"{what} (group {self.group}: {self.latest()})")
        return found[0]

    def latest(self) -> GroupSnapshot | None:
        with self._lock:
            return self.snapshots[-1] if self.snapshots else None


@dataclasses.dataclass(frozen=True)
class Join:
    """A process's start to its first assignment, and to its 'ready' log line."""

    what: str
    to_assigned_s: float
    to_log_s: float


def _join(
    what: str,
    start: Callable[[], ManagedProcess],
    watch: GroupWatch,
    ready_log: str,
    members: int = 1,
) -> tuple[ManagedProcess, GroupSnapshot, Join]:
    """Start a consumer; wait until the group is Stable with ``members`` members all assigned."""
    started = time.monotonic()
    proc = start()
    snapshot = watch.first(
        lambda s: s.stable and len(s.members) == members, started, 120, f"{what} assigned"
    )
    proc.wait_for_log(ready_log, timeout_s=120)
    return proc, snapshot, Join(what, snapshot.at - started, time.monotonic() - started)


def test_group_joins_and_rebalances_on_kafka(stack: Stack, production_broker: KafkaBroker) -> None:
    pipeline = stack.pipeline
    worker_ready = r"\[\^Worker\]: Ready"
    sink_ready = r"state sink consuming"
    prod_env = {"ZAPSTREAM_KAFKA_BROKERS": production_broker.bootstrap}
    asyncio.run(
        ensure_topics(KafkaSettings(brokers=production_broker.bootstrap, partitions=PARTITIONS))
    )
    joins: list[Join] = []
    with (
        GroupWatch(pipeline.kafka.bootstrap, WORKER_GROUP) as workers,
        GroupWatch(pipeline.kafka.bootstrap, SINK_GROUP) as sinks,
        GroupWatch(production_broker.bootstrap, WORKER_GROUP) as prod_workers,
        GroupWatch(production_broker.bootstrap, SINK_GROUP) as prod_sinks,
    ):
        # First joins of empty groups, as the tests' broker (delay 0) and production's (3 s).
        sink, _, join = _join(
            "sink, delay 0", lambda: pipeline.start_sink("sink", wait=False), sinks, sink_ready
        )
        joins.append(join)
        a, first, join = _join(
            "worker, delay 0",
            lambda: pipeline.start_worker("worker-a", wait=False),
            workers,
            worker_ready,
        )
        joins.append(join)
        [member_a] = first.members
        prod_sink, _, join = _join(
            f"sink, delay {REBALANCE_DELAY_PRODUCTION_MS}",
            lambda: pipeline.start_sink("sink-prod", wait=False, env=prod_env),
            prod_sinks,
            sink_ready,
        )
        joins.append(join)
        prod_worker, _, join = _join(
            f"worker, delay {REBALANCE_DELAY_PRODUCTION_MS}",
            lambda: pipeline.start_worker("worker-prod", wait=False, env=prod_env),
            prod_workers,
            worker_ready,
        )
        joins.append(join)
        for proc in (prod_sink, prod_worker):  # measured: their load would skew what follows
            assert proc.terminate(timeout_s=60) == 0, proc.log_tail()

        # A second worker joins: every member rejoins, the partitions are split.
        joined_at = time.monotonic()
        b = pipeline.start_worker("worker-b", wait=False)
        preparing = workers.first(
            lambda s: s.state == "PreparingRebalance", joined_at, 120, "the rebalance to begin"
        )
        split = workers.first(
            lambda s: s.stable and len(s.members) == 2, joined_at, 120, "two workers assigned"
        )
        b.wait_for_log(worker_ready, timeout_s=120)
        [member_b] = set(split.members) - {member_a}
        assert split.owner_count(INTENTS) == 2
        b_partitions = split.partitions_of(member_b, INTENTS)

        # One is SIGKILLed: nothing happens until its session times out, then the survivor
        # takes every partition and processing resumes.
        run = uuid.uuid4().hex[:8]
        arrivals = Arrivals(pipeline)
        arrivals.refresh()
        b.kill(signal.SIGKILL)
        killed_at = time.monotonic()
        killed_wall = time.time()
        keys = enqueue_conversations(pipeline.dsn, run, messages=200, conversations=20)
        noticed = workers.first(
            lambda s: s.state != "Stable" or member_b not in s.members,
            killed_at,
            120,
            "the coordinator to notice the dead worker",
        )
        alone = workers.first(
            lambda s: s.stable and set(s.members) == {member_a},
            killed_at,
            120,
            "the survivor assigned alone",
        )
        # Every message, on the survivor's partitions and on the dead worker's (never
        # committed on: those were skipped before the worker's transport rewound such partitions).
        report = arrivals.wait_for(keys, timeout_s=120)
        partition_of = _partitions_of_jobs(pipeline, keys)
        on_b = [k for k in keys if partition_of[k] in b_partitions]
        assert on_b, f"no message on the dead worker's partitions {b_partitions}"
        report_b = audit(on_b, arrivals.items)
        first_on_b = min(
            float(item["arrived_at"]) for item in arrivals.items if _key_of(item) in set(on_b)
        )
    sessions = pipeline.kafka_settings()
    print(
        f"\n[group joins] on Apache Kafka, session {sessions.session_timeout_s:g} s, heartbeat "
        f"{sessions.heartbeat_interval_s:g} s"
    )
    for j in joins:
        print(
            f"  {j.what}: start to first assignment {j.to_assigned_s:.1f} s, to its ready log "
            f"{j.to_log_s:.1f} s"
        )
    print(
        f"  second worker: start to the rebalance {preparing.at - joined_at:.1f} s, rebalance "
        f"{split.at - preparing.at:.1f} s, start to both assigned {split.at - joined_at:.1f} s "
        f"({len(b_partitions)} of {PARTITIONS} intents partitions moved)"
    )
    print(
        f"  SIGKILL: noticed {noticed.at - killed_at:.1f} s after, survivor alone "
        f"{alone.at - killed_at:.1f} s after; first message on the dead worker's partitions "
        f"at the gateway {first_on_b - killed_wall:.1f} s after; delivered "
        f"{report_b.accepted_unique}/{len(on_b)} of its, {report.accepted_unique}/{len(keys)} "
        f"in all, duplicates {report.duplicate_count}"
    )
    assert b_partitions, "the second worker got no intents partition"
    assert alone.partitions_of(member_a, INTENTS) == set(range(PARTITIONS))
    assert report.accepted_unique == len(keys) and not report.order_violations
    for proc in (a, sink):
        assert proc.terminate(timeout_s=60) == 0, proc.log_tail()


def _key_of(item: dict[str, Any]) -> str | None:
    match = KEY_IN_TEXT.search(str(item.get("text", "")))
    return match.group(1) if match else None


def _partitions_of_jobs(pipeline: LocalPipeline, keys: list[str]) -> dict[str, int]:
    """Idempotency key -> the zapstream.intents partition its record is on."""
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, idempotency_key FROM outbox_jobs WHERE idempotency_key = ANY(%s)", (keys,)
        ).fetchall()
    key_of = {int(i): str(k) for i, k in rows}
    out = {}
    for r in read_topic(pipeline.kafka.bootstrap, INTENTS):
        job = r.headers.get(HEADER_JOB_ID, b"")
        if job.isdigit() and int(job) in key_of:
            out[key_of[int(job)]] = r.partition
    return out
