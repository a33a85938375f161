"""Gateway-edge faults on real processes: a wrong API key for one instance, 502 after accept.

Both tests run the whole pipeline (PostgreSQL, Kafka, relay, worker, state sink,
gateway simulator) and audit what the simulator really received: sent, accepted,
duplicates, order violations, lost.
"""

from __future__ import annotations

import collections
import re
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from devtools.stack.delivery_audit import audit
from devtools.stack.local_pipeline import SIM_API_KEY, LocalPipeline
from tests.integration.support import (
    Arrivals,
    enqueue_conversations,
    wait_for_status,
    wait_until,
)

pytestmark = pytest.mark.integration

PROBE_S = 2.0
ENV = {
    "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true",
    "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[0.5, 1, 2]",
    "ZAPSTREAM_WORKER_RETRY_SCAN_INTERVAL_S": "0.2",
    "ZAPSTREAM_WORKER_INSTANCE_PROBE_S": str(PROBE_S),
}


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4, worker_env=ENV) as p:
        p.start_relay()
        yield p


def statuses(dsn: str, keys: list[str]) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, status FROM outbox_jobs WHERE idempotency_key = ANY(%s)",
            (keys,),
        ).fetchall()
    return {str(k): str(s) for k, s in rows}


def sim_stats(pipeline: LocalPipeline) -> dict[str, int]:
    import httpx

    body = httpx.get(f"{pipeline.sim_url}/_sim/stats", timeout=5).json()
    return {str(k): int(v) for k, v in body["by_outcome"].items()}


def test_wrong_key_for_one_instance_pauses_it_and_loses_nothing(pipeline: LocalPipeline) -> None:
    bad = "inst-01"
    pipeline.sim_config(reject_keys_for_instances=[bad])
    worker = pipeline.start_worker("worker-badkey")
    log_start = worker.log_offset()
    arrivals = Arrivals(pipeline)
    arrivals.refresh()
    keys = enqueue_conversations(
        pipeline.dsn, uuid.uuid4().hex[:8], messages=600, conversations=20, instances=5
    )
    paused_keys = [k for k in keys if f":{bad}:" in k]
    other_keys = [k for k in keys if f":{bad}:" not in k]
    assert paused_keys and other_keys

    # Other instances flow undisturbed while inst-01 is refused.
    arrivals.wait_for(other_keys, timeout_s=240)
    wait_for_status(pipeline.dsn, other_keys, "ACCEPTED", 120)
    # Let the paused instance be probed a few times (each probe is one 401).
    refused_before = sim_stats(pipeline).get("unauthorized", 0)
    wait_until(
        lambda: sim_stats(pipeline).get("unauthorized", 0) >= refused_before + 3,
        60,
        "three probes of the paused instance",
    )
    refused = sim_stats(pipeline).get("unauthorized", 0)
    during = statuses(pipeline.dsn, paused_keys)
    held = collections.Counter(during.values())
    assert not any(s in {"FAILED", "DEAD", "UNCERTAIN"} for s in during.values()), during
    assert not any(f":{bad}:" in str(m.get("text", "")) for m in arrivals.refresh())

    pipeline.sim_config(reject_keys_for_instances=[])  # the operator fixed the key
    report = arrivals.wait_for(keys, timeout_s=240)
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 180)

    log = worker.log_path.read_bytes()[log_start:].decode("utf-8", "replace")
    paused_lines = re.findall(rf"instance {bad} paused: .*", log)
    resumed_lines = re.findall(rf"instance {bad} resumed after .*", log)
    print(
        f"\nwrong key: sent {len(keys)}, accepted {report.accepted_unique}, "
        f"duplicates {report.duplicate_count}, order violations {len(report.order_violations)}, "
        f"lost {len(report.missing)}; {len(paused_keys)} jobs held, {refused} requests refused "
        f"(401), held as {dict(held)}; paused lines {len(paused_lines)}: {paused_lines[:1]}; "
        f"resumed: {resumed_lines}"
    )
    assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
    assert report.order_violations == ()
    assert len(paused_lines) == 1, paused_lines
    assert "refused credentials (401)" in paused_lines[0]
    assert len(resumed_lines) == 1
    assert SIM_API_KEY not in log, "the API key must never be logged"
    worker.terminate(timeout_s=60)


def test_502_after_accept_is_reconciled_never_duplicated(pipeline: LocalPipeline) -> None:
    pipeline.sim_config(accept_then_502_rate=0.1, seed=21)
    worker = pipeline.start_worker("worker-502")
    arrivals = Arrivals(pipeline)
    earlier = len(arrivals.refresh())
    before = sim_stats(pipeline).get("accepted_then_502", 0)
    keys = enqueue_conversations(
        pipeline.dsn, uuid.uuid4().hex[:8], messages=1_000, conversations=40
    )
    report = arrivals.wait_for(keys, timeout_s=300)
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 180)
    report = audit(keys, arrivals.refresh()[earlier:])
    answered_502 = sim_stats(pipeline).get("accepted_then_502", 0) - before
    print(
        f"\n502 after accept: sent {len(keys)}, accepted {report.accepted_unique}, "
        f"arrivals {report.arrivals}, 502s {answered_502}, duplicates {report.duplicate_count}, "
        f"order violations {len(report.order_violations)}, lost {len(report.missing)}"
    )
    assert answered_502 > 30, "10% of 1000 sends should have been answered 502"
    assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
    assert report.missing == ()
    assert report.order_violations == ()
    pipeline.sim_config(accept_then_502_rate=0.0)
    worker.terminate(timeout_s=60)


# --- the simulator's faults of this edge (in-process, no pipeline) ------------------------


async def test_sim_refuses_one_instances_key_until_fixed_and_502s_after_accepting() -> None:
    from pydantic import SecretStr

    from connectors.gateways.stackzap import StackZapClient
    from devtools.simulator.gateway_sim import GatewaySimulator
    from streams.kernel.errors import (
        InstanceUnavailableError,
        PermanentGatewayError,
        UncertainGatewayError,
    )
    from streams.kernel.ports import TextMessage
    from streams.kernel.settings import GatewaySettings

    def text(n: int, instance: str) -> TextMessage:
        return TextMessage(instance, f"55119{n:08d}", f"message {n}", f"{n}-1")

    async with GatewaySimulator(api_key="k" * 20, seed=3) as sim:
        settings = GatewaySettings(stackzap_api_url=sim.url, stackzap_api_key=SecretStr("k" * 20))
        async with StackZapClient(settings) as client:
            sim.configure(reject_keys_for_instances=["bad"])
            with pytest.raises(InstanceUnavailableError) as info:
                await client.send_text(text(1, "bad"))
            assert info.value.status_code == 401
            with pytest.raises(InstanceUnavailableError):
                await client.list_for_reconciliation("bad")
            await client.send_text(text(2, "good"))
            sim.configure(reject_keys_for_instances=[])  # fixed at run time
            await client.send_text(text(3, "bad"))
            assert [m.instance for m in sim.messages] == ["good", "bad"]

            sim.configure(accept_then_502_rate=1.0)
            with pytest.raises(UncertainGatewayError) as uncertain:
                await client.send_text(text(4, "good"))
            assert uncertain.value.status_code == 502
            assert sim.messages[-1].reference == "4-1", "recorded before the 502"
            listed = await client.list_for_reconciliation("good")
            assert listed is not None and "4-1" in {j.reference for j in listed}
            sim.configure(accept_then_502_rate=0.0, invalid_recipients=["5511900000005"])
            with pytest.raises(PermanentGatewayError) as permanent:
                await client.send_text(text(5, "good"))
            assert permanent.value.status_code == 400
        assert sim.stats()["by_outcome"]["accepted_then_502"] == 1
