"""Controls and backpressure on a real PostgreSQL, and through the real relay into Kafka.

The first tests run against the module's own PostgreSQL (``outbox_db``): the
``outbox_controls`` table, its view and SQL functions, the Python API, and
``zapstream_backlog`` / ``zapstream_should_hold`` on jobs of known ages. The
last ones run the relay as a subprocess (:class:`LocalPipeline`): ``zapstream
instances pause`` (the real command line) writes a row that reaches
``zapstream.controls`` as a ControlChanged, and a malformed row reaches
``zapstream.invalid`` without stopping the rows after it.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors

from connectors.cdc.provisioning import ensure_replication
from connectors.ops.controls_cli import EXIT_DONE, EXIT_REFUSED, list_targets, set_control
from connectors.outbox.controls import (
    InvalidControl,
    backlog,
    backlog_async,
    controls,
    pause_campaign,
    pause_instance,
    pause_instance_async,
    resume_instance,
    should_hold,
)
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import (
    ControlAction,
    ControlChanged,
    ControlKind,
    IntentRejected,
    decode_topic_record,
)
from tests.integration.support import count_rows, wait_until
from tests.integration.topic_reader import TopicRecord, read_topic

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _control_rows(dsn: str, target: str) -> list[tuple[str, str, str, str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT kind, target, action, reason, actor FROM outbox_controls "
            "WHERE target = %s ORDER BY id",
            (target,),
        ).fetchall()
    return [(str(k), str(t), str(a), str(r), str(w)) for k, t, a, r, w in rows]


def _jobs_aged(
    dsn: str,
    instance: str,
    ages_s: list[float],
    *,
    status: str = "PENDING",
    priority: str = "operational",
    purpose: str | None = None,
) -> None:
    """Insert jobs created ``ages_s`` seconds ago (the database's clock), then set ``status``."""
    with psycopg.connect(dsn) as conn:
        for age_s in ages_s:
            conn.execute(
                "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, priority, purpose,"
                " created_at, status) VALUES (%s, %s, %s, %s, %s,"
                " now() - make_interval(secs => %s), %s)",
                (
                    instance,
                    '{"type": "text", "to": "5511900000001", "text": "x"}',
                    _name("job"),
                    priority,
                    purpose,
                    age_s,
                    status,
                ),
            )


# --- the schema and the API, on PostgreSQL alone ------------------------------------------


def test_pause_and_resume_are_recorded_and_the_view_shows_the_latest(outbox_db: str) -> None:
    instance = _name("shop")
    with psycopg.connect(outbox_db) as conn:
        first = pause_instance(conn, instance, reason=" number flagged ", actor="alice")
        second = resume_instance(conn, instance, reason="appeal accepted", actor="bob")
    assert second > first
    assert _control_rows(outbox_db, instance) == [
        ("instance", instance, "pause", "number flagged", "alice"),
        ("instance", instance, "resume", "appeal accepted", "bob"),
    ]
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        (latest,) = [c for c in controls(conn) if c.target == instance]
    assert (latest.action, latest.actor, latest.reason) == ("resume", "bob", "appeal accepted")
    assert latest.control_id == second and not latest.paused


def test_invalid_input_writes_nothing_and_keeps_the_transaction_usable(outbox_db: str) -> None:
    instance = _name("shop")
    with psycopg.connect(outbox_db) as conn:
        with pytest.raises(InvalidControl, match="reason is required"):
            pause_instance(conn, instance, reason="  ", actor="alice")
        pause_campaign(conn, instance, reason="still usable", actor="alice")
    assert _control_rows(outbox_db, instance) == [
        ("campaign", instance, "pause", "still usable", "alice")
    ]


def test_sql_functions_write_controls_and_the_table_refuses_bad_ones(outbox_db: str) -> None:
    purpose = _name("promo")
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        (paused_id,) = conn.execute(
            "SELECT zapstream_pause('campaign', %s, 'copy under review', 'carol')", (purpose,)
        ).fetchone() or (None,)
        with pytest.raises(errors.CheckViolation):
            conn.execute("SELECT zapstream_pause('tenant', %s, 'why', 'carol')", (purpose,))
        with pytest.raises(errors.CheckViolation):
            conn.execute("SELECT zapstream_resume('campaign', %s, '  ', 'carol')", (purpose,))
        conn.execute("SELECT zapstream_resume('campaign', %s, 'approved')", (purpose,))
        row = conn.execute(
            "SELECT action, actor, paused FROM zapstream_controls WHERE target = %s", (purpose,)
        ).fetchone()
    assert isinstance(paused_id, int)
    assert row == ("resume", "application", False)
    assert [r[2] for r in _control_rows(outbox_db, purpose)] == ["pause", "resume"]


def test_backlog_counts_unsettled_jobs_with_the_oldest_age(outbox_db: str) -> None:
    instance = _name("shop")
    campaign = _name("promo")
    _jobs_aged(outbox_db, instance, [30, 120])
    _jobs_aged(outbox_db, instance, [600], status="RETRY_WAIT")
    _jobs_aged(outbox_db, instance, [5], status="ATTEMPTING")
    _jobs_aged(outbox_db, instance, [7200, 7200], status="DELIVERED")  # settled: not counted
    _jobs_aged(outbox_db, instance, [3600], status="DEAD")
    _jobs_aged(outbox_db, instance, [900, 60], priority="bulk", purpose=campaign)
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        rows = backlog(conn, instance=instance)
        by_campaign = backlog(conn, purpose=campaign)
        everything = backlog(conn)
    assert [(r.purpose, r.priority, r.waiting) for r in rows] == [
        (campaign, "bulk", 2),
        (None, "operational", 4),
    ]
    operational = rows[1]
    assert 600 <= operational.oldest_waiting_age_s < 660
    assert 900 <= rows[0].oldest_waiting_age_s < 960
    assert [(r.instance_id, r.waiting) for r in by_campaign] == [(instance, 2)]
    assert {(r.instance_id, r.priority, r.waiting) for r in everything} >= {
        (instance, "bulk", 2),
        (instance, "operational", 4),
    }


def test_should_hold_when_the_oldest_operational_message_is_older_than_the_limit(
    outbox_db: str,
) -> None:
    instance = _name("shop")
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        assert not should_hold(conn, instance, 60)  # nothing waiting
        _jobs_aged(outbox_db, instance, [3600], priority="bulk", purpose="promo")
        assert not should_hold(conn, instance, 60)  # only bulk waits: not a reason to hold
        _jobs_aged(outbox_db, instance, [7200], status="DELIVERED")
        assert not should_hold(conn, instance, 60)  # settled
        _jobs_aged(outbox_db, instance, [20])
        assert not should_hold(conn, instance, 60)
        _jobs_aged(outbox_db, instance, [300], status="RETRY_WAIT")
        assert should_hold(conn, instance, 60)
        assert not should_hold(conn, instance, 600)
        (direct,) = conn.execute(
            "SELECT zapstream_should_hold(%s, 120)", (instance,)
        ).fetchone() or (None,)
    assert direct is True


def test_backlog_async_agrees(outbox_db: str) -> None:
    instance = _name("shop")
    _jobs_aged(outbox_db, instance, [45, 10])

    async def run() -> tuple[int, float]:
        async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as conn:
            await pause_instance_async(conn, instance, reason="async", actor="app")
            (row,) = await backlog_async(conn, instance=instance)
            return row.waiting, row.oldest_waiting_age_s

    waiting, age_s = asyncio.run(run())
    assert waiting == 2 and 45 <= age_s < 105
    assert _control_rows(outbox_db, instance)[0][2:] == ("pause", "async", "app")


def test_cli_functions_pause_refuse_and_list(outbox_db: str) -> None:
    instance = _name("shop")
    _jobs_aged(outbox_db, instance, [90, 30])
    out = io.StringIO()
    code = set_control(
        outbox_db,
        ControlKind.INSTANCE,
        ControlAction.PAUSE,
        instance,
        reason="number flagged",
        actor="alice",
        out=out,
    )
    assert code == EXIT_DONE
    assert out.getvalue().startswith(f"paused instance {instance}: control ")
    assert out.getvalue().rstrip().endswith("by alice: number flagged")
    again = io.StringIO()
    set_control(
        outbox_db,
        ControlKind.INSTANCE,
        ControlAction.PAUSE,
        instance,
        reason="still flagged",
        actor="bob",
        out=again,
    )
    assert "(it was already paused by alice at " in again.getvalue()
    refused = io.StringIO()
    code = set_control(
        outbox_db,
        ControlKind.INSTANCE,
        ControlAction.RESUME,
        instance,
        reason=" ",
        actor="bob",
        out=refused,
    )
    assert code == EXIT_REFUSED
    assert refused.getvalue() == f"cannot resume instance {instance}: reason is required\n"
    assert len(_control_rows(outbox_db, instance)) == 2
    listing = io.StringIO()
    assert list_targets(outbox_db, ControlKind.INSTANCE, as_json=True, out=listing) == EXIT_DONE
    (mine,) = [t for t in json.loads(listing.getvalue()) if t["target"] == instance]
    assert (mine["paused"], mine["actor"], mine["reason"]) == (True, "bob", "still flagged")
    assert mine["waiting"] == 2 and 90 <= mine["oldest_waiting_age_s"] < 150


def test_a_publication_from_before_controls_gets_the_table_added(outbox_db: str) -> None:
    publication, slot = _name("older_pub").replace("-", "_"), _name("older_slot").replace("-", "_")
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        conn.execute(
            f"CREATE PUBLICATION {publication} FOR TABLE outbox_jobs, outbox_commands "
            "WITH (publish = 'insert')"
        )
    try:
        ensure_replication(outbox_db, slot=slot, publication=publication)
        with psycopg.connect(outbox_db, autocommit=True) as conn:
            tables = {
                str(t)
                for (t,) in conn.execute(
                    "SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
                    (publication,),
                )
            }
    finally:
        with psycopg.connect(outbox_db, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f"DROP PUBLICATION {publication}")
    assert tables == {
        "outbox_jobs",
        "outbox_commands",
        "outbox_replays",
        "outbox_controls",
        "outbox_optouts",
    }


# --- through the relay, with the real command line ------------------------------------------


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=2, with_sink=False) as p:
        p.start_relay()
        yield p


def _zapstream(pipeline: LocalPipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", *args],
        env={**os.environ, **pipeline.env()},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _records(pipeline: LocalPipeline, topic: str) -> list[TopicRecord]:
    return read_topic(pipeline.kafka.bootstrap, topic)


def _controls_for(pipeline: LocalPipeline, target: str) -> list[ControlChanged]:
    found = []
    for record in _records(pipeline, pipeline.topics.controls):
        decoded = decode_topic_record(record.value)
        if isinstance(decoded, ControlChanged) and decoded.target == target:
            assert record.key == f"{decoded.kind}:{decoded.target}".encode()
            found.append(decoded)
    return found


def test_cli_pause_reaches_zapstream_controls_and_list_shows_it(pipeline: LocalPipeline) -> None:
    instance = _name("shop")
    _jobs_aged(pipeline.dsn, instance, [120, 10], status="RETRY_WAIT")
    done = _zapstream(
        pipeline, "instances", "pause", instance, "--reason", "number flagged", "--by", "alice"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"paused instance {instance}: control ")
    wait_until(lambda: len(_controls_for(pipeline, instance)) == 1, 60, "the ControlChanged")
    (control,) = _controls_for(pipeline, instance)
    row_id = count_rows(
        pipeline.dsn, "SELECT id FROM outbox_controls WHERE target = %s", (instance,)
    )
    assert (control.kind, control.action, control.reason, control.actor) == (
        "instance",
        "pause",
        "number flagged",
        "alice",
    )
    assert control.control_id == row_id and control.at is not None
    listing = _zapstream(pipeline, "instances", "list")
    assert listing.returncode == 0, listing.stderr
    (line,) = [ln for ln in listing.stdout.splitlines() if ln.startswith(instance)]
    assert line.split()[:3] == [instance, "paused", "alice"]
    assert "number flagged" in line and line.split()[-2] == "2"
    refused = _zapstream(pipeline, "campaigns", "resume", "promo", "--reason", " ", "--by", "x")
    assert refused.returncode == 2
    assert refused.stdout.strip() == "cannot resume campaign promo: reason is required"


def test_a_malformed_control_goes_to_invalid_and_later_controls_still_flow(
    pipeline: LocalPipeline,
) -> None:
    target = _name("shop")
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        # The relay does not trust the schema: a table whose checks were dropped by hand.
        conn.execute("ALTER TABLE outbox_controls DROP CONSTRAINT outbox_controls_kind_check")
        try:
            conn.execute(
                "INSERT INTO outbox_controls (kind, target, action, reason, actor) "
                "VALUES ('tenant', %s, 'pause', 'bad kind', 'mallory')",
                (target,),
            )
        finally:
            conn.execute("DELETE FROM outbox_controls WHERE kind = 'tenant'")
            conn.execute(
                "ALTER TABLE outbox_controls ADD CONSTRAINT outbox_controls_kind_check "
                "CHECK (kind IN ('instance', 'campaign'))"
            )
        conn.execute(
            "SELECT zapstream_pause('instance', %s, 'flagged after all', 'alice')", (target,)
        )

    def rejected() -> list[IntentRejected]:
        found = []
        for record in _records(pipeline, pipeline.topics.invalid):
            decoded = decode_topic_record(record.value)
            if isinstance(decoded, IntentRejected) and decoded.row.get("target") == target:
                found.append(decoded)
        return found

    wait_until(lambda: len(_controls_for(pipeline, target)) == 1, 60, "the later control")
    wait_until(lambda: len(rejected()) == 1, 30, "the rejection")
    (rejection,) = rejected()
    assert "unknown control kind 'tenant'" in rejection.reason
    assert rejection.job_id is None and rejection.row["actor"] == "mallory"
    (control,) = _controls_for(pipeline, target)
    assert (control.action, control.reason) == ("pause", "flagged after all")
