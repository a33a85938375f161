"""Commands on a real PostgreSQL: outbox_commands, its trigger, the API and `zapstream jobs`.

The worker is not running here: tests that need its answer write the events it
would write (``outbox_job_events``) from a thread, as the state sink would.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors

from connectors.ops.jobs_cli import add_jobs_parser, cancel_job, list_jobs, reprocess_job
from connectors.outbox.commands import (
    InvalidCommand,
    cancel,
    cancel_async,
    request_cancel_by_id,
    request_reprocess,
)
from connectors.outbox.enqueue import enqueue
from tests.integration.support import count_rows

pytestmark = pytest.mark.integration

RECIPIENT = "+55 11 98765-4321"
NORMALIZED = "5511987654321"
TEXT = "your secret code is 918273"


def _key(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _job(
    dsn: str,
    key: str,
    *,
    instance: str = "shop-1",
    status: str | None = None,
    to: str = RECIPIENT,
    last_error: str | None = None,
) -> int:
    with psycopg.connect(dsn) as conn:
        job_id = enqueue(
            conn,
            instance_id=instance,
            to=to,
            text=TEXT,
            idempotency_key=key,
            purpose="order",
            expires_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC),
            max_attempts=3,
        )
        if status is not None:
            conn.execute(
                "UPDATE outbox_jobs SET status = %s, attempts = 3, last_error = %s WHERE id = %s",
                (status, last_error, job_id),
            )
    return job_id


def _event(
    dsn: str, job_id: int, from_status: str | None, to_status: str, reason: str, actor: str = "w"
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_job_events (job_id, from_status, to_status, version, actor, reason)"
            " SELECT %s, %s, %s, coalesce(max(version), 0) + 1, %s, %s"
            " FROM outbox_job_events WHERE job_id = %s",
            (job_id, from_status, to_status, actor, reason, job_id),
        )


def _commands(dsn: str, job_id: int) -> list[tuple[str, str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT command, reason, actor FROM outbox_commands WHERE job_id = %s ORDER BY id",
            (job_id,),
        ).fetchall()
    return [(str(c), str(r), str(a)) for c, r, a in rows]


@pytest.fixture
def worker_answers(outbox_db: str) -> Iterator[list[threading.Thread]]:
    """Threads standing in for the worker; joined at the end of the test."""
    threads: list[threading.Thread] = []
    yield threads
    for thread in threads:
        thread.join(timeout=10)


def _answer_when_commanded(
    threads: list[threading.Thread],
    dsn: str,
    job_id: int,
    events: list[tuple[str, str, str]],
) -> None:
    """Once a command for the job exists, write ``events`` (from, to, reason) as the worker."""

    def run() -> None:
        deadline = time.monotonic() + 10
        while (
            count_rows(dsn, "SELECT count(*) FROM outbox_commands WHERE job_id = %s", (job_id,))
            == 0
        ):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        for from_status, to_status, reason in events:
            _event(dsn, job_id, from_status, to_status, reason, actor="worker")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    threads.append(thread)


# --- the table, its trigger and zapstream_cancel() ---------------------------------------


def test_cancel_writes_the_command_with_the_jobs_columns_copied(outbox_db: str) -> None:
    key = _key("copy")
    job_id = _job(outbox_db, key)
    with psycopg.connect(outbox_db) as conn:
        command_id = cancel(conn, f"  {key} ", " customer cancelled ", actor="shop-backend")
        conn.commit()
        row = conn.execute(
            """SELECT c.job_id, c.idempotency_key, c.command, c.reason, c.actor,
                      c.instance_id = j.instance_id, c.conversation_key = j.conversation_key,
                      c.payload = j.payload, c.priority = j.priority, c.purpose = j.purpose,
                      c.expires_at = j.expires_at, c.max_attempts = j.max_attempts,
                      c.job_created_at = j.created_at, c.conversation_key
               FROM outbox_commands c JOIN outbox_jobs j ON j.id = c.job_id WHERE c.id = %s""",
            (command_id,),
        ).fetchone()
    assert row is not None
    assert row[:5] == (job_id, key, "cancel", "customer cancelled", "shop-backend")
    assert all(row[5:13]), row
    assert row[13] == NORMALIZED


def test_cancel_runs_in_the_callers_transaction(outbox_db: str) -> None:
    key = _key("tx")
    job_id = _job(outbox_db, key)
    with psycopg.connect(outbox_db) as conn:
        cancel(conn, key, "changed my mind")
        conn.rollback()
    assert _commands(outbox_db, job_id) == []
    # Enqueue and cancel in one transaction: both or neither.
    other = _key("tx-both")
    with psycopg.connect(outbox_db) as conn, conn.transaction():
        new_job = enqueue(
            conn, instance_id="shop-1", to=RECIPIENT, text=TEXT, idempotency_key=other
        )
        cancel(conn, other, "duplicate order")
    assert _commands(outbox_db, new_job) == [("cancel", "duplicate order", "application")]


def test_unknown_key_raises_invalid_command_writes_nothing_and_keeps_the_transaction(
    outbox_db: str,
) -> None:
    before = count_rows(outbox_db, "SELECT count(*) FROM outbox_commands")
    key = _key("kept")
    with psycopg.connect(outbox_db) as conn:
        with pytest.raises(InvalidCommand, match="no outbox job with idempotency_key 'nope-1'"):
            cancel(conn, "nope-1", "customer cancelled")
        # The caller's transaction is still usable: no SQL error was raised in it.
        enqueue(conn, instance_id="shop-1", to=RECIPIENT, text=TEXT, idempotency_key=key)
        conn.commit()
    assert count_rows(outbox_db, "SELECT count(*) FROM outbox_commands") == before
    assert (
        count_rows(outbox_db, "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = %s", (key,))
        == 1
    )


@pytest.mark.parametrize(
    ("key", "reason", "actor", "message"),
    [
        ("job", "", "application", "reason is required"),
        ("job", "   ", "application", "reason is required"),
        ("", "why", "application", "idempotency_key is required"),
        ("job", "why", " ", "actor is required"),
    ],
)
def test_invalid_cancel_raises_and_writes_nothing(
    outbox_db: str, key: str, reason: str, actor: str, message: str
) -> None:
    job_key = _key("invalid")
    job_id = _job(outbox_db, job_key)
    with psycopg.connect(outbox_db) as conn:
        with pytest.raises(InvalidCommand, match=message):
            cancel(conn, job_key if key == "job" else key, reason, actor=actor)
        conn.commit()
    assert _commands(outbox_db, job_id) == []


async def test_cancel_async(outbox_db: str) -> None:
    key = _key("async")
    job_id = _job(outbox_db, key)
    async with await psycopg.AsyncConnection.connect(outbox_db) as conn:
        with pytest.raises(InvalidCommand, match="no outbox job"):
            await cancel_async(conn, "nope-async", "why")
        command_id = await cancel_async(conn, key, "customer cancelled", actor="app-2")
        await conn.commit()
    assert command_id > 0
    assert _commands(outbox_db, job_id) == [("cancel", "customer cancelled", "app-2")]


def test_operator_functions_by_id(outbox_db: str) -> None:
    job_id = _job(outbox_db, _key("ops"), status="DEAD")
    with psycopg.connect(outbox_db) as conn:
        request_reprocess(conn, job_id, "outage over", "alice")
        request_cancel_by_id(conn, job_id, "not needed any more", "bob")
        with pytest.raises(InvalidCommand, match="no outbox job with id 999999999"):
            request_reprocess(conn, 999_999_999, "why", "alice")
        with pytest.raises(InvalidCommand, match="positive integer"):
            request_cancel_by_id(conn, 0, "why", "alice")
        with pytest.raises(InvalidCommand, match="actor is required"):
            request_reprocess(conn, job_id, "why", "")
        conn.commit()
    assert _commands(outbox_db, job_id) == [
        ("reprocess", "outage over", "alice"),
        ("cancel", "not needed any more", "bob"),
    ]


def test_plain_sql_insert_and_zapstream_cancel(outbox_db: str) -> None:
    key = _key("sql")
    job_id = _job(outbox_db, key)
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_commands (idempotency_key, command, reason) "
            "VALUES (%s, 'cancel', 'customer cancelled')",
            (key,),
        )
        # Operators name the job by id; copies a caller writes are replaced by the job's.
        conn.execute(
            "INSERT INTO outbox_commands (job_id, command, reason, actor, payload) "
            "VALUES (%s, 'reprocess', 'try again', 'alice', '{\"text\": \"forged\"}')",
            (job_id,),
        )
        row = conn.execute("SELECT zapstream_cancel(%s, 'second thoughts')", (key,)).fetchone()
        assert row is not None and isinstance(row[0], int)
        row = conn.execute("SELECT zapstream_cancel(%s, 'by ops', 'carol')", (key,)).fetchone()
        assert row is not None
        copies = conn.execute(
            "SELECT DISTINCT c.idempotency_key, c.payload = j.payload, c.instance_id "
            "FROM outbox_commands c JOIN outbox_jobs j ON j.id = c.job_id WHERE c.job_id = %s",
            (job_id,),
        ).fetchall()
    assert copies == [(key, True, "shop-1")]
    assert _commands(outbox_db, job_id) == [
        ("cancel", "customer cancelled", "application"),
        ("reprocess", "try again", "alice"),
        ("cancel", "second thoughts", "application"),
        ("cancel", "by ops", "carol"),
    ]


@pytest.mark.parametrize(
    ("statement", "error", "message"),
    [
        (
            "INSERT INTO outbox_commands (idempotency_key, command, reason) "
            "VALUES ('no-such-order', 'cancel', 'customer cancelled')",
            errors.NoDataFound,
            "no outbox job with idempotency_key no-such-order",
        ),
        (
            "SELECT zapstream_cancel('no-such-order', 'customer cancelled')",
            errors.NoDataFound,
            "no outbox job with idempotency_key no-such-order",
        ),
        (
            "INSERT INTO outbox_commands (job_id, command, reason) "
            "VALUES (999999999, 'cancel', 'why')",
            errors.NoDataFound,
            "no outbox job with id 999999999",
        ),
        (
            "INSERT INTO outbox_commands (command, reason) VALUES ('cancel', 'why')",
            errors.NotNullViolation,
            "idempotency_key or job_id",
        ),
        (
            "INSERT INTO outbox_commands (idempotency_key, command, reason) "
            "VALUES ({key}, 'delete', 'why')",
            errors.CheckViolation,
            "outbox_commands_command_check",
        ),
        (
            "INSERT INTO outbox_commands (idempotency_key, command, reason) "
            "VALUES ({key}, 'cancel', '  ')",
            errors.CheckViolation,
            "outbox_commands_reason_check",
        ),
        (
            "INSERT INTO outbox_commands (job_id, idempotency_key, command, reason) "
            "VALUES (999999999, {key}, 'cancel', 'why')",
            errors.InvalidParameterValue,
            "belongs to job",
        ),
    ],
)
def test_plain_sql_errors_write_nothing(
    outbox_db: str, statement: str, error: type[Exception], message: str
) -> None:
    key = _key("sqlerr")
    _job(outbox_db, key)
    before = count_rows(outbox_db, "SELECT count(*) FROM outbox_commands")
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        with pytest.raises(error, match=message):
            conn.execute(statement.replace("{key}", f"'{key}'"))
    assert count_rows(outbox_db, "SELECT count(*) FROM outbox_commands") == before


# --- zapstream jobs list ---------------------------------------------------------------------


def test_jobs_list_masks_recipients_and_never_prints_text(outbox_db: str) -> None:
    instance = _key("mask")
    _job(outbox_db, _key("m1"), instance=instance, status="FAILED", last_error="x" * 200)
    _job(outbox_db, _key("m2"), instance=instance, to="120363025246125486@g.us")
    out = io.StringIO()
    assert list_jobs(outbox_db, instance=instance, out=out) == 0
    text = out.getvalue()
    assert "5511*****4321" in text
    assert "1203**********5486@g.us" in text
    assert NORMALIZED not in text and "120363025246125486" not in text
    assert TEXT not in text and "918273" not in text
    assert "x" * 37 + "..." in text and "x" * 41 not in text
    assert "FAILED" in text and "PENDING" in text
    assert text.splitlines()[0].split() == [
        "ID",
        "INSTANCE",
        "RECIPIENT",
        "STATUS",
        "ATTEMPTS",
        "AGE",
        "LAST",
        "ERROR",
        "UPDATED",
        "(UTC)",
    ]
    assert text.rstrip().endswith("page 1 of 1, 2 jobs")


def test_jobs_list_filters_by_state_and_instance(outbox_db: str) -> None:
    instance, other = _key("filter"), _key("filter-other")
    dead = _job(outbox_db, _key("f1"), instance=instance, status="DEAD")
    failed = _job(outbox_db, _key("f2"), instance=instance, status="FAILED")
    pending = _job(outbox_db, _key("f3"), instance=instance)
    elsewhere = _job(outbox_db, _key("f4"), instance=other, status="DEAD")

    def ids(**kwargs: object) -> set[int]:
        out = io.StringIO()
        list_jobs(outbox_db, out=out, **kwargs)  # type: ignore[arg-type]
        return {int(line.split()[0]) for line in out.getvalue().splitlines()[1:-1]}

    assert ids(instance=instance) == {dead, failed, pending}
    assert ids(instance=instance, states=["DEAD"]) == {dead}
    assert ids(instance=instance, states=["dead", "FAILED"]) == {dead, failed}
    assert ids(instance=other) == {elsewhere}
    assert elsewhere in ids(states=["DEAD"])


def test_jobs_list_filters_by_time(outbox_db: str) -> None:
    instance = _key("time")
    old = _job(outbox_db, _key("t1"), instance=instance)
    new = _job(outbox_db, _key("t2"), instance=instance)
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox_jobs SET created_at = now() - interval '3 hours' WHERE id = %s", (old,)
        )
    now = dt.datetime.now(dt.UTC)

    def run(**kwargs: object) -> str:
        out = io.StringIO()
        list_jobs(outbox_db, instance=instance, out=out, **kwargs)  # type: ignore[arg-type]
        return out.getvalue()

    recent = run(since=now - dt.timedelta(hours=1))
    assert f"\n{new} " in recent and f"\n{old} " not in recent
    earlier = run(until=now - dt.timedelta(hours=1))
    assert f"\n{old} " in earlier and f"\n{new} " not in earlier
    assert "3h00m" in earlier or "2h59m" in earlier


def test_jobs_list_paginates(outbox_db: str) -> None:
    instance = _key("page")
    job_ids = [_job(outbox_db, _key(f"p{i}"), instance=instance) for i in range(5)]
    pages = []
    for page in (1, 2, 3):
        out = io.StringIO()
        list_jobs(outbox_db, instance=instance, limit=2, page=page, out=out)
        lines = out.getvalue().splitlines()
        assert lines[-1] == f"page {page} of 3, 5 jobs"
        pages.append([int(line.split()[0]) for line in lines[1:-1]])
    assert pages == [job_ids[4:2:-1], job_ids[2:0:-1], job_ids[:1]]


def test_jobs_list_with_no_match(outbox_db: str) -> None:
    out = io.StringIO()
    assert list_jobs(outbox_db, instance=_key("nothing"), out=out) == 0
    assert out.getvalue().splitlines()[-1] == "page 1 of 1, 0 jobs"


# --- zapstream jobs cancel --------------------------------------------------------------------


def test_jobs_cancel_without_waiting_inserts_the_command_and_reports_still_pending(
    outbox_db: str,
) -> None:
    job_id = _job(outbox_db, _key("cwait"))
    out = io.StringIO()
    code = cancel_job(outbox_db, job_id, reason="customer asked", actor="alice", wait_s=0, out=out)
    assert code == 1
    assert "still pending: the worker has not handled it yet" in out.getvalue()
    assert _commands(outbox_db, job_id) == [("cancel", "customer asked", "alice")]


def test_jobs_cancel_reports_cancelled(
    outbox_db: str, worker_answers: list[threading.Thread]
) -> None:
    job_id = _job(outbox_db, _key("cdone"))
    _event(outbox_db, job_id, None, "PENDING", "enqueued")
    _answer_when_commanded(
        worker_answers, outbox_db, job_id, [("PENDING", "CANCELLED", "customer asked")]
    )
    out = io.StringIO()
    code = cancel_job(
        outbox_db,
        job_id,
        reason="customer asked",
        actor="alice",
        wait_s=10,
        out=out,
        poll_interval_s=0.05,
    )
    assert code == 0, out.getvalue()
    assert "CANCELLED: job" in out.getvalue()


def test_jobs_cancel_reports_the_workers_refusal(
    outbox_db: str, worker_answers: list[threading.Thread]
) -> None:
    job_id = _job(outbox_db, _key("crefused"), status="ACCEPTED")
    _event(outbox_db, job_id, "PENDING", "CANCELLED", "cancelled earlier")  # before the command
    _answer_when_commanded(
        worker_answers,
        outbox_db,
        job_id,
        [("ACCEPTED", "ACCEPTED", "cancel refused: already accepted by the gateway")],
    )
    out = io.StringIO()
    code = cancel_job(
        outbox_db,
        job_id,
        reason="too late",
        actor="alice",
        wait_s=10,
        out=out,
        poll_interval_s=0.05,
    )
    assert code == 1
    assert "NOT CANCELLED" in out.getvalue()
    assert "already accepted by the gateway" in out.getvalue()


def test_jobs_cancel_of_an_unknown_job(outbox_db: str) -> None:
    out = io.StringIO()
    assert cancel_job(outbox_db, 999_999_999, reason="x", actor="a", wait_s=0, out=out) == 2
    assert "no job 999999999" in out.getvalue()


# --- zapstream jobs reprocess ------------------------------------------------------------------


def test_jobs_reprocess_refuses_a_pending_job(outbox_db: str) -> None:
    job_id = _job(outbox_db, _key("rpending"))
    out = io.StringIO()
    assert reprocess_job(outbox_db, job_id, reason="r", actor="alice", wait_s=0, out=out) == 2
    assert "it is PENDING" in out.getvalue()
    assert "only DEAD, FAILED, UNCERTAIN jobs" in out.getvalue()
    assert _commands(outbox_db, job_id) == []


def test_jobs_reprocess_warns_and_requires_yes_for_an_uncertain_job(outbox_db: str) -> None:
    job_id = _job(outbox_db, _key("runcertain"), status="UNCERTAIN")
    _event(outbox_db, job_id, None, "PENDING", "enqueued", actor="relay")
    _event(outbox_db, job_id, "PENDING", "ATTEMPTING", "attempt 1")
    _event(outbox_db, job_id, "ATTEMPTING", "UNCERTAIN", "read timeout after the request was sent")

    out = io.StringIO()
    code = reprocess_job(outbox_db, job_id, reason="checked", actor="alice", wait_s=0, out=out)
    text = out.getvalue()
    assert code == 2
    assert "WARNING" in text and "TWICE" in text and "--yes" in text
    assert "ATTEMPTING -> UNCERTAIN" in text and "read timeout" in text
    assert NORMALIZED not in text and TEXT not in text
    assert _commands(outbox_db, job_id) == []

    out = io.StringIO()
    code = reprocess_job(
        outbox_db,
        job_id,
        reason="gateway says not delivered",
        actor="alice",
        wait_s=0,
        yes=True,
        out=out,
    )
    assert code == 1
    assert "WARNING" in out.getvalue()
    assert "still pending" in out.getvalue()
    assert _commands(outbox_db, job_id) == [("reprocess", "gateway says not delivered", "alice")]


def test_jobs_reprocess_warns_when_the_last_reason_mentions_an_uncertain_outcome(
    outbox_db: str,
) -> None:
    job_id = _job(outbox_db, _key("rreason"), status="FAILED")
    _event(outbox_db, job_id, "ATTEMPTING", "FAILED", "gave up: outcome uncertain after reset")
    out = io.StringIO()
    assert reprocess_job(outbox_db, job_id, reason="r", actor="alice", wait_s=0, out=out) == 2
    assert "WARNING" in out.getvalue()
    assert _commands(outbox_db, job_id) == []


def test_jobs_reprocess_of_a_dead_job_inserts_the_command(
    outbox_db: str, worker_answers: list[threading.Thread]
) -> None:
    job_id = _job(outbox_db, _key("rdead"), status="DEAD", last_error="503 five times")
    _event(outbox_db, job_id, "RETRY_WAIT", "DEAD", "exhausted 3 attempts")
    _answer_when_commanded(
        worker_answers,
        outbox_db,
        job_id,
        [
            ("DEAD", "PENDING", "reprocess by alice: outage over"),
            ("PENDING", "ATTEMPTING", "attempt 4"),
            ("ATTEMPTING", "ACCEPTED", "accepted"),
        ],
    )
    out = io.StringIO()
    code = reprocess_job(
        outbox_db,
        job_id,
        reason="outage over",
        actor="alice",
        wait_s=10,
        out=out,
        poll_interval_s=0.05,
    )
    text = out.getvalue()
    assert code == 0, text
    assert "WARNING" not in text
    assert "RETRY_WAIT -> DEAD" in text  # the history
    assert "reprocess requested" in text
    assert f"job {job_id} is now ACCEPTED" in text
    assert _commands(outbox_db, job_id) == [("reprocess", "outage over", "alice")]


# --- argparse wiring ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zapstream")
    add_jobs_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_parser_requires_reason_and_by(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["jobs", "reprocess", "1", "--by", "alice"],
        ["jobs", "cancel", "1", "--reason", "r"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            _parser().parse_args(argv)
        assert exit_info.value.code == 2
    assert "required" in capsys.readouterr().err


def test_parser_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["jobs", "list", "--state", "sleeping"],
        ["jobs", "list", "--last", "soon"],
        ["jobs", "list", "--since", "2026-01-01", "--last", "1h"],
        ["jobs", "list", "--page", "0"],
    ):
        with pytest.raises(SystemExit):
            _parser().parse_args(argv)
    assert "unknown status 'sleeping'" in capsys.readouterr().err


def test_cli_functions_read_the_dsn_from_settings(
    outbox_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ZAPSTREAM_DATABASE_URL", outbox_db)
    instance = _key("cli")
    job_id = _job(outbox_db, _key("cli"), instance=instance, status="DEAD")

    args = _parser().parse_args(
        ["jobs", "list", "--instance", instance, "--state", "dead", "--last", "1h"]
    )
    assert args.func(args) == 0
    assert "page 1 of 1, 1 jobs" in capsys.readouterr().out

    args = _parser().parse_args(
        ["jobs", "reprocess", str(job_id), "--reason", "retry", "--by", "bob", "--wait", "0"]
    )
    assert args.func(args) == 1
    assert "still pending" in capsys.readouterr().out

    args = _parser().parse_args(
        ["jobs", "cancel", str(job_id), "--reason", "stop", "--by", "bob", "--wait", "0"]
    )
    assert args.func(args) == 1
    assert _commands(outbox_db, job_id) == [
        ("reprocess", "retry", "bob"),
        ("cancel", "stop", "bob"),
    ]
