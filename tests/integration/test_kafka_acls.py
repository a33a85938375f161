"""Least privilege on a real Apache Kafka: SASL (SCRAM-SHA-512) users and the ACLs of the table.

The broker is :class:`devtools.stack.kafka_broker.KafkaBroker` with ``sasl``: its clients'
listener is SASL_PLAINTEXT, Kafka's ``StandardAuthorizer`` allows a user only what an ACL
allows it. :class:`devtools.stack.local_pipeline.LocalPipeline` with ``sasl=True`` creates one
user per component and the ACLs :func:`streams.kernel.kafka_access.access_table` gives them
(under the pipeline's topic prefix), and runs every service as its own component's user.

- Every component with only its own credentials: ``topics ensure`` (the admin), the relay
  (exactly-once: transactional id and position group), the worker (Faust, its own leader
  topic, the sink's group for the dedup horizon), the sink, the webhook and the lag
  monitor; a message goes from the outbox to the gateway, its receipts back through the
  webhook and the worker into PostgreSQL, and the lag monitor reads both groups.
- A component given another component's credentials is refused by the broker: it exits 2
  with one line naming ``ZAPSTREAM_KAFKA_SASL_USERNAME`` and what it needs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from connectors.outbox.enqueue import enqueue
from devtools.stack.devstack import find_free_port
from devtools.stack.kafka_broker import KafkaBroker
from devtools.stack.local_pipeline import LocalPipeline
from tests.integration.support import count_rows, wait_until, zapstream

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 2
PREFIX = "acl-"


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(
        partitions=PARTITIONS, broker="kafka", sasl=True, topic_prefix=PREFIX, with_sink=False
    ) as p:
        yield p


def env_as(pipeline: LocalPipeline, component: str, **extra: str) -> dict[str, str]:
    """The pipeline's environment with ``component``'s Kafka user, for ``zapstream ...``."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update(pipeline.env())
    env.update(pipeline.kafka_user_env(component))
    env.update({"PYTHONPATH": pythonpath, **extra})
    return env


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_every_component_runs_with_its_own_user_and_the_pipeline_delivers(
    pipeline: LocalPipeline,
) -> None:
    code, out, err = zapstream(["topics", "ensure"], env_as(pipeline, "admin"))
    assert (code, out.strip()) == (0, "topics created: none (all exist)"), err
    pipeline.start_sink()
    pipeline.start_relay(env={"ZAPSTREAM_RELAY_EXACTLY_ONCE": "true"})
    # A short dedup horizon: the worker soon reads the sink's group offsets.
    pipeline.start_worker(
        env={"ZAPSTREAM_WORKER_DEDUP_HORIZON_S": "2", "ZAPSTREAM_WORKER_DEDUP_MARGIN_S": "1"}
    )
    pipeline.start_webhook()
    _, lag_url = pipeline.start_lag_monitor(env={"ZAPSTREAM_LAG_INTERVAL_S": "0.5"})

    key = f"acl-{uuid.uuid4().hex}"
    with psycopg.connect(pipeline.dsn) as conn:
        enqueue(conn, instance_id="shop-acl", to="5511912345678", text=f"acl [{key}]",
                idempotency_key=key)  # fmt: skip
        conn.commit()
    # Relay -> intents -> worker -> gateway -> state -> sink -> PostgreSQL; the gateway's
    # callbacks -> webhook -> intents -> worker -> state -> sink.
    sql = "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = %s AND status = ANY(%s)"
    wait_until(
        lambda: count_rows(pipeline.dsn, sql, (key, ["DELIVERED", "READ"])) == 1,
        90,
        "the job delivered: sent by the worker, its receipt through the webhook",
    )

    def lag_of_both_groups() -> bool:
        text = httpx.get(lag_url, timeout=5).text
        return all(
            f'group="{pipeline.topics.group(g)}"' in text
            for g in ("zapstream-worker", "zapstream-state-sink")
        )

    wait_until(lag_of_both_groups, 30, "the lag monitor exporting the worker's and sink's lag")
    for proc in pipeline.processes:
        assert proc.is_running, f"{proc.name} exited:\n{proc.log_tail()}"
    # Nothing any component asked for was refused (and silently retried): the authorizer
    # logs every refusal (devtools/stack/kafka_broker.py).
    assert isinstance(pipeline.kafka, KafkaBroker)
    denied = [line for line in pipeline.kafka.log_path.read_text().splitlines() if "Denied" in line]
    assert denied == []


@pytest.mark.parametrize(
    ("deployable", "as_component", "needs"),
    [
        ("worker", "sink", f"the worker needs Read on topic {PREFIX}zapstream.intents"),
        ("webhook", "lag-monitor", f"the webhook needs Write on topic {PREFIX}zapstream.dead"),
        ("relay", "webhook", f"the relay needs Write on topic {PREFIX}zapstream.intents.bulk"),
    ],
)
def test_a_component_with_another_components_user_is_refused(
    pipeline: LocalPipeline, deployable: str, as_component: str, needs: str
) -> None:
    code, _, err = zapstream([deployable], env_as(pipeline, as_component), timeout_s=60)
    assert code == 2
    line = one_line(err)
    user = pipeline.kafka_access[as_component].user
    assert line.startswith(f"zapstream: Kafka user {user} cannot see topic "), line
    assert "ZAPSTREAM_KAFKA_SASL_USERNAME" in line
    assert line.endswith(needs), line


def test_the_lag_monitor_with_the_webhooks_user_is_refused_not_retried(
    pipeline: LocalPipeline,
) -> None:
    # The webhook may write two topics and describe no group: the lag monitor's first
    # reading is refused by the ACLs (GROUP_AUTHORIZATION_FAILED), a permanent failure.
    env = env_as(pipeline, "webhook", ZAPSTREAM_LAG_METRICS_PORT=str(find_free_port()))
    code, _, err = zapstream(["lag-monitor"], env, timeout_s=60)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("zapstream: lag monitor cannot start: Kafka's ACLs refuse"), line
    assert "Kafka's ACLs refuse" in line and "ZAPSTREAM_KAFKA_SASL_USERNAME" in line, line


def test_a_wrong_password_is_one_line_and_exit_2(pipeline: LocalPipeline) -> None:
    env = env_as(pipeline, "admin", ZAPSTREAM_KAFKA_SASL_PASSWORD="not-the-password")
    code, _, err = zapstream(["topics", "ensure"], env)
    assert code == 2
    line = one_line(err)
    assert line.startswith("zapstream: Kafka refused the SASL login"), line
    assert "ZAPSTREAM_KAFKA_SASL_USERNAME" in line
