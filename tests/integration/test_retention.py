"""`zapstream outbox prune` on a real PostgreSQL: old settled jobs become audit stubs.

The jobs' state changes are written through the state sink's own SQL
(:func:`~connectors.sink.state_sink.apply_states`) from records the worker's
state machine makes; their age is then set by moving ``updated_at`` back, as if
they had settled days ago. The command runs as a subprocess, as an operator or
a CronJob runs it.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import psycopg
import pytest

from connectors.ops.jobs_cli import show_job
from connectors.outbox.commands import cancel, request_reprocess
from connectors.outbox.enqueue import enqueue
from connectors.sink.state_sink import apply_states
from streams.kernel.contract import JobStatus, StatusChanged
from streams.kernel.state_machine import JobRef, transition

pytestmark = pytest.mark.integration

PHONE = "+55 11 98765-4321"
DIGITS = "5511987654321"
TEXT = "your code is 991133"


def _job(dsn: str, key: str, path: list[JobStatus], age_days: float) -> int:
    """Enqueue a job, move it along ``path`` through the sink's SQL, then age it."""
    with psycopg.connect(dsn) as conn:
        job_id = enqueue(conn, instance_id="shop", to=PHONE, text=TEXT, idempotency_key=key)
    ref = JobRef(job_id, key, "shop", DIGITS)
    states: list[StatusChanged] = []
    for attempt, to in enumerate(path, start=1):
        extra: dict[str, object] = {"attempts": attempt, "attempt_seq": attempt}
        if to is not JobStatus.ATTEMPTING:
            extra = {"reason": f"{to.value.lower()} by the gateway"}
        states.append(transition(ref, states[-1] if states else None, to, **extra))  # type: ignore[arg-type]

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await apply_states(conn, states)

    if states:
        asyncio.run(write())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox_jobs SET updated_at = now() - make_interval(secs => %s) WHERE id = %s",
            (age_days * 86400, job_id),
        )
    return job_id


def _prune(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ZAPSTREAM_DATABASE_URL": dsn}
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", "outbox", "prune", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _rows(dsn: str, job_id: int) -> dict[str, object]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = conn.execute(
            "SELECT status, payload, conversation_key, idempotency_key FROM outbox_jobs"
            " WHERE id = %s",
            (job_id,),
        ).fetchone()
        events = conn.execute(
            "SELECT to_status FROM outbox_job_events WHERE job_id = %s ORDER BY version",
            (job_id,),
        ).fetchall()
        commands = conn.execute(
            "SELECT command, actor, reason, payload, conversation_key FROM outbox_commands"
            " WHERE job_id = %s",
            (job_id,),
        ).fetchall()
    assert job is not None
    return {
        "status": job[0],
        "payload": job[1],
        "conversation_key": job[2],
        "key": job[3],
        "events": [e[0] for e in events],
        "commands": commands,
    }


@pytest.fixture(scope="module")
def jobs(outbox_db: str) -> dict[str, int]:
    a, t, f, d = JobStatus.ATTEMPTING, JobStatus.ACCEPTED, JobStatus.FAILED, JobStatus.DEAD
    made = {
        "old-accepted": _job(outbox_db, "ret-old-accepted", [a, t], 10),
        "old-failed": _job(outbox_db, "ret-old-failed", [a, f], 30),
        "old-dead": _job(outbox_db, "ret-old-dead", [a, d], 30),
        "recent-accepted": _job(outbox_db, "ret-recent-accepted", [a, t], 1),
        "old-pending": _job(outbox_db, "ret-old-pending", [], 30),
    }
    with psycopg.connect(outbox_db) as conn:
        cancel(conn, "ret-old-accepted", "customer asked", actor="alice")
    return made


def test_a_bound_shorter_than_the_intents_retention_is_refused(outbox_db: str) -> None:
    ran = _prune(outbox_db, "--older-than", "2d")
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines() == [
        "zapstream: outbox prune: --older-than must be at least 7d"
        " (the intents topic's retention), got 2 days, 0:00:00"
    ]


def test_dry_run_counts_and_changes_nothing(outbox_db: str, jobs: dict[str, int]) -> None:
    before = {name: _rows(outbox_db, job_id) for name, job_id in jobs.items()}
    ran = _prune(outbox_db, "--older-than", "7d", "--dry-run")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "2 settled jobs older than 7d would be pruned",
        "kept for an operator's decision (never pruned): DEAD 1",
    ]
    assert {name: _rows(outbox_db, job_id) for name, job_id in jobs.items()} == before


def test_prune_keeps_audit_stubs_and_forgets_the_message(
    outbox_db: str, jobs: dict[str, int]
) -> None:
    untouched = {
        n: _rows(outbox_db, jobs[n]) for n in ("old-dead", "recent-accepted", "old-pending")
    }
    ran = _prune(outbox_db, "--older-than", "7d", "--batch", "1")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "pruned 2 settled jobs older than 7d (2 earlier state changes deleted)",
        "kept for an operator's decision (never pruned): DEAD 1",
    ]
    accepted = _rows(outbox_db, jobs["old-accepted"])
    assert accepted["status"] == "ACCEPTED" and accepted["key"] == "ret-old-accepted"
    payload = accepted["payload"]
    assert isinstance(payload, dict) and set(payload) == {"type", "pruned_at"}
    assert payload["type"] == "text"
    assert accepted["conversation_key"] is None
    assert accepted["events"] == ["ACCEPTED"]  # only the last state change
    [(command, actor, reason, command_payload, command_conversation)] = accepted["commands"]  # type: ignore[misc]
    assert (command, actor, reason) == ("cancel", "alice", "customer asked")
    assert set(command_payload) == {"type", "pruned_at"} and command_conversation is None
    failed = _rows(outbox_db, jobs["old-failed"])
    assert failed["events"] == ["FAILED"] and set(failed["payload"]) == {"type", "pruned_at"}  # type: ignore[arg-type]
    # Nothing of the message is left in any row of the pruned jobs.
    dumped = json.dumps([accepted, failed], default=str)
    assert DIGITS not in dumped and TEXT not in dumped and "98765" not in dumped
    for name, rows in untouched.items():
        assert _rows(outbox_db, jobs[name]) == rows, name

    again = _prune(outbox_db, "--older-than", "7d")
    assert again.stdout.splitlines()[0] == (
        "pruned 0 settled jobs older than 7d (0 earlier state changes deleted)"
    )


def test_a_pruned_job_still_refuses_its_key_and_cannot_be_resent(
    outbox_db: str, jobs: dict[str, int]
) -> None:
    if "pruned_at" not in _rows(outbox_db, jobs["old-failed"])["payload"]:  # type: ignore[operator]
        assert _prune(outbox_db, "--older-than", "7d").returncode == 0
    with psycopg.connect(outbox_db) as conn:
        again = enqueue(
            conn, instance_id="shop", to=PHONE, text=TEXT, idempotency_key="ret-old-failed"
        )
        assert again == jobs["old-failed"]
        assert conn.execute("SELECT count(*) FROM outbox_jobs").fetchone() == (len(jobs),)
    with psycopg.connect(outbox_db) as conn, pytest.raises(psycopg.Error, match="was pruned"):
        request_reprocess(conn, jobs["old-failed"], "try again", "bob")
    out = io.StringIO()
    assert show_job(outbox_db, jobs["old-failed"], out=out) == 0
    assert "FAILED" in out.getvalue()
