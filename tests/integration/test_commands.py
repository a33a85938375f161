"""Commands on a real PostgreSQL: outbox_commands, its trigger, the API and `zapstream jobs`.

Tests that need the worker's answer run :class:`InProcessWorker`: the real
:class:`~streams.job_processor.JobProcessor` against a scripted gateway, fed
from ``outbox_commands`` through the relay's own row conversion
(:func:`~connectors.cdc.outbox_rows.command_row_to_record`), its states written
through the state sink's own SQL (:func:`~connectors.sink.state_sink.apply_states`).
So every event a test sees is one the real worker writes, with its structured
outcome. The outbox article's own statements (:mod:`tests.integration.article_sql`) each
have a test here: what docs/guides/application.md says each does. The last tests run the
whole pipeline (relay, Faust worker, sink as subprocesses) for bulk reprocess and for how
fast ``jobs reprocess`` returns.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime as dt
import io
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Coroutine, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import errors
from psycopg.conninfo import make_conninfo

from connectors.cdc.outbox_rows import command_row_to_record, row_to_record
from connectors.ops.delivery_risk import delivery_risk
from connectors.ops.jobs_cli import (
    add_jobs_parser,
    cancel_job,
    list_jobs,
    reprocess_job,
    reprocess_matching,
)
from connectors.ops.jobs_sql import fetch_events
from connectors.outbox.commands import (
    InvalidCommand,
    cancel,
    cancel_async,
    request_cancel_by_id,
    request_reprocess,
    request_reprocess_many,
)
from connectors.outbox.enqueue import enqueue
from connectors.outbox.migrate import ForeignOutboxTable, migrate
from connectors.sink.state_sink import apply_batch, apply_states
from devtools.stack.local_pipeline import LocalPipeline
from streams.job_processor import JobProcessor, Park, RetryPolicy
from streams.kernel.contract import (
    AttemptFinished,
    Command,
    CommandRequested,
    IntentCaptured,
    JobDead,
    StatusChanged,
)
from streams.kernel.errors import (
    PermanentGatewayError,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.kernel.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.kernel.state_machine import JobRef, transition
from tests.integration import article_sql
from tests.integration.support import Arrivals, count_rows, wait_for_status, wait_until

T = TypeVar("T")

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
                # As the state sink writes it: one version up (migration 0009 refuses
                # a status write that leaves state_version alone).
                "UPDATE outbox_jobs SET status = %s, attempts = 3, last_error = %s, "
                "state_version = state_version + 1 WHERE id = %s",
                (status, last_error, job_id),
            )
    return job_id


def _commands(dsn: str, job_id: int) -> list[tuple[str, str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT command, reason, actor FROM outbox_commands WHERE job_id = %s ORDER BY id",
            (job_id,),
        ).fetchall()
    return [(str(c), str(r), str(a)) for c, r, a in rows]


def _command_ids(dsn: str, job_id: int) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id FROM outbox_commands WHERE job_id = %s ORDER BY id", (job_id,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def _event_rows(dsn: str, job_id: int) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            tuple(r)
            for r in conn.execute(
                "SELECT from_status, to_status, actor, outcome, command_id "
                "FROM outbox_job_events WHERE job_id = %s ORDER BY version",
                (job_id,),
            )
        ]


def _status(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM outbox_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _make_invalid(dsn: str, job_id: int, reason: str) -> None:
    """What the state sink does with the relay's IntentRejected for the job."""

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await apply_batch(conn, [], [(job_id, reason)])

    asyncio.run(write())


def _reprocess_command(dsn: str, job_id: int) -> CommandRequested:
    with psycopg.connect(dsn) as conn:
        command_id = request_reprocess(conn, job_id, "first try", "ops:first")
        conn.commit()
        row = _row(conn, "outbox_commands", command_id)
    record = command_row_to_record(row, lsn="0/1", committed_at=None)
    assert isinstance(record, CommandRequested)
    return record


# --- the real worker's logic, in process ------------------------------------------------


class ScriptedGateway:
    """A gateway whose answers the test scripts; what it accepted is kept."""

    name = "scripted"

    def __init__(self) -> None:
        self.outcomes: list[SendAccepted | Exception] = []
        self.sent: list[TextMessage] = []
        self.cancel_outcome = CancelOutcome.CANCELLED

    async def send_text(self, message: TextMessage) -> SendAccepted:
        self.sent.append(message)
        outcome = self.outcomes.pop(0) if self.outcomes else _accepted(len(self.sent))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def list_for_reconciliation(self, instance_id: str, **_: Any) -> list[ListedJob] | None:
        return None  # like the ZAP API: no listing, so an unknown outcome stays UNCERTAIN

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        return self.cancel_outcome

    async def probe_configuration(self, instance_id: str) -> str:
        return "scripted: nothing to check"

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _accepted(n: int) -> SendAccepted:
    from streams.kernel.contract import JobStatus

    return SendAccepted(f"g-{n}", "queued", JobStatus.ACCEPTED)


class _SinkStore:
    """The worker's job table; every state also goes through the state sink's SQL."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.states: dict[int, StatusChanged] = {}
        self._conn: psycopg.AsyncConnection[Any] | None = None

    def get(self, job_id: int) -> StatusChanged | None:
        return self.states.get(job_id)

    async def put(self, state: StatusChanged, partition: int) -> None:
        if self._conn is None:
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        self.states[state.job_id] = state
        await apply_states(self._conn, [state])

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


class _Publisher:
    def __init__(self) -> None:
        self.dead: list[JobDead] = []

    async def attempt_finished(self, record: AttemptFinished, key: bytes) -> Awaitable[object]:
        return asyncio.sleep(0)

    async def job_dead(self, record: JobDead) -> None:
        self.dead.append(record)


def _row(conn: psycopg.Connection[Any], table: str, row_id: int) -> dict[str, str | None]:
    """The row as the relay sees it: every column as PostgreSQL's text output."""
    cur = conn.execute(f"SELECT * FROM {table} WHERE id = %s", (row_id,))  # noqa: S608
    names = [c.name for c in cur.description or ()]
    cur = conn.execute(
        f"SELECT {', '.join(f'{n}::text' for n in names)} FROM {table} WHERE id = %s",  # noqa: S608
        (row_id,),
    )
    values = cur.fetchone()
    assert values is not None
    return dict(zip(names, values, strict=True))


class InProcessWorker:
    """The real JobProcessor on its own event loop thread, fed the way the pipeline feeds it.

    :meth:`send` hands it a job's intent (as the relay would), retrying parked
    jobs at once (as the parking timer would, without the wait); :meth:`serve`
    applies every new ``outbox_commands`` row (as relay and agent would) until
    the test ends.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.gateway = ScriptedGateway()
        self.store = _SinkStore(dsn)
        self.processor = JobProcessor(
            self.gateway,
            self.store,
            _Publisher(),
            RetryPolicy(schedule_s=(0.01,), jitter=0.0),
            listing_authoritative=False,
        )
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._serving: concurrent.futures.Future[None] | None = None
        self._stop_serving = threading.Event()
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT coalesce(max(id), 0) FROM outbox_commands").fetchone()
        self._last_command = int(row[0]) if row else 0
        self.commands_handled = 0

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def intent(self, job_id: int) -> IntentCaptured:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            record = row_to_record(_row(conn, "outbox_jobs", job_id), lsn="0/1", committed_at=None)
        assert isinstance(record, IntentCaptured), record
        return record

    def send(self, job_id: int, *outcomes: SendAccepted | Exception) -> str:
        """Run the job's intent through the processor with these gateway answers; its status."""
        self.gateway.outcomes.extend(outcomes)
        intent = self.intent(job_id)
        outcome = self.call(self.processor.on_intent(intent, 0))
        while isinstance(outcome, Park):  # the parking timer, without the wait
            outcome = self.call(self.processor.on_intent(intent, 0))
        state = self.store.get(job_id)
        assert state is not None
        return state.status

    def apply(self, command: CommandRequested) -> None:
        """Deliver one command now, as the pipeline would: once (:meth:`serve` starts after it)."""
        self.call(self._handle(command))
        self._last_command = max(self._last_command, command.command_id)

    async def _handle(self, command: CommandRequested) -> None:
        if command.command == Command.CANCEL:
            await self.processor.on_cancel(command, 0)
        else:
            assert command.intent is not None
            intent = IntentCaptured.from_dict(command.intent)
            outcome = await self.processor.on_intent(intent, 0, reprocess=command)
            while isinstance(outcome, Park):
                outcome = await self.processor.on_intent(intent, 0)
        self.commands_handled += 1

    async def _serve(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            while not self._stop_serving.is_set():
                cur = await conn.execute(
                    "SELECT id FROM outbox_commands WHERE id > %s ORDER BY id",
                    (self._last_command,),
                )
                for (command_id,) in await cur.fetchall():
                    with psycopg.connect(self.dsn, autocommit=True) as sync:
                        row = _row(sync, "outbox_commands", command_id)
                    record = command_row_to_record(row, lsn="0/1", committed_at=None)
                    assert isinstance(record, CommandRequested), record
                    await self._handle(record)
                    self._last_command = command_id
                await asyncio.sleep(0.05)

    def serve(self) -> None:
        """Apply every command written from now on, in the background."""
        self._serving = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)

    def stop(self) -> None:
        if self._serving is not None:
            self._stop_serving.set()
            self._serving.result(timeout=10)  # raises what the loop raised, if anything
        self.call(self.store.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def worker(outbox_db: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(outbox_db)
    yield w
    w.stop()


def _history_event(
    dsn: str, job_id: int, states: list[tuple[str, str | None]], *, actor: str = "worker"
) -> None:
    """Write a job's history through the real state machine and the sink's SQL (setup only)."""
    from streams.kernel.contract import JobStatus

    with psycopg.connect(dsn, autocommit=True) as conn:
        key, instance = conn.execute(
            "SELECT idempotency_key, instance_id FROM outbox_jobs WHERE id = %s", (job_id,)
        ).fetchone() or ("", "")
    ref = JobRef(job_id, str(key), str(instance), NORMALIZED)
    current: StatusChanged | None = None
    records = []
    for status, reason in states:
        current = transition(ref, current, JobStatus(status), reason=reason, actor=actor)
        records.append(current)

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await apply_states(conn, records)

    asyncio.run(write())


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
    assert "55*******4321" in text
    assert "12************5486@g.us" in text
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


def test_jobs_cancel_reports_cancelled(outbox_db: str, worker: InProcessWorker) -> None:
    job_id = _job(outbox_db, _key("cdone"))
    worker.serve()
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
    assert "CANCELLED: job" in out.getvalue() and "by alice" in out.getvalue()
    assert _event_rows(outbox_db, job_id) == [
        ("PENDING", "CANCELLED", "alice", "cancelled", _command_ids(outbox_db, job_id)[0])
    ]


def test_jobs_cancel_reports_the_workers_refusal(outbox_db: str, worker: InProcessWorker) -> None:
    job_id = _job(outbox_db, _key("crefused"))
    assert worker.send(job_id) == "ACCEPTED"
    worker.gateway.cancel_outcome = CancelOutcome.REFUSED
    worker.serve()
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
    assert code == 1, out.getvalue()
    assert "NOT CANCELLED (cancel_refused)" in out.getvalue()
    assert "the gateway already sent it" in out.getvalue()
    assert _status(outbox_db, job_id) == "ACCEPTED"


def test_jobs_cancel_reports_a_gateway_that_cannot_cancel(
    outbox_db: str, worker: InProcessWorker
) -> None:
    job_id = _job(outbox_db, _key("cunsupported"))
    assert worker.send(job_id) == "ACCEPTED"
    worker.gateway.cancel_outcome = CancelOutcome.UNSUPPORTED
    worker.serve()
    out = io.StringIO()
    code = cancel_job(
        outbox_db, job_id, reason="r", actor="alice", wait_s=10, out=out, poll_interval_s=0.05
    )
    assert code == 1, out.getvalue()
    assert "NOT CANCELLED (cancel_unsupported)" in out.getvalue()


def test_jobs_cancel_of_an_invalid_job_is_refused_here(outbox_db: str) -> None:
    job_id = _job(outbox_db, _key("cinvalid"))
    _make_invalid(outbox_db, job_id, "payload is a JSON list, not an object")
    out = io.StringIO()
    assert cancel_job(outbox_db, job_id, reason="r", actor="alice", wait_s=5, out=out) == 2
    assert "it is INVALID" in out.getvalue() and "JSON list" in out.getvalue()
    assert _commands(outbox_db, job_id) == []


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


def test_jobs_reprocess_warns_and_requires_yes_for_an_uncertain_job(
    outbox_db: str, worker: InProcessWorker
) -> None:
    job_id = _job(outbox_db, _key("runcertain"))
    timeout = UncertainGatewayError("read timeout after the request was sent")
    assert worker.send(job_id, timeout) == "UNCERTAIN"

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


def test_jobs_reprocess_warns_when_an_earlier_attempt_ended_uncertain(outbox_db: str) -> None:
    # UNCERTAIN, reprocessed, then DEAD: the first attempt may still have been delivered.
    job_id = _job(outbox_db, _key("rearlier"))
    _history_event(
        outbox_db,
        job_id,
        [
            ("ATTEMPTING", None),
            ("UNCERTAIN", "outcome unknown (read timeout)"),
            ("ATTEMPTING", None),
            ("DEAD", "gave up after 2 attempts: 503"),
        ],
    )
    out = io.StringIO()
    assert reprocess_job(outbox_db, job_id, reason="r", actor="alice", wait_s=0, out=out) == 2
    assert "WARNING: an earlier attempt of this job ended UNCERTAIN" in out.getvalue()
    assert "TWICE" in out.getvalue() and "--yes" in out.getvalue()
    assert _commands(outbox_db, job_id) == []


def test_jobs_reprocess_never_reads_reason_text(outbox_db: str) -> None:
    # A permanent refusal is definitive whatever words its reason holds.
    job_id = _job(outbox_db, _key("rreason"))
    _history_event(
        outbox_db,
        job_id,
        [("ATTEMPTING", None), ("FAILED", "400: recipient uncertain")],
    )
    out = io.StringIO()
    assert reprocess_job(outbox_db, job_id, reason="r", actor="alice", wait_s=0, out=out) == 1
    assert "WARNING" not in out.getvalue() and "still pending" in out.getvalue()
    assert _commands(outbox_db, job_id) == [("reprocess", "r", "alice")]


def test_jobs_reprocess_of_a_dead_job_returns_once_it_is_accepted(
    outbox_db: str, worker: InProcessWorker
) -> None:
    job_id = _job(outbox_db, _key("rdead"))
    unavailable = TransientGatewayError("503 service unavailable")
    assert worker.send(job_id, unavailable, unavailable, unavailable) == "DEAD"
    worker.serve()
    out = io.StringIO()
    started = time.monotonic()
    code = reprocess_job(
        outbox_db,
        job_id,
        reason="outage over",
        actor="alice",
        wait_s=20,
        out=out,
        poll_interval_s=0.05,
    )
    took = time.monotonic() - started
    text = out.getvalue()
    print(f"jobs reprocess returned after {took:.2f}s (wait 20s)")
    assert code == 0, text
    assert took < 10, text
    assert "WARNING" not in text
    assert "RETRY_WAIT -> ATTEMPTING" in text and "ATTEMPTING -> DEAD" in text  # the history
    assert "[reprocessed] reprocess requested: outage over" in text
    assert f"job {job_id} is now ACCEPTED" in text and "still in progress" not in text
    assert _commands(outbox_db, job_id) == [("reprocess", "outage over", "alice")]
    assert [m.reference for m in worker.gateway.sent][-1] == f"{job_id}-4"


def test_jobs_reprocess_reports_the_workers_refusal_by_its_outcome(
    outbox_db: str, worker: InProcessWorker
) -> None:
    job_id = _job(outbox_db, _key("rrefused"))
    assert worker.send(job_id, PermanentGatewayError("400 bad recipient")) == "FAILED"
    # The worker has moved on (an earlier reprocess sent it) but PostgreSQL has not
    # caught up yet: the CLI lets the command through and the worker refuses it.
    assert worker.send(job_id) == "FAILED"  # a redelivery of a settled job sends nothing
    # Delivered through apply(), not by hand: serve() must not deliver this command a
    # second time, as its answer (a note, one version up) would overwrite the hand edit
    # below with the worker's ACCEPTED before the CLI reads the row.
    worker.apply(_reprocess_command(outbox_db, job_id))
    assert _status(outbox_db, job_id) == "ACCEPTED"
    assert worker.commands_handled == 1
    # The edit is final: apply() awaited every state write, and nothing will replay one.
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox_jobs SET status = 'FAILED', state_version = state_version + 1 "
            "WHERE id = %s",
            (job_id,),
        )
    worker.serve()
    out = io.StringIO()
    code = reprocess_job(
        outbox_db, job_id, reason="again", actor="bob", wait_s=10, out=out, poll_interval_s=0.05
    )
    assert code == 1, out.getvalue()
    assert "NOT REPROCESSED (reprocess_refused)" in out.getvalue()
    assert "job is ACCEPTED" in out.getvalue()
    # The CLI's command, and only it, reached the worker after the hand edit.
    wait_until(lambda: worker.commands_handled >= 2, 5, "the worker to finish the command")
    assert worker.commands_handled == 2, worker.commands_handled


def test_jobs_reprocess_of_an_invalid_job_is_refused_here(outbox_db: str) -> None:
    job_id = _job(outbox_db, _key("rinvalid"))
    _make_invalid(outbox_db, job_id, "payload is a JSON list, not an object")
    out = io.StringIO()
    assert reprocess_job(outbox_db, job_id, reason="r", actor="alice", wait_s=0, out=out) == 2
    assert "it is INVALID" in out.getvalue() and "malformed" not in out.getvalue()
    assert "Fix the data and enqueue a new job" in out.getvalue()
    assert _commands(outbox_db, job_id) == []


# --- zapstream jobs reprocess by filter ---------------------------------------------------------


def _dead_jobs(outbox_db: str, worker: InProcessWorker, instance: str, n: int) -> list[int]:
    ids = []
    for i in range(n):
        job_id = _job(outbox_db, _key(f"bulk{i}"), instance=instance)
        error = PermanentGatewayError("400 template rejected")
        assert worker.send(job_id, error) == "FAILED"
        ids.append(job_id)
    return ids


def test_bulk_reprocess_dry_run_counts_and_changes_nothing(
    outbox_db: str, worker: InProcessWorker
) -> None:
    instance = _key("bulkdry")
    failed = _dead_jobs(outbox_db, worker, instance, 3)
    _job(outbox_db, _key("bulk-pending"), instance=instance)
    out = io.StringIO()
    code = reprocess_matching(
        outbox_db,
        states=["FAILED"],
        instance=instance,
        since=dt.datetime.now(dt.UTC) - dt.timedelta(hours=2),
        reason="template fixed",
        actor="ops:ana",
        dry_run=True,
        out=out,
    )
    text = out.getvalue()
    print(text)
    assert code == 0
    assert "3 jobs match (state FAILED, instance" in text
    assert "dry run: 3 jobs would be reprocessed; nothing was requested" in text
    assert "55*******4321" in text and NORMALIZED not in text and TEXT not in text
    assert all(_commands(outbox_db, job_id) == [] for job_id in failed)


def test_bulk_reprocess_refuses_states_that_cannot_be_reprocessed(outbox_db: str) -> None:
    for state in ("PENDING", "ACCEPTED", "INVALID"):
        out = io.StringIO()
        code = reprocess_matching(
            outbox_db, states=[state], reason="r", actor="a", dry_run=True, out=out
        )
        assert code == 2
        assert f"refusing to reprocess {state} jobs" in out.getvalue()
        assert "only DEAD, FAILED, UNCERTAIN jobs" in out.getvalue()


def test_bulk_reprocess_needs_yes_above_the_threshold_and_for_uncertain_jobs(
    outbox_db: str, worker: InProcessWorker
) -> None:
    instance = _key("bulkyes")
    failed = _dead_jobs(outbox_db, worker, instance, 11)
    out = io.StringIO()
    code = reprocess_matching(
        outbox_db, states=["FAILED"], instance=instance, reason="r", actor="a", out=out
    )
    assert code == 2 and "re-run with --yes" in out.getvalue()
    assert all(_commands(outbox_db, job_id) == [] for job_id in failed)
    uncertain = _job(outbox_db, _key("bulk-uncertain"), instance=instance)
    assert worker.send(uncertain, UncertainGatewayError("reset mid-response")) == "UNCERTAIN"
    out = io.StringIO()
    code = reprocess_matching(
        outbox_db, states=["uncertain"], instance=instance, reason="r", actor="a", out=out
    )
    assert code == 2 and "TWICE" in out.getvalue() and "--yes" in out.getvalue()
    assert _commands(outbox_db, uncertain) == []


def test_bulk_reprocess_needs_yes_for_a_job_whose_history_was_uncertain(outbox_db: str) -> None:
    instance = _key("bulkhistory")
    calm = _job(outbox_db, _key("bulk-calm"), instance=instance)
    _history_event(outbox_db, calm, [("ATTEMPTING", None), ("DEAD", "503")])
    earlier = _job(outbox_db, _key("bulk-earlier"), instance=instance)
    _history_event(
        outbox_db,
        earlier,
        [("ATTEMPTING", None), ("UNCERTAIN", None), ("ATTEMPTING", None), ("DEAD", "503")],
    )
    out = io.StringIO()
    code = reprocess_matching(
        outbox_db, states=["DEAD"], instance=instance, reason="r", actor="a", out=out
    )
    text = out.getvalue()
    assert code == 2, text
    assert "2 jobs match" in text and "TWICE" in text and "--yes" in text
    assert f"may already have been DELIVERED by the gateway: {earlier}." in text
    assert _commands(outbox_db, calm) == [] and _commands(outbox_db, earlier) == []


def test_bulk_reprocess_writes_one_command_per_job_and_the_worker_resends_each_once(
    outbox_db: str, worker: InProcessWorker
) -> None:
    instance = _key("bulkrun")
    failed = _dead_jobs(outbox_db, worker, instance, 4)
    worker.serve()
    out = io.StringIO()
    code = reprocess_matching(
        outbox_db,
        states=["FAILED", "DEAD"],
        instance=instance,
        reason="template fixed",
        actor="ops:ana",
        limit=3,
        out=out,
    )
    text = out.getvalue()
    print(text)
    assert code == 0, text
    assert "4 jobs match" in text and "only the oldest 3" in text
    assert "reprocess requested for 3 jobs" in text
    wait_until(
        lambda: [_status(outbox_db, j) for j in failed] == ["ACCEPTED"] * 3 + ["FAILED"],
        10,
        "the 3 oldest jobs ACCEPTED",
    )
    assert [_commands(outbox_db, j) for j in failed] == [
        [("reprocess", "template fixed", "ops:ana")]
    ] * 3 + [[]]
    resent = [m.reference for m in worker.gateway.sent if m.reference.endswith("-2")]
    assert sorted(resent) == sorted(f"{j}-2" for j in failed[:3])
    # The same filter again finds only the fourth: the others are ACCEPTED now.
    out = io.StringIO()
    reprocess_matching(
        outbox_db,
        states=["FAILED"],
        instance=instance,
        reason="r",
        actor="a",
        dry_run=True,
        out=out,
    )
    assert "1 jobs match" in out.getvalue()


def test_request_reprocess_many_skips_jobs_that_are_not_reprocessable(outbox_db: str) -> None:
    failed = _job(outbox_db, _key("many-failed"), status="FAILED")
    pending = _job(outbox_db, _key("many-pending"))
    with psycopg.connect(outbox_db) as conn:
        ids = request_reprocess_many(conn, [failed, pending, 999_999_999], "why", "ops")
        assert request_reprocess_many(conn, [], "why", "ops") == []
        with pytest.raises(InvalidCommand, match="reason is required"):
            request_reprocess_many(conn, [failed], " ", "ops")
        conn.commit()
    assert len(ids) == 1
    assert _commands(outbox_db, failed) == [("reprocess", "why", "ops")]
    assert _commands(outbox_db, pending) == []


# --- the outbox article's statements (tests/integration/article_sql.py) -------------------------
#
# docs/guides/application.md lists each statement with what it does here; these tests hold
# each row of that table to what the database does. The reprocess end to end, on the real
# pipeline and as an application's role, is in test_commands_e2e.py.


def _article_job(dsn: str, key: str) -> int:
    """A job enqueued by the article's own INSERT."""
    payload = json.dumps({"type": "text", "to": RECIPIENT, "text": TEXT})
    with psycopg.connect(dsn) as conn:
        conn.execute(article_sql.INSERT, ("shop-article", payload, key))
        row = conn.execute(
            "SELECT id FROM outbox_jobs WHERE idempotency_key = %s", (key,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _article_columns(dsn: str, job_id: int) -> tuple[Any, ...]:
    """What the article's statements write, and the sink's version."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, attempts, next_retry_at, last_error, sent_at, state_version "
            "FROM outbox_jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def _refused(dsn: str, statement: str, params: tuple[object, ...]) -> psycopg.Error:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(statement.encode(), params)
    return caught.value


def test_article_table_first_migrate_refuses_in_one_line_and_the_named_steps_adopt_it(
    outbox_db: str,
) -> None:
    name = f"article_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        # On zapstream's schema the article's CREATE TABLE fails: the table is there.
        with pytest.raises(errors.DuplicateTable, match='"outbox_jobs" already exists'):
            conn.execute(article_sql.CREATE_TABLE.encode())
        conn.execute(f"CREATE DATABASE {name}".encode())
    dsn = make_conninfo(outbox_db, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(article_sql.CREATE_TABLE.encode())
        conn.execute(article_sql.CREATE_INDEXES.encode())
        conn.execute(
            article_sql.INSERT.encode(),
            ("shop-1", json.dumps({"type": "text", "to": RECIPIENT, "text": TEXT}), "order-1"),
        )
        conn.execute(
            "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, status) "
            "VALUES ('shop-1', '{}', 'order-0', 'SENT')"
        )

    with pytest.raises(ForeignOutboxTable) as refused:
        migrate(dsn)
    line = str(refused.value)
    print(f"zapstream db migrate on the article's table: {line}")
    assert "\n" not in line
    assert "not zapstream's" in line
    assert "ALTER TABLE outbox_jobs SET SCHEMA article_outbox" in line
    with psycopg.connect(dsn, autocommit=True) as conn:
        created = conn.execute("SELECT to_regclass('outbox_commands')").fetchone()
        assert created == (None,), "nothing of zapstream's was created"
        # The steps the line names, then the copy docs/guides/application.md gives.
        conn.execute("CREATE SCHEMA article_outbox")
        conn.execute("ALTER TABLE outbox_jobs SET SCHEMA article_outbox")
    assert "0001_outbox" in migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        copied = conn.execute(
            """INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, max_attempts)
               SELECT instance_id, payload, coalesce(idempotency_key, 'article-' || id),
                      max_attempts
               FROM article_outbox.outbox_jobs WHERE status = 'PENDING' ORDER BY id
               RETURNING idempotency_key, status, conversation_key"""
        ).fetchall()
        # The article's indexes on zapstream's table: created, and harmless.
        conn.execute(article_sql.CREATE_INDEXES.encode())
    assert copied == [("order-1", "PENDING", NORMALIZED)]


def test_article_worker_loop_claims_nothing_and_its_writes_are_refused_naming_zapstream(
    outbox_db: str,
) -> None:
    job_id = _article_job(outbox_db, _key("article-loop"))
    with psycopg.connect(outbox_db) as conn:
        claimed = [int(r[0]) for r in conn.execute(article_sql.CLAIM.encode())]
    assert job_id not in claimed, "zapstream's worker sends it; next_retry_at is not set"
    before = _article_columns(outbox_db, job_id)

    for statement, params in [
        (article_sql.MARK_SENT, (job_id,)),
        (article_sql.MARK_FAILED, ("PENDING", 1, "timeout", job_id)),
        (article_sql.MARK_FAILED, ("DEAD", 5, "timeout", job_id)),
    ]:
        error = _refused(outbox_db, statement, params)
        assert isinstance(error, errors.InsufficientPrivilege), error
        message = error.diag.message_primary or ""
        assert f"job {job_id} is sent by zapstream's worker" in message
        assert "it would send twice" in message and "`zapstream worker`" in message
    assert _article_columns(outbox_db, job_id) == before

    # What the trigger leaves alone: a write of next_retry_at only (rescheduling).
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        conn.execute("UPDATE outbox_jobs SET next_retry_at = %s WHERE id = %s", (later, job_id))
    assert _article_columns(outbox_db, job_id)[2] == later


def test_article_idempotency_select_sees_zapstreams_sent_state_and_the_key_refuses_a_second_row(
    outbox_db: str,
) -> None:
    key = _key("article-idem")
    job_id = _article_job(outbox_db, key)
    _history_event(outbox_db, job_id, [("ATTEMPTING", None), ("ACCEPTED", None)])
    # The article's worker would now mark it SENT over zapstream's state: refused.
    assert isinstance(
        _refused(outbox_db, article_sql.MARK_SENT, (job_id,)), errors.InsufficientPrivilege
    )
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        assert conn.execute(article_sql.IDEMPOTENCY, (key,)).fetchall() == [("ACCEPTED",)]
        with pytest.raises(errors.UniqueViolation):
            conn.execute(article_sql.INSERT.encode(), ("shop-article", "{}", key))


def test_article_stuck_query_counts_waiting_jobs_and_not_a_dead_job_reprocessed_by_sql(
    outbox_db: str,
) -> None:
    def stuck() -> int:
        return count_rows(outbox_db, article_sql.STUCK)

    def dead() -> int:
        return count_rows(outbox_db, article_sql.DEAD_ALERT)

    waiting = _article_job(outbox_db, _key("article-waiting"))
    gave_up = _article_job(outbox_db, _key("article-gave-up"))
    _history_event(outbox_db, gave_up, [("ATTEMPTING", None), ("DEAD", "503 five times")])
    stuck_before, dead_before = stuck(), dead()
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox_jobs SET created_at = now() - interval '20 minutes' WHERE id = ANY(%s)",
            ([waiting, gave_up],),
        )
        conn.execute(article_sql.REPROCESS.encode(), (gave_up,))
    # The reprocessed job is not a PENDING row nobody will ever send (as it was before
    # migration 0009): it stays DEAD until the worker takes its command up.
    assert stuck() == stuck_before + 1
    assert dead() == dead_before
    assert [c[0] for c in _commands(outbox_db, gave_up)] == ["reprocess"]


def test_article_reprocess_of_a_dead_job_is_an_audited_command_the_worker_answers(
    outbox_db: str, worker: InProcessWorker
) -> None:
    job_id = _article_job(outbox_db, _key("article-dead"))
    unavailable = TransientGatewayError("503 service unavailable")
    assert worker.send(job_id, *[unavailable] * 5) == "DEAD"
    before = _article_columns(outbox_db, job_id)
    notices: list[str] = []
    with psycopg.connect(outbox_db) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        role = str((conn.execute("SELECT current_user").fetchone() or ("",))[0])
        conn.execute("SET LOCAL zapstream.reason = 'gateway fixed, per the article'")
        cur = conn.execute(article_sql.REPROCESS.encode(), (job_id,))
        assert cur.rowcount == 1
    # The row keeps its settled columns until the worker moves it; a command was written.
    assert _article_columns(outbox_db, job_id) == before
    assert _commands(outbox_db, job_id) == [("reprocess", "gateway fixed, per the article", role)]
    (command_id,) = _command_ids(outbox_db, job_id)
    assert any(f"job {job_id} reprocess requested (command {command_id}" in n for n in notices)

    worker.serve()
    wait_until(lambda: _status(outbox_db, job_id) == "ACCEPTED", 10, "the reprocessed job")
    answers = [e for e in _event_rows(outbox_db, job_id) if e[4] == command_id]
    assert answers == [("DEAD", "DEAD", role, "reprocessed", command_id)]
    assert [m.reference for m in worker.gateway.sent][-1] == f"{job_id}-6"
    assert len([m for m in worker.gateway.sent if m.reference.startswith(f"{job_id}-")]) == 6

    # Without zapstream.reason the command says it came from SQL.
    failed = _article_job(outbox_db, _key("article-failed"))
    assert worker.send(failed, PermanentGatewayError("400 bad template")) == "FAILED"
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        conn.execute(article_sql.REPROCESS.encode(), (failed,))
    ((_, reason, actor),) = _commands(outbox_db, failed)
    assert reason.startswith("reprocess by SQL") and actor == role


def test_article_reprocess_is_refused_where_jobs_reprocess_refuses_or_asks_for_yes(
    outbox_db: str, worker: InProcessWorker
) -> None:
    uncertain = _article_job(outbox_db, _key("article-uncertain"))
    assert worker.send(uncertain, UncertainGatewayError("read timeout")) == "UNCERTAIN"
    earlier = _article_job(outbox_db, _key("article-earlier"))
    _history_event(
        outbox_db,
        earlier,
        [("ATTEMPTING", None), ("UNCERTAIN", None), ("ATTEMPTING", None), ("DEAD", "503")],
    )
    for job_id, why in [
        (uncertain, "this job's last attempt is UNCERTAIN"),
        (earlier, "an earlier attempt of this job ended UNCERTAIN"),
    ]:
        error = _refused(outbox_db, article_sql.REPROCESS, (job_id,))
        assert isinstance(error, errors.ObjectNotInPrerequisiteState), error
        message = error.diag.message_primary or ""
        assert f"job {job_id} may already have been delivered" in message and why in message
        assert f"`zapstream jobs reprocess {job_id} --reason ... --by ... --yes`" in message

    accepted = _article_job(outbox_db, _key("article-accepted"))
    _history_event(outbox_db, accepted, [("ATTEMPTING", None), ("ACCEPTED", None)])
    invalid = _article_job(outbox_db, _key("article-invalid"))
    _make_invalid(outbox_db, invalid, "payload is a JSON list, not an object")
    for job_id, status in [(accepted, "ACCEPTED"), (invalid, "INVALID")]:
        error = _refused(outbox_db, article_sql.REPROCESS, (job_id,))
        assert isinstance(error, errors.ObjectNotInPrerequisiteState), error
        message = error.diag.message_primary or ""
        assert f"job {job_id} is {status}, and only DEAD, FAILED or UNCERTAIN" in message
        assert "new idempotency_key" in message

    waiting = _article_job(outbox_db, _key("article-retry"))
    _history_event(outbox_db, waiting, [("ATTEMPTING", None), ("RETRY_WAIT", "503")])
    error = _refused(outbox_db, article_sql.REPROCESS, (waiting,))
    assert isinstance(error, errors.InsufficientPrivilege), error
    assert "retries it on its own" in (error.diag.message_primary or "")

    dead = _article_job(outbox_db, _key("article-fix"))
    _history_event(outbox_db, dead, [("ATTEMPTING", None), ("DEAD", "503")])
    error = _refused(
        outbox_db,
        "UPDATE outbox_jobs SET status = 'PENDING', payload = '{}' WHERE id = %s",
        (dead,),
    )
    assert "in an UPDATE of their own" in (error.diag.message_primary or "")

    for job_id in (uncertain, earlier, accepted, invalid, waiting, dead):
        assert _commands(outbox_db, job_id) == []
    assert [_status(outbox_db, j) for j in (uncertain, earlier, accepted, invalid, waiting)] == [
        "UNCERTAIN", "DEAD", "ACCEPTED", "INVALID", "RETRY_WAIT",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "history",
    [
        ["ATTEMPTING", "DEAD"],
        ["ATTEMPTING", "UNCERTAIN"],
        ["ATTEMPTING", "UNCERTAIN", "ATTEMPTING", "DEAD"],
        ["ATTEMPTING", "REVIEW", "FAILED"],
        ["ATTEMPTING", "ACCEPTED", "DELIVERED", "FAILED"],
        ["ATTEMPTING", "ACCEPTED", "FAILED"],
        ["ATTEMPTING", "ATTEMPTING", "RETRY_WAIT", "ATTEMPTING", "DEAD"],
        ["ATTEMPTING"],
    ],
)
def test_sql_delivery_risk_agrees_with_the_clis_rule(outbox_db: str, history: list[str]) -> None:
    job_id = _article_job(outbox_db, _key("article-risk"))
    _history_event(outbox_db, job_id, [(status, None) for status in history])
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        (in_sql,) = conn.execute("SELECT zapstream_delivery_risk(%s)", (job_id,)).fetchone() or (
            None,
        )
        risk = delivery_risk(_status(outbox_db, job_id), fetch_events(conn, job_id))
    assert in_sql == (risk.explanation if risk is not None else None)


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


# --- on the whole pipeline: relay, Faust worker and sink as real processes ------------------------


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    env = {
        "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true",
        "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[0.3]",
        "ZAPSTREAM_WORKER_RETRY_SCAN_INTERVAL_S": "0.2",
        # These tests make jobs DEAD on purpose (every send a 5xx); five in a row would trip
        # the instance breaker, and reprocessed jobs would then wait for its 30 s probe. The
        # breaker has its own tests (test_faults_gateway.py, test_flow_control.py).
        "ZAPSTREAM_WORKER_BREAKER_FAILURES": "0",
    }
    with LocalPipeline(partitions=2, worker_env=env) as p:
        p.start_relay()
        p.start_worker()
        yield p


def _cli(pipeline: LocalPipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", "jobs", *args],
        env={**os.environ, **pipeline.env()},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _dead_on_the_pipeline(pipeline: LocalPipeline, instance: str, n: int) -> list[tuple[int, str]]:
    """``n`` jobs that went DEAD on the real worker (every send got a 5xx); (id, text)."""
    run = uuid.uuid4().hex[:8]
    jobs = []
    pipeline.sim_config(error_rate=1.0)
    try:
        with psycopg.connect(pipeline.dsn) as conn:
            for i in range(n):
                key = f"{run}-{i}"
                text = f"m [{key}:0]"
                job_id = enqueue(
                    conn,
                    instance_id=instance,
                    to=f"55119000003{i:02d}",
                    text=text,
                    idempotency_key=key,
                    max_attempts=1,
                )
                jobs.append((job_id, text))
            conn.commit()
        wait_for_status(pipeline.dsn, [f"{run}-{i}" for i in range(n)], "DEAD", 60)
    finally:
        pipeline.sim_config(error_rate=0.0)
    return jobs


def test_pipeline_jobs_reprocess_returns_as_soon_as_the_job_is_accepted(
    pipeline: LocalPipeline,
) -> None:
    [(job_id, text)] = _dead_on_the_pipeline(pipeline, "shop-fast", 1)
    started = time.monotonic()
    result = _cli(
        pipeline,
        "reprocess",
        str(job_id),
        "--reason",
        "gateway fixed",
        "--by",
        "ops:cy",
        "--wait",
        "60",
    )
    took = time.monotonic() - started
    print(f"jobs reprocess (real worker) returned after {took:.1f}s of --wait 60")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"job {job_id} is now ACCEPTED" in result.stdout
    assert "still in progress" not in result.stdout
    assert "[reprocessed]" in result.stdout
    assert took < 30, result.stdout
    sent = [m for m in Arrivals(pipeline).refresh() if m["text"] == text]
    assert len(sent) == 1 and str(sent[0]["reference"]).startswith(f"{job_id}-2-")


def test_pipeline_bulk_reprocess_dry_run_then_resends_each_once(pipeline: LocalPipeline) -> None:
    instance = f"shop-bulk-{uuid.uuid4().hex[:6]}"
    jobs = _dead_on_the_pipeline(pipeline, instance, 5)
    common = [
        "--state",
        "DEAD",
        "--instance",
        instance,
        "--since",
        "1h",
        "--reason",
        "gateway fixed",
        "--by",
        "ops:dee",
    ]
    dry = _cli(pipeline, "reprocess", *common, "--dry-run")
    print(dry.stdout)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "5 jobs match" in dry.stdout and "nothing was requested" in dry.stdout
    assert (
        count_rows(
            pipeline.dsn,
            "SELECT count(*) FROM outbox_commands WHERE job_id = ANY(%s)",
            ([j for j, _ in jobs],),
        )
        == 0
    )
    real = _cli(pipeline, "reprocess", *common)
    print(real.stdout)
    assert real.returncode == 0, real.stdout + real.stderr
    assert "reprocess requested for 5 jobs" in real.stdout
    wait_until(
        lambda: (
            count_rows(
                pipeline.dsn,
                "SELECT count(*) FROM outbox_jobs WHERE id = ANY(%s) AND status = 'ACCEPTED'",
                ([j for j, _ in jobs],),
            )
            == len(jobs)
        ),
        60,
        "every reprocessed job ACCEPTED",
    )
    texts = [m["text"] for m in Arrivals(pipeline).refresh()]
    counts = {text: texts.count(text) for _, text in jobs}
    print(
        f"bulk reprocess: requested 5, accepted {sum(1 for c in counts.values() if c)}, "
        f"duplicates {sum(c - 1 for c in counts.values() if c > 1)}"
    )
    assert counts == {text: 1 for _, text in jobs}
