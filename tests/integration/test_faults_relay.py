"""The relay edge under faults, on real processes (PostgreSQL, Kafka, simulator, relay, worker).

- a 2 MB malformed row is reduced onto ``zapstream.invalid`` and the rows after it flow;
  the relay's ``/metrics`` count it, the rows and their commit->ack latency;
- rows written after ``db migrate`` but before the relay's first start are delivered;
- rows written while the slot was dropped are restreamed by the relay itself, and so are
  those of a slot dropped under a running relay mid-stream (once each, in order);
- PostgreSQL and Kafka each cut for 10 s through a TCP proxy mid-stream: nothing lost,
  nothing sent twice, order kept, no process exits;
- a relay with a missing database or a wrong password exits 2 with one line.

Each fault test prints: sent, accepted, duplicates, order violations, lost.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import orjson
import psycopg
import pytest

from connectors.outbox.migrate import migrate
from devtools.stack.delivery_audit import DeliveryReport
from devtools.stack.devstack import ManagedProcess, PostgresCluster, find_free_port
from devtools.stack.local_pipeline import REPO_ROOT, LocalPipeline
from tests.integration.support import (
    Arrivals,
    PacedWriter,
    count_rows,
    enqueue_conversations,
    metric_value,
    wait_for_status,
    wait_until,
)
from tests.integration.topic_reader import read_topic

pytestmark = pytest.mark.integration

SLOT = "zapstream_outbox"
CUT_S = 10.0


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4, proxied=True) as p:
        p.start_worker()
        yield p


def _print_figures(what: str, sent: int, report: DeliveryReport) -> None:
    print(
        f"\n[{what}] sent={sent} accepted={report.accepted_unique} "
        f"duplicates={report.duplicate_count} order_violations={len(report.order_violations)} "
        f"lost={len(report.missing)}"
    )


def _zapstream(pipeline: LocalPipeline, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **pipeline.env(),
        "ZAPSTREAM_DATABASE_URL": pipeline.dsn,
        "PYTHONPATH": str(REPO_ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _slot_exists(dsn: str) -> bool:
    return bool(
        count_rows(dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
    )


def _drop_slot(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (SLOT,),
        )


def _assert_all_running(pipeline: LocalPipeline, relay: ManagedProcess) -> None:
    """The simulator, sink, worker and this test's relay are all still up."""
    services = [p for p in pipeline.processes if p.name in ("gateway-sim", "sink", "worker")]
    assert len(services) == 3, [p.name for p in pipeline.processes]
    dead = [f"{p.name} (exit {p.returncode})" for p in [*services, relay] if not p.is_running]
    assert not dead, f"processes exited: {dead}"


def _stop_relay(relay: ManagedProcess) -> None:
    assert relay.terminate(timeout_s=60) == 0, relay.log_tail()


# --- 1. rows written after `db migrate`, before the relay's first start ------------------


def test_rows_written_after_migrate_before_the_first_relay_are_delivered(
    pipeline: LocalPipeline,
) -> None:
    # As a deployment would: the schema is there, no relay has ever run, no slot exists.
    _drop_slot(pipeline.dsn)
    assert not _slot_exists(pipeline.dsn)
    migrated = _zapstream(pipeline, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert f"replication slot {SLOT}" in migrated.stdout
    assert _slot_exists(pipeline.dsn)

    keys = enqueue_conversations(
        pipeline.dsn, uuid.uuid4().hex[:8], messages=2_000, conversations=40
    )
    relay = pipeline.start_relay("relay-late")
    report = Arrivals(pipeline).wait_for(keys, timeout_s=240)
    _print_figures("migrate-then-write", len(keys), report)
    assert report.ok, report.summary()
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
    _stop_relay(relay)


# --- 2. a dropped slot: the relay restreams the gap by itself ---------------------------------


GAP_LINE = r"slot gap on zapstream_outbox \(missing: [^)]*\): restreamed (\d+) PENDING jobs"


def _gap_metrics(port: int) -> tuple[float, float]:
    """(gaps found for a missing slot, jobs restreamed) from the relay's ``/metrics``."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.search(
        r'^zapstream_relay_slot_gaps_total\{reason="missing"\} ([0-9.e+]+)$', text, re.M
    )
    restreamed = metric_value(port, "zapstream_relay_slot_gap_restreamed_total")
    return (float(found.group(1)) if found else 0.0), restreamed


def test_rows_written_while_the_slot_was_dropped_are_restreamed_by_the_relay_itself(
    pipeline: LocalPipeline,
) -> None:
    _drop_slot(pipeline.dsn)  # an operator drops the slot while no relay runs
    gap = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=300, conversations=15)
    metrics_port = find_free_port()
    relay = pipeline.start_relay(  # recreates the slot at the current WAL, then restreams
        "relay-gap", env={"ZAPSTREAM_RELAY_METRICS_PORT": str(metrics_port)}
    )
    line = relay.wait_for_log(GAP_LINE, timeout_s=30)
    print(f"[slot-gap-stopped] relay: {line.group(0)}")
    assert line.group(1) == "300"
    after = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=30, conversations=3)
    report = Arrivals(pipeline).wait_for(gap + after, timeout_s=180)
    _print_figures("slot-gap-stopped", len(gap + after), report)
    assert report.ok, report.summary()
    assert _gap_metrics(metrics_port) == (1.0, 300.0)
    wait_for_status(pipeline.dsn, gap + after, "ACCEPTED", 120)
    # Nothing left for an operator: the command finds no PENDING job.
    again = _zapstream(pipeline, "outbox", "restream", "--older-than", "0s", "--dry-run")
    assert again.stdout.startswith("0 PENDING"), again.stdout
    done = _zapstream(pipeline, "outbox", "restream", "--older-than", "0s", "--by", "test")
    assert done.returncode == 0 and done.stdout.startswith("restreamed 0 "), done
    _stop_relay(relay)


def _drop_slot_under_the_relay(dsn: str, timeout_s: float = 30) -> int:
    """As an operator would: terminate the walsender, drop the slot (again until it goes:
    the relay reconnects within a second); the attempts it took."""
    deadline = time.monotonic() + timeout_s
    attempts = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            attempts += 1
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (SLOT,),
            )
            try:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
                return attempts
            except psycopg.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)  # the walsender is still exiting


def test_a_slot_dropped_under_a_running_relay_is_recovered_by_the_relay_exactly_once(
    pipeline: LocalPipeline,
) -> None:
    metrics_port = find_free_port()
    relay = pipeline.start_relay(
        "relay-slot-drop",
        env={
            "ZAPSTREAM_RELAY_METRICS_PORT": str(metrics_port),
            "ZAPSTREAM_RELAY_SLOT_CHECKPOINT_INTERVAL_S": "1",
        },
    )
    since = relay.log_offset()
    # A steady stream (~400 rows/s): the drop lands mid-stream.
    writer = PacedWriter(
        pipeline.dsn,
        uuid.uuid4().hex[:8],
        messages=4_000,
        conversations=40,
        per_transaction=20,
        pause_s=0.05,
    )
    keys = writer.keys
    writer.start()
    try:
        wait_until(writer.reached(1_000), 60, "1,000 rows committed")
        attempts = _drop_slot_under_the_relay(pipeline.dsn)
        print(f"[slot-drop] slot dropped at {writer.committed} committed ({attempts} attempts)")
        line = relay.wait_for_log(GAP_LINE, timeout_s=60, since=since)
        print(f"[slot-drop] relay: {line.group(0)}")
        writer.join(timeout=300)
        assert len(keys) == 4_000
        report = Arrivals(pipeline).wait_for(keys, timeout_s=240)
        _print_figures("slot-drop", len(keys), report)
        gaps, restreamed = _gap_metrics(metrics_port)
        print(
            f"[slot-drop] zapstream_relay_slot_gaps_total{{reason=missing}}={gaps} "
            f"zapstream_relay_slot_gap_restreamed_total={restreamed}"
        )
        assert not report.missing, f"{report.summary()}; e.g. {sorted(report.missing)[:5]}"
        assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
        assert report.order_violations == (), report.order_violations[:5]
        assert report.accepted_unique == 4_000
        assert gaps == 1.0 and restreamed == float(line.group(1)) > 0
        _assert_all_running(pipeline, relay)
        wait_for_status(pipeline.dsn, keys, "ACCEPTED", 180)
        _stop_relay(relay)
    finally:
        writer.join(timeout=300)
        if relay.is_running:  # a failed check must not leave it holding the slot
            relay.terminate(timeout_s=60)


# --- 3. a poison row -------------------------------------------------------------------------


def test_a_2mb_malformed_row_is_reduced_and_the_50_rows_after_it_are_delivered(
    pipeline: LocalPipeline,
) -> None:
    metrics_port = find_free_port()
    relay = pipeline.start_relay(
        "relay-poison", env={"ZAPSTREAM_RELAY_METRICS_PORT": str(metrics_port)}
    )
    run = uuid.uuid4().hex[:8]
    bad_key = f"poison-{run}"
    # Valid JSON, but a payload far over ZAPSTREAM_RELAY_MAX_RECORD_BYTES: the relay rejects it
    # on its size, unparsed, with the row (size before parse, issue 15).
    payload = {"type": "text", "to": "+5511987650000", "text": "x" * (2 * 1024 * 1024)}
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) "
            "VALUES (%s, %s::jsonb, %s) RETURNING id",
            ("inst-00", orjson.dumps(payload).decode(), bad_key),
        ).fetchone()
    assert row is not None
    bad_id = int(row[0])
    keys = enqueue_conversations(pipeline.dsn, run, messages=50, conversations=5)
    report = Arrivals(pipeline).wait_for(keys, timeout_s=120)
    _print_figures("poison-row", len(keys), report)
    assert report.ok, report.summary()
    assert relay.is_running, relay.log_tail()

    def rejected() -> list[dict[str, object]]:
        records = read_topic(pipeline.kafka.bootstrap, pipeline.topics.invalid)
        found = [orjson.loads(r.value) for r in records]
        return [r for r in found if r.get("job_id") == bad_id]

    wait_until(lambda: bool(rejected()), 60, "the poison row on zapstream.invalid")
    (record,) = rejected()
    print(f"[poison-row] invalid record: {len(orjson.dumps(record))} bytes")
    assert len(orjson.dumps(record)) < 512 * 1024
    assert "ZAPSTREAM_RELAY_MAX_RECORD_BYTES" in str(record["reason"]), record["reason"]
    assert record["lsn"] not in (None, "0/0")
    row_copy = record["row"]
    assert isinstance(row_copy, dict)
    assert "truncated" in str(row_copy.get("payload"))
    assert row_copy.get("idempotency_key") == bad_key
    # The state sink marks it INVALID with the reason (the sink's part of issue 7).
    wait_until(
        lambda: (
            count_rows(
                pipeline.dsn,
                "SELECT count(*) FROM outbox_jobs WHERE id = %s AND status = 'INVALID'",
                (bad_id,),
            )
            == 1
        ),
        60,
        f"job {bad_id} INVALID in outbox_jobs",
    )
    # The relay's own metrics: the rejection by its reason, every row, one latency per
    # transaction (this fresh relay saw two: the poison row's and the 50 rows') and the
    # confirmed LSN.
    too_large = 'zapstream_relay_invalid_rows_total{reason="too_large"}'
    assert metric_value(metrics_port, too_large) == 1
    assert metric_value(metrics_port, "zapstream_relay_rows_total") == 51
    assert metric_value(metrics_port, "zapstream_relay_commit_to_ack_seconds_count") == 2
    wait_until(
        lambda: metric_value(metrics_port, "zapstream_relay_confirmed_lsn") > 0,
        30,
        "the confirmed LSN on /metrics",
    )
    _stop_relay(relay)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2)


# --- 4. PostgreSQL and Kafka cut mid-stream ---------------------------------------------------


def test_postgres_and_kafka_cut_for_10s_mid_stream_lose_and_duplicate_nothing(
    pipeline: LocalPipeline,
) -> None:
    assert pipeline.pg_proxy is not None and pipeline.kafka_proxy is not None
    relay = pipeline.start_relay("relay-cuts")
    # A steady stream (~200 rows/s), so both cuts land mid-stream.
    writer = PacedWriter(
        pipeline.dsn,
        uuid.uuid4().hex[:8],
        messages=6_000,
        conversations=60,
        per_transaction=20,
        pause_s=0.1,
    )
    keys = writer.keys
    writer.start()
    wait_until(writer.reached(800), 60, "800 rows committed")

    pipeline.pg_proxy.cut()
    print(f"[cuts] PostgreSQL cut at {writer.committed} committed")
    time.sleep(CUT_S)  # the fault's duration, not a wait for an outcome
    pipeline.pg_proxy.restore()
    relay.wait_for_log(r"PostgreSQL(?: \([a-z ]+\))? available again", timeout_s=60)

    wait_until(writer.reached(writer.committed + 200), 120, "200 more rows committed")
    pipeline.kafka_proxy.cut()
    print(f"[cuts] Kafka cut at {writer.committed} committed")
    time.sleep(CUT_S)
    pipeline.kafka_proxy.restore()

    try:
        writer.join(timeout=300)
        assert len(keys) == 6_000
        # Under the test's own 300 s limit, so a stall ends with the figures, not a timeout.
        report = Arrivals(pipeline).wait_for(keys, timeout_s=180)
        _print_figures("pg+kafka cuts", len(keys), report)
        assert not report.missing, f"{report.summary()}; e.g. {sorted(report.missing)[:5]}"
        _assert_all_running(pipeline, relay)
        assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
        assert report.order_violations == (), report.order_violations[:5]
        assert report.accepted_unique == 6_000
        wait_for_status(pipeline.dsn, keys, "ACCEPTED", 180)
        _assert_all_running(pipeline, relay)
        log = relay.log_path.read_text(errors="replace")
        for line in log.splitlines():
            if "unavailable" in line or "available again" in line:
                print(f"[cuts] relay: {line}")
        # One WARNING per outage, not one per attempt.
        assert log.count("PostgreSQL unavailable") <= 2, log[-3000:]
        _stop_relay(relay)
    finally:
        if relay.is_running:  # a failed check must not leave it holding the slot
            relay.terminate(timeout_s=60)


def test_a_relay_started_while_kafka_is_away_waits_for_it(pipeline: LocalPipeline) -> None:
    assert pipeline.kafka_proxy is not None
    pipeline.kafka_proxy.cut()
    try:
        relay = pipeline.start_relay("relay-nokafka", wait=False)
        # The start-up topic check (connectors.ops.topics) or the relay's producer start.
        relay.wait_for_log(r"Kafka (unavailable|unreachable).*retrying", timeout_s=60)
        assert relay.is_running, relay.log_tail()
    finally:
        pipeline.kafka_proxy.restore()
    relay.wait_for_log(r"relay streaming", timeout_s=60)
    assert len(re.findall(r"Kafka (unavailable|unreachable)", relay.log_tail(400))) == 1
    keys = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=100, conversations=5)
    report = Arrivals(pipeline).wait_for(keys, timeout_s=120)
    _print_figures("relay-start-without-kafka", len(keys), report)
    assert report.ok, report.summary()
    _assert_all_running(pipeline, relay)
    _stop_relay(relay)


# --- 5. permanent failures -------------------------------------------------------------------


def _relay_exits_2_with_one_line(pipeline: LocalPipeline, name: str, dsn: str) -> str:
    relay = pipeline.start_relay(name, wait=False, env={"ZAPSTREAM_DATABASE_URL": dsn})
    assert relay.wait(timeout_s=60) == 2, relay.log_tail()
    output = relay.log_tail(200)
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "relay cannot start" in line]
    assert len(lines) == 1, output
    if "wal_level" not in lines[0]:  # that one names postgresql.conf instead
        assert "ZAPSTREAM_DATABASE_URL" in lines[0], lines[0]
    assert "secret-pw" not in output
    print(f"\n[{name}] {lines[0]}")
    return lines[0]


def test_a_relay_pointed_at_a_missing_database_exits_2_with_one_line(
    pipeline: LocalPipeline,
) -> None:
    line = _relay_exits_2_with_one_line(
        pipeline, "relay-nodb", f"postgresql://postgres@127.0.0.1:{pipeline.postgres.port}/nope"
    )
    assert "does not exist" in line


def test_a_relay_with_a_wrong_password_exits_2_with_one_line(pipeline: LocalPipeline) -> None:
    # The throwaway cluster trusts everyone: require a password for one role.
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE zs_app LOGIN REPLICATION PASSWORD 'right-pw'")
    hba = pipeline.postgres.data_dir / "pg_hba.conf"
    hba.write_text(
        "host all zs_app 127.0.0.1/32 scram-sha-256\n"
        "host replication zs_app 127.0.0.1/32 scram-sha-256\n" + hba.read_text()
    )
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")
    line = _relay_exits_2_with_one_line(
        pipeline,
        "relay-badpw",
        f"postgresql://zs_app:secret-pw@127.0.0.1:{pipeline.postgres.port}/postgres",
    )
    assert "authentication" in line


def test_a_relay_on_a_database_without_logical_wal_exits_2_with_one_line(
    pipeline: LocalPipeline,
) -> None:
    with PostgresCluster(wal_level="replica") as replica:
        migrate(replica.dsn())
        line = _relay_exits_2_with_one_line(pipeline, "relay-replica", replica.dsn())
    assert "set wal_level=logical in postgresql.conf and restart PostgreSQL" in line
    assert "'replica'" in line


# --- 6. the relay crash test's replay, made visible ---------------------------------------------


def test_intents_topic_is_readable(pipeline: LocalPipeline) -> None:
    """The helper the crash test relies on to count Kafka-level duplicates."""
    records = read_topic(pipeline.kafka.bootstrap, pipeline.topics.intents)
    assert records, "zapstream.intents is empty after the tests above"
