"""A major PostgreSQL upgrade, 15 -> 18 with ``pg_upgrade --link``: the relay restreams by itself.

``pg_upgrade`` from 15 (or 16) does not carry logical replication slots; the outbox, the
publication and ``outbox_relay_slots`` travel with the data. So the relay started on the
upgraded server finds its slot missing, creates it and restreams every PENDING job
(connectors/cdc/slot_gap.py), with no operator command: the path docs/guides/deployment.md
("Major PostgreSQL upgrades") describes.

Kafka's intents topic is where delivery is checked (no worker, no sink, so the test stays
short): after the upgrade every job PENDING at the upgrade is on the topic exactly once,
in order within each conversation, and so are the jobs written after it. Runs on both
versions whatever ``DEVSTACK_POSTGRES`` says (Debian's 15, the wheel's 18).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from devtools.stack.delivery_audit import DeliveryReport, audit
from devtools.stack.devstack import ManagedProcess, PostgresCluster, find_free_port
from devtools.stack.local_pipeline import REPO_ROOT, LocalPipeline
from devtools.stack.pg_upgrade import UpgradedCluster
from devtools.stack.postgres_binaries import postgres_bin_dir_for, postgres_version
from streams.kernel.contract import IntentCaptured
from tests.integration.support import (
    count_rows,
    enqueue_conversations,
    intents_of,
    metric_value,
    wait_until,
    zapstream,
)
from tests.integration.topic_reader import TopicRecord

pytestmark = pytest.mark.integration

SLOT = "zapstream_outbox"
GAP_LINE = rf"slot gap on {SLOT} \(missing: [^)]*\): restreamed (\d+) PENDING jobs"
PENDING = "SELECT count(*) FROM outbox_jobs WHERE status = 'PENDING'"


@pytest.fixture
def pipeline() -> Iterator[LocalPipeline]:
    """Kafka, the simulator and a PostgreSQL 15 cluster kept on stop (for pg_upgrade)."""
    old = PostgresCluster(keep=True, bin_dir=postgres_bin_dir_for("15"))
    with LocalPipeline(partitions=4, with_sink=False, postgres=old) as p:
        kept = old.cluster_dir
        try:
            yield p
        finally:  # the upgraded cluster removes it; a test failing before that must too
            shutil.rmtree(kept, ignore_errors=True)


def _keys_on_topic(records: list[TopicRecord]) -> list[str]:
    """The intents' idempotency keys in (partition, offset) order: each conversation's order."""
    ordered = sorted(records, key=lambda r: (r.partition, r.offset))
    return [IntentCaptured.loads(r.value).idempotency_key for r in ordered]


def _topic_audit(keys: list[str], records: list[TopicRecord]) -> DeliveryReport:
    """The gateway audit (each key once, order per conversation) applied to topic records."""
    return audit(keys, [{"text": f"[{key}]"} for key in _keys_on_topic(records)])


def _gap_metrics(port: int) -> tuple[float, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.search(
        r'^zapstream_relay_slot_gaps_total\{reason="missing"\} ([0-9.e+]+)$', text, re.M
    )
    restreamed = metric_value(port, "zapstream_relay_slot_gap_restreamed_total")
    return (float(found.group(1)) if found else 0.0), restreamed


def _stop_relay(relay: ManagedProcess) -> None:
    assert relay.terminate(timeout_s=60) == 0, relay.log_tail()


def test_pg_upgrade_15_to_18_the_relay_restreams_every_pending_job_by_itself(
    pipeline: LocalPipeline,
) -> None:
    old, old_bin, new_bin = (
        pipeline.postgres,
        postgres_bin_dir_for("15"),
        postgres_bin_dir_for("18"),
    )
    env = {**os.environ, **pipeline.env(), "PYTHONPATH": str(REPO_ROOT)}
    code, out, _ = zapstream(["db", "migrate"], env)
    assert code == 0 and f"replication slot {SLOT}" in out, out

    # Before: a relay on 15 streams some jobs; none is written back (no worker, no sink),
    # so they stay PENDING, as jobs in Kafka not yet handled would.
    relay = pipeline.start_relay("relay-15")
    streamed = enqueue_conversations(
        old.dsn(), uuid.uuid4().hex[:8], messages=200, conversations=10
    )
    wait_until(
        lambda: len(intents_of(pipeline, set(streamed))) == len(streamed), 60, "200 intents on 15"
    )
    _stop_relay(relay)  # cleanly: the slot confirmed all it streamed
    # Written with no relay running: only a restream can bring these to Kafka.
    unstreamed = enqueue_conversations(
        old.dsn(), uuid.uuid4().hex[:8], messages=300, conversations=15
    )
    pending = count_rows(old.dsn(), PENDING)
    assert pending == 500
    before = {(r.partition, r.offset) for r in intents_of(pipeline, set(streamed))}

    started = time.monotonic()
    source_dir, port = old.cluster_dir, old.port
    old.stop()  # keep=True: the data directory stays for pg_upgrade
    new = UpgradedCluster(source_dir, old_bin, bin_dir=new_bin, port=port)
    pipeline.postgres = new  # same port: the pipeline's DSNs reach the upgraded server
    new.start()
    upgrade_s = time.monotonic() - started
    print(
        f"\n[pg-upgrade] {postgres_version(old_bin)} -> {postgres_version(new_bin)} "
        f"(pg_upgrade --{new.transfer}) in {upgrade_s:.1f} s; {pending} PENDING jobs"
    )
    dsn = new.dsn()
    assert count_rows(dsn, PENDING) == pending
    assert count_rows(dsn, "SELECT count(*) FROM pg_replication_slots") == 0  # not kept from 15
    assert count_rows(dsn, "SELECT count(*) FROM outbox_relay_slots WHERE slot_name = %s", (SLOT,))
    assert count_rows(dsn, "SELECT count(*) FROM pg_publication") == 1

    # After: a relay started as the deployment would, no operator command.
    metrics_port = find_free_port()
    relay = pipeline.start_relay(
        "relay-18", env={"ZAPSTREAM_RELAY_METRICS_PORT": str(metrics_port)}
    )
    try:
        line = relay.wait_for_log(GAP_LINE, timeout_s=60)
        print(f"[pg-upgrade] relay: {line.group(0)}")
        assert int(line.group(1)) == pending
        after = enqueue_conversations(dsn, uuid.uuid4().hex[:8], messages=30, conversations=3)
        keys = streamed + unstreamed + after

        def new_records() -> list[TopicRecord]:
            found = intents_of(pipeline, set(keys))
            return [r for r in found if (r.partition, r.offset) not in before]

        wait_until(
            lambda: len(new_records()) >= len(keys), 120, f"{len(keys)} intents after the upgrade"
        )
        records = new_records()
        report = _topic_audit(keys, records)
        print(
            f"[pg-upgrade] intents after the upgrade: expected={len(keys)} "
            f"on_topic={report.accepted_unique} duplicates={report.duplicate_count} "
            f"order_violations={len(report.order_violations)} lost={len(report.missing)}"
        )
        gaps, restreamed = _gap_metrics(metrics_port)
        print(
            f"[pg-upgrade] zapstream_relay_slot_gaps_total{{reason=missing}}={gaps} "
            f"zapstream_relay_slot_gap_restreamed_total={restreamed}"
        )
        assert report.ok, report.summary()
        assert len(records) == len(keys)
        assert (gaps, restreamed) == (1.0, float(pending))
        assert relay.is_running, relay.log_tail()
        _stop_relay(relay)
    finally:
        if relay.is_running:  # a failed check must not leave it holding the slot
            relay.terminate(timeout_s=60)
