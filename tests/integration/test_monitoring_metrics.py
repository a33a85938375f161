"""Every metric the alert rules and the dashboard use is exported by a running pipeline.

A pipeline with the relay, a worker, the state sink and ``zapstream lag-monitor`` runs
the situations the alerts are about: a job that ends DEAD, one refused for a bad
recipient, an instance the gateway reports disconnected (the breaker pauses it), an
instance an operator paused (its message stays PENDING), and a record the state sink
cannot decode. Their ``/metrics`` pages are scraped until every name the files in
``k8s/monitoring/`` select is there; a rule on a metric nobody exports would never
fire, and this test names it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import orjson
import psycopg
import pytest
from aiokafka import AIOKafkaProducer

from connectors.outbox.controls import pause_instance
from connectors.outbox.enqueue import enqueue
from devtools.deploy import monitoring_check as mc
from devtools.stack.devstack import find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from tests.integration.support import wait_until

pytestmark = pytest.mark.integration

HELD, OFF, OK = "mon-held", "mon-off", "mon-ok"


@pytest.fixture(scope="module")
def pages() -> Iterator[tuple[LocalPipeline, dict[str, str]]]:
    """The pipeline and the base URLs of its relay, worker, sink, lag monitor and webhook."""
    relay_port, worker_port, sink_port = find_free_port(), find_free_port(), find_free_port()
    with LocalPipeline(partitions=4, with_sink=False) as p:
        p.start_relay(
            env={
                "ZAPSTREAM_RELAY_METRICS_PORT": str(relay_port),
                "ZAPSTREAM_RELAY_HEARTBEAT_INTERVAL_S": "1",
                "ZAPSTREAM_RELAY_SLOT_METRICS_INTERVAL_S": "1",
            }
        )
        p.start_sink(
            env={
                "ZAPSTREAM_SINK_METRICS_PORT": str(sink_port),
                "ZAPSTREAM_SINK_PIPELINE_METRICS_INTERVAL_S": "1",
            }
        )
        _, lag_url = p.start_lag_monitor("lag-monitor", env={"ZAPSTREAM_LAG_INTERVAL_S": "1"})
        p.start_worker(
            env={
                "ZAPSTREAM_WORKER_WEB_PORT": str(worker_port),
                "ZAPSTREAM_WORKER_INSTANCE_RATES": orjson.dumps(
                    {OK: {"rate_per_s": 50, "burst": 10}}
                ).decode(),
            }
        )
        webhook = p.start_webhook()
        yield (
            p,
            {
                "relay": f"http://127.0.0.1:{relay_port}",
                "worker": f"http://127.0.0.1:{worker_port}",
                "sink": f"http://127.0.0.1:{sink_port}",
                "lag monitor": lag_url.removesuffix("/metrics"),
                "webhook": webhook,  # no /metrics: health and readiness only
            },
        )


async def _poison_state_record(pipeline: LocalPipeline) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=pipeline.kafka.bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            pipeline.topics.state, key=b"not-a-job", value=b"\xff not json"
        )
    finally:
        await producer.stop()


def _exported(bases: dict[str, str]) -> set[str]:
    names: set[str] = set()
    for service in ("relay", "worker", "sink", "lag monitor"):
        response = httpx.get(f"{bases[service]}/metrics", timeout=10)
        response.raise_for_status()
        names |= mc.exported_names(response.text)
    return names


def test_every_metric_the_alerts_and_the_dashboard_use_is_exported(
    pages: tuple[LocalPipeline, dict[str, str]],
) -> None:
    pipeline, bases = pages
    run = uuid.uuid4().hex[:8]
    pipeline.sim_config(
        invalid_recipients=["5511900000201"],
        fail_recipients={"5511900000202": 5},
        disconnected_instances={OFF: 120},
    )
    with psycopg.connect(pipeline.dsn) as conn:
        pause_instance(conn, HELD, reason="monitoring test", actor="pytest")
        conn.commit()
        sends = [
            (OK, "5511900000200", {}),  # accepted
            (OK, "5511900000201", {}),  # invalid recipient: FAILED
            (OK, "5511900000202", {"max_attempts": 1}),  # one 503, no attempt left: DEAD
            (OFF, "5511900000203", {}),  # the instance is disconnected: paused
            (HELD, "5511900000204", {}),  # paused by an operator: stays PENDING
        ]
        for i, (instance, to, extra) in enumerate(sends):
            enqueue(
                conn,
                instance_id=instance,
                to=to,
                text=f"monitoring {i}",
                idempotency_key=f"{run}-{i}",
                **extra,  # type: ignore[arg-type]
            )
        conn.commit()
    asyncio.run(_poison_state_record(pipeline))

    wanted = mc.referenced_metrics()
    missing: dict[str, set[str]] = {}

    def all_exported() -> bool:
        exported = _exported(bases)
        missing.clear()
        missing.update({name: where for name, where in wanted.items() if name not in exported})
        return not missing

    try:
        wait_until(all_exported, 90, "every metric of the alerts and the dashboard")
    except AssertionError:
        raise AssertionError(
            "not exported by the running pipeline: "
            + "; ".join(f"{name} (used by {', '.join(sorted(w))})" for name, w in missing.items())
        ) from None
    print(f"\n{len(wanted)} metrics used by the alert rules and the dashboard, all exported")
    assert len(wanted) >= 20


def test_relay_worker_sink_and_webhook_answer_health_and_readiness(
    pages: tuple[LocalPipeline, dict[str, str]],
) -> None:
    _, bases = pages
    for service in ("relay", "worker", "sink", "webhook"):
        base = bases[service]
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        wait_until(
            lambda base=base: httpx.get(f"{base}/readyz", timeout=10).status_code == 200,  # type: ignore[misc]
            60,
            f"{base}/readyz to answer 200",
        )
        assert httpx.get(f"{base}/nothing-here", timeout=10).status_code == 404
