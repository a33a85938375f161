"""Two deployments on one Apache Kafka broker, each under its own ``ZAPSTREAM_KAFKA_TOPIC_PREFIX``.

Deployment ``a-`` is a :class:`LocalPipeline` (its ``topics ensure``, relay, worker and sink);
deployment ``b-`` is a second relay, worker and sink on another database of the same
PostgreSQL, with the same gateway simulator, its topics made by ``zapstream topics ensure``
run as an operator would. Both databases number their jobs from 1, and both send to the same
instance names, so a record read across prefixes would show: a duplicate or a missing
message, or a pause of one deployment holding the other's messages.

Checked on the broker (admin client): every topic and every consumer group belongs to one
prefix, nothing unprefixed was created, each group's committed offsets are on its own
prefix's topics only; and a worker's lag metrics carry the topic's and group's real names.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from connectors.outbox.migrate import migrate
from devtools.stack.delivery_audit import audit
from devtools.stack.devstack import find_free_port
from devtools.stack.local_pipeline import REPO_ROOT, LocalPipeline
from streams.kernel.contract import LOGICAL_TOPICS
from tests.integration.support import (
    Arrivals,
    enqueue_conversations,
    wait_for_status,
    wait_until,
    zapstream,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2
MESSAGES = 100
CONVERSATIONS = 10
PAUSED = "inst-00"
"""An instance name both deployments send to; only ``b-`` pauses it."""


async def _broker_names(bootstrap: str) -> tuple[set[str], dict[str, set[str]]]:
    """Every topic, and every consumer group with the topics it committed offsets on."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-topic-prefix")
    await admin.start()
    try:
        topics = set(await admin.list_topics())
        groups: dict[str, set[str]] = {}
        for group_id, _protocol in await admin.list_consumer_groups():
            offsets = await admin.list_consumer_group_offsets(group_id)
            groups[str(group_id)] = {tp.topic for tp in offsets}
        return topics, groups
    finally:
        await admin.close()


def _operator_env(pipeline: LocalPipeline, **extra: str) -> dict[str, str]:
    """What an operator's shell holds: the pipeline's settings, nothing else of ours."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
    return {**env, "PYTHONPATH": str(REPO_ROOT), **pipeline.env(), **extra}


def test_two_prefixes_share_one_broker_and_nothing_else() -> None:
    run = uuid.uuid4().hex[:6]
    with LocalPipeline(
        partitions=PARTITIONS, broker="kafka", topic_prefix="a-", own_broker=True
    ) as pipeline:
        dsn_b = pipeline.postgres.create_database("tenant_b")
        migrate(dsn_b)
        b = {
            "ZAPSTREAM_DATABASE_URL": dsn_b,
            "ZAPSTREAM_KAFKA_TOPIC_PREFIX": "b-",
            # The slot lives in the PostgreSQL cluster, beside a's (not a Kafka name).
            "ZAPSTREAM_RELAY_SLOT": "zapstream_outbox_b",
        }
        code, out, err = zapstream(["topics", "ensure"], _operator_env(pipeline, **b))
        assert code == 0, err
        created = set(out.removeprefix("topics created: ").strip().split(", "))
        assert created == {f"b-{t}" for t in LOGICAL_TOPICS}

        a_web = find_free_port()
        lag = {"ZAPSTREAM_LAG_INTERVAL_S": "1"}
        pipeline.start_relay()
        pipeline.start_worker(env={"ZAPSTREAM_WORKER_WEB_PORT": str(a_web), **lag})
        pipeline.start_relay("relay-b", env=b)
        worker_b = pipeline.start_worker("worker-b", env={**b, **lag})
        pipeline.start_sink("sink-b", env=b)

        # Deployment b pauses an instance both send to; a must not see it.
        since = worker_b.log_offset()
        pause = ["instances", "pause", PAUSED, "--reason", "prefix test", "--by", "test"]
        code, _, err = zapstream(pause, _operator_env(pipeline, **b))
        assert code == 0, err
        worker_b.wait_for_log(rf"instance {PAUSED} paused by test", timeout_s=60, since=since)

        keys_a = enqueue_conversations(
            pipeline.dsn, f"a{run}", messages=MESSAGES, conversations=CONVERSATIONS
        )
        keys_b = enqueue_conversations(
            dsn_b, f"b{run}", messages=MESSAGES, conversations=CONVERSATIONS
        )
        held = [k for k in keys_b if f":{PAUSED}:" in k]
        assert 0 < len(held) < len(keys_b)
        arrivals = Arrivals(pipeline)
        arrivals.wait_for(keys_a + [k for k in keys_b if k not in held], timeout_s=120)
        # Everything b sent to other instances, and all of a's (inst-00 too), arrived: b's
        # held messages still have not.
        assert audit(held, arrivals.refresh()).accepted_unique == 0
        code, _, err = zapstream(
            ["instances", "resume", PAUSED, "--reason", "done", "--by", "test"],
            _operator_env(pipeline, **b),
        )
        assert code == 0, err
        arrivals.wait_for(held, timeout_s=90)
        wait_for_status(pipeline.dsn, keys_a, "ACCEPTED", 60)
        wait_for_status(dsn_b, keys_b, "ACCEPTED", 60)
        report = audit(keys_a + keys_b, arrivals.refresh())
        print(
            f"\ntwo prefixes on {pipeline.broker_description}: {report.accepted_unique} "
            f"messages, {report.duplicate_count} duplicates, "
            f"{len(report.order_violations)} order violations, {report.unexpected} unexpected"
        )
        assert report.accepted_unique == 2 * MESSAGES
        assert report.duplicate_count == 0 and not report.order_violations
        assert report.unexpected == 0

        # The worker's lag metrics name the real (prefixed) group and topics.
        expected_lag = {
            ("a-zapstream-worker", "a-zapstream.intents"),
            ("a-zapstream-worker", "a-zapstream.intents.bulk"),
        }
        seen: list[set[tuple[str, str]]] = [set()]

        def worker_lag_labelled() -> bool:
            text = httpx.get(f"http://127.0.0.1:{a_web}/metrics", timeout=5).text
            seen[0] = {
                (sample.labels["group"], sample.labels["topic"])
                for family in text_string_to_metric_families(text)
                if family.name == "kafka_consumergroup_group_lag"
                for sample in family.samples
            }
            return seen[0] == expected_lag

        wait_until(worker_lag_labelled, 30, f"worker a's lag labels {expected_lag} (have {seen})")

        topics, groups = asyncio.run(_broker_names(pipeline.kafka.bootstrap))
        print(f"topics: {sorted(topics)}\ngroups: {groups}")
        ours = {t for t in topics if not t.startswith("__")}  # Kafka's own __consumer_offsets
        for prefix in ("a-", "b-"):
            mine = {t for t in ours if t.startswith(prefix)}
            assert {prefix + t for t in LOGICAL_TOPICS} <= mine, prefix
            # Faust's own topics follow the app id, which carries the prefix.
            assert f"{prefix}zapstream-worker-__assignor-__leader" in mine, prefix
        assert {t for t in ours if not t.startswith(("a-", "b-"))} == set()
        assert {"a-zapstream-worker", "a-zapstream-state-sink"} <= set(groups)
        assert {"b-zapstream-worker", "b-zapstream-state-sink"} <= set(groups)
        for group, committed in groups.items():
            prefix = group[:2]
            assert prefix in ("a-", "b-"), group
            assert committed and all(t.startswith(prefix) for t in committed), (group, committed)
        for prefix in ("a-", "b-"):
            sink = {f"{prefix}zapstream.state", f"{prefix}zapstream.invalid"}
            assert groups[f"{prefix}zapstream-state-sink"] <= sink, prefix
            worker = groups[f"{prefix}zapstream-worker"]
            assert f"{prefix}zapstream.intents" in worker, prefix
            assert worker <= {f"{prefix}zapstream.intents", f"{prefix}zapstream.intents.bulk"}
