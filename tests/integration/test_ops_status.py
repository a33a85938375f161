"""`zapstream status` on a real PostgreSQL, a real logical-replication client and a real HTTP
lag endpoint: every section, the exit codes 0, 1 and 2, and the command-line wiring.
"""

from __future__ import annotations

import http.server
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from connectors import cli
from connectors.ops.status import EXIT_ATTENTION, EXIT_HEALTHY, EXIT_UNREACHABLE, run_status
from connectors.ops.status_settings import StatusSettings
from connectors.outbox.controls import pause_instance
from connectors.outbox.enqueue import enqueue
from devtools.stack.devstack import find_free_port, postgres_bin_dir
from streams.kernel.settings import PostgresSettings
from tests.integration.support import wait_until

pytestmark = pytest.mark.integration

RECIPIENT = "+55 11 98765-4321"
TEXT = "your code is 771133"

LAG_TEXT = (
    "# TYPE kafka_consumergroup_group_lag gauge\n"
    'kafka_consumergroup_group_lag{group="zapstream-worker",topic="zapstream.intents",'
    'partition="0"} 40\n'
    'kafka_consumergroup_group_lag{group="zapstream-worker",topic="zapstream.intents",'
    'partition="1"} 2\n'
    "# TYPE kafka_consumergroup_group_lag_seconds gauge\n"
    'kafka_consumergroup_group_lag_seconds{group="zapstream-worker",topic="zapstream.intents",'
    'partition="0"} 95\n'
)


@pytest.fixture(autouse=True)
def clean(outbox_db: str) -> None:
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE outbox_job_events, outbox_commands, outbox_replays, outbox_controls, "
            "outbox_jobs CASCADE"
        )


@pytest.fixture(scope="module")
def lag_url() -> Iterator[str]:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = LAG_TEXT.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _sql(dsn: str, statement: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params or None)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def _job(dsn: str, key: str, instance: str, *, status: str | None = None) -> int:
    with psycopg.connect(dsn) as conn:
        job_id = enqueue(conn, instance_id=instance, to=RECIPIENT, text=TEXT, idempotency_key=key)
        if status is not None:
            # As the state sink writes it: one version up (migration 0009 refuses others).
            conn.execute(
                "UPDATE outbox_jobs SET status = %s, state_version = state_version + 1 "
                "WHERE id = %s",
                (status, job_id),
            )
    return job_id


def _slot(dsn: str, name: str) -> None:
    _sql(
        dsn,
        "SELECT pg_create_logical_replication_slot(%s, 'test_decoding') "
        "WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)",
        name,
        name,
    )


def _run(dsn: str, slot: str, *, lag: str = "", as_json: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    settings = StatusSettings(postgres=PostgresSettings(url=dsn), lag_url=lag, lag_timeout_s=2)
    code = run_status(settings, slot_name=slot, as_json=as_json, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_every_section_and_what_needs_attention(outbox_db: str, lag_url: str) -> None:
    _slot(outbox_db, "status_idle")
    old = _job(outbox_db, "st-old", "st-shop-1")
    _job(outbox_db, "st-new", "st-shop-2")
    _job(outbox_db, "st-dead", "st-shop-2", status="DEAD")
    _sql(
        outbox_db,
        "UPDATE outbox_jobs SET created_at = now() - interval '20 minutes' WHERE id = %s",
        old,
    )
    with psycopg.connect(outbox_db) as conn:
        pause_instance(conn, "st-shop-1", reason="number flagged", actor="alice")
    # The cluster commits asynchronously: wait for the WAL writer to write those rows.
    wait_until(
        lambda: (
            _sql(
                outbox_db,
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) > 0 "
                "FROM pg_replication_slots WHERE slot_name = 'status_idle'",
            )[0][0]
            is True
        ),
        10,
        "the slot to lag behind the rows written",
    )

    code, text, err = _run(outbox_db, "status_idle", lag=lag_url)
    assert code == EXIT_ATTENTION, text
    assert err == ""
    assert "status_idle: INACTIVE (no relay streaming), lag " in text
    assert "PENDING 2  SCHEDULED 0  ATTEMPTING 0" in text
    assert "DEAD 1" in text and "REVIEW 0" in text
    lines = text.splitlines()
    shop1 = next(line for line in lines if line.strip().startswith("st-shop-1 "))
    assert shop1.split()[1] == "1" and shop1.split()[2] in ("20m00s", "20m01s", "20m02s")
    assert lines.index(shop1) < next(i for i, x in enumerate(lines) if "st-shop-2 " in x)
    assert "instance  st-shop-1  alice  number flagged" in text
    assert "zapstream-worker  zapstream.intents  2           42              1m35s" in text
    assert "is inactive with" in text
    assert "PENDING jobs older than 10m00s (oldest 20m" in text and "st-shop-1" in text
    assert "1 DEAD job(s)" in text
    assert text.rstrip().endswith("result: NEEDS ATTENTION")
    assert "98765" not in text and TEXT not in text and "st-old" not in text

    code, raw, _ = _run(outbox_db, "status_idle", lag=lag_url, as_json=True)
    payload = json.loads(raw)
    assert code == EXIT_ATTENTION and payload["ok"] is False
    assert payload["slot"]["exists"] and not payload["slot"]["active"]
    assert payload["slot"]["lag_bytes"] > 0 and payload["slot"]["retained_bytes"] > 0
    assert payload["jobs"]["PENDING"] == 2 and payload["jobs"]["DEAD"] == 1
    assert [p["instance"] for p in payload["oldest_pending"]] == ["st-shop-1", "st-shop-2"]
    assert payload["paused"][0]["target"] == "st-shop-1"
    assert len(payload["consumer_lag"]["partitions"]) == 2
    assert len(payload["attention"]) == 3


def test_healthy_with_a_streaming_slot_is_exit_0(outbox_db: str, tmp_path: Path) -> None:
    _slot(outbox_db, "status_live")
    _job(outbox_db, "st-fresh", "st-shop-3")
    _job(outbox_db, "st-done", "st-shop-3", status="ACCEPTED")
    log = (tmp_path / "pg_recvlogical.log").open("wb")
    client = subprocess.Popen(
        [
            str(postgres_bin_dir() / "pg_recvlogical"),
            "-d",
            outbox_db,
            "--slot",
            "status_live",
            "--start",
            "-f",
            "/dev/null",
            "-s",
            "1",
            "-F",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(
            lambda: (
                _sql(
                    outbox_db,
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'status_live'",
                )[0][0]
                is not None
            ),
            15,
            "pg_recvlogical to stream from the slot",
        )
        ((pid,),) = _sql(
            outbox_db, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'status_live'"
        )
        code, text, err = _run(outbox_db, "status_live")
    finally:
        client.terminate()
        client.wait(10)
        log.close()
    assert code == EXIT_HEALTHY, text
    assert f"status_live: active (pid {pid})" in text
    assert "st-shop-3  1        " in text
    assert "not configured (set ZAPSTREAM_STATUS_LAG_URL" in text
    assert "paused:\n  none" in text
    assert text.rstrip().endswith("result: OK")


def test_a_missing_slot_and_an_unreadable_lag_monitor_need_attention(outbox_db: str) -> None:
    dead_port = find_free_port()
    code, text, _ = _run(outbox_db, "status_nowhere", lag=f"http://127.0.0.1:{dead_port}/metrics")
    assert code == EXIT_ATTENTION
    assert "status_nowhere: does not exist" in text
    assert f"UNKNOWN: cannot read http://127.0.0.1:{dead_port}/metrics" in text


def test_an_unreachable_database_is_one_line_and_exit_2() -> None:
    dsn = f"postgresql://postgres:hunter2@127.0.0.1:{find_free_port()}/postgres"
    code, text, err = _run(dsn, "zapstream_outbox")
    assert code == EXIT_UNREACHABLE and text == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("zapstream status: PostgreSQL unreachable (ZAPSTREAM_DATABASE_URL):")
    assert "hunter2" not in err
    code, raw, _ = _run(dsn, "zapstream_outbox", as_json=True)
    assert code == EXIT_UNREACHABLE and json.loads(raw)["postgres_reachable"] is False


def test_the_command_line_reads_its_settings(
    outbox_db: str,
    lag_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _slot(outbox_db, "status_cli")
    _job(outbox_db, "st-cli", "st-shop-cli", status="REVIEW")
    monkeypatch.setenv("ZAPSTREAM_DATABASE_URL", outbox_db)
    monkeypatch.setenv("ZAPSTREAM_RELAY_SLOT", "status_cli")
    monkeypatch.setenv("ZAPSTREAM_STATUS_LAG_URL", lag_url)
    monkeypatch.setenv("ZAPSTREAM_STATUS_MAX_PENDING_AGE_S", "3600")
    assert cli.main(["status", "--json"]) == EXIT_ATTENTION
    payload = json.loads(capsys.readouterr().out)
    assert payload["slot"]["name"] == "status_cli"
    assert payload["consumer_lag"]["configured"] is True
    assert payload["jobs"]["REVIEW"] == 1
    assert "1 REVIEW job(s): zapstream jobs list --state REVIEW" in payload["attention"]
    assert not any("PENDING" in reason for reason in payload["attention"])


def test_the_real_pipeline_relay_and_lag_monitor(tmp_path: Path) -> None:
    """`zapstream status` as a process, against a streaming relay and `zapstream lag-monitor`."""
    from connectors.ops.status import parse_lag_metrics
    from devtools.stack.local_pipeline import LocalPipeline

    with LocalPipeline(tmp_path / "pipeline", partitions=2, with_sink=False) as pipeline:
        pipeline.start_relay()
        _, url = pipeline.start_lag_monitor(env={"ZAPSTREAM_LAG_INTERVAL_S": "0.5"})
        for n in range(10):
            _job(pipeline.dsn, f"st-lag-{n}", "st-lag-shop")
        group = pipeline.topics.group("zapstream-worker")

        def worker_lag() -> float:
            return sum(
                p.messages or 0.0
                for p in parse_lag_metrics(httpx.get(url, timeout=2).text)
                if p.group == group and p.topic == pipeline.topics.intents
            )

        # No worker runs: the 10 intents the relay streamed wait in Kafka.
        wait_until(lambda: worker_lag() >= 10, 30, "10 records of worker lag on the monitor")
        status = pipeline.process("status", ["status", "--json"], {"ZAPSTREAM_STATUS_LAG_URL": url})
        status.start()
        code = status.wait(60)
        output = status.log_tail(200)
    payload = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    assert code == EXIT_HEALTHY, output
    assert payload["slot"]["active"] is True and payload["slot"]["active_pid"] > 0
    assert payload["jobs"]["PENDING"] == 10
    assert payload["oldest_pending"][0]["instance"] == "st-lag-shop"
    lag = [
        p
        for p in payload["consumer_lag"]["partitions"]
        if p["group"] == group and p["topic"] == pipeline.topics.intents
    ]
    assert len(lag) == 2 and sum(p["lag_messages"] for p in lag) >= 10
    assert payload["consumer_lag"]["error"] is None
