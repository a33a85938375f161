"""One PostgreSQL role per component, on a real cluster and the real pipeline.

The pipeline runs with ``per_component_roles``: the relay, worker, sink and webhook each
connect as a login role of their own (a member of one ``zapstream_*`` group role, the
relay's with REPLICATION), never as the superuser. A message is delivered and read, its
states land in ``outbox_jobs``; the application, console, operator and prune roles run
their own functions; and each role is refused what its component never does
(``InsufficientPrivilege``), while ``zapstream doctor`` says which role holds too much.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors as pg_errors

from connectors.ops.actions import Action, request_one
from connectors.ops.job_filter import JobFilter
from connectors.ops.jobs_sql import fetch_history, fetch_page
from connectors.outbox import commands, controls
from connectors.outbox.enqueue import enqueue
from connectors.outbox.retention import prune
from devtools.stack.local_pipeline import LOGIN_ROLES, LocalPipeline
from tests.integration import article_sql
from tests.integration.support import wait_for_status, zapstream

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=2, per_component_roles=True) as p:
        p.start_relay()
        p.start_worker()
        p.start_webhook()
        yield p


def _job_id(dsn: str, key: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT id FROM outbox_jobs WHERE idempotency_key = %s", (key,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _connected_roles(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT usename FROM pg_stat_activity WHERE usename = ANY(%s)",
            (list(LOGIN_ROLES.values()),),
        ).fetchall()
    return {str(r[0]) for r in rows}


def test_each_component_on_its_own_role_delivers_and_writes_states_back(
    pipeline: LocalPipeline,
) -> None:
    key = f"{uuid.uuid4().hex[:8]}-roles"
    with psycopg.connect(pipeline.component_dsn("app")) as conn:
        enqueue(conn, instance_id="shop", to="5511900000401", text="hi", idempotency_key=key)
    # Sent by the worker, receipts through the webhook, states by the sink: READ.
    wait_for_status(pipeline.dsn, [key], "READ", 90)
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        moves = [
            r[0]
            for r in conn.execute(
                "SELECT e.to_status FROM outbox_job_events e JOIN outbox_jobs j ON j.id = e.job_id "
                "WHERE j.idempotency_key = %s ORDER BY e.version",
                (key,),
            )
        ]
        streaming = conn.execute("SELECT usename FROM pg_stat_replication").fetchall()
    assert moves[0] == "ATTEMPTING" and moves[-1] == "READ"
    assert [r[0] for r in streaming] == [LOGIN_ROLES["relay"]]
    wanted = {LOGIN_ROLES[c] for c in ("relay", "sink", "webhook")}
    assert wanted <= _connected_roles(pipeline.dsn)
    assert "postgres" not in {
        r for r in _connected_roles(pipeline.dsn) if r not in LOGIN_ROLES.values()
    }


def test_the_application_console_operator_and_prune_roles_run_their_own_sql(
    pipeline: LocalPipeline,
) -> None:
    app, console = pipeline.component_dsn("app"), pipeline.component_dsn("console")
    operator, prune_dsn = pipeline.component_dsn("operator"), pipeline.component_dsn("prune")
    keys = [f"{uuid.uuid4().hex[:8]}-own-{i}" for i in range(2)]
    with psycopg.connect(app) as conn:
        ids = [
            enqueue(conn, instance_id="shop", to=f"551190000050{i}", text="x", idempotency_key=key)
            for i, key in enumerate(keys)
        ]
    with psycopg.connect(app) as conn:
        # A second enqueue of a key finds the first job (the app reads outbox_jobs.id).
        again = enqueue(
            conn, instance_id="shop", to="5511900000500", text="x", idempotency_key=keys[0]
        )
        assert again == ids[0]
        controls.backlog(conn)
        controls.should_hold(conn, "shop", 60.0)
        controls.pause_campaign(conn, "roles-test", reason="copy review", actor="app")
        controls.resume_campaign(conn, "roles-test", reason="approved", actor="app")
    wait_for_status(pipeline.dsn, keys, "READ", 90)
    with psycopg.connect(app) as conn:
        commands.cancel(conn, keys[0], "customer cancelled")
    with psycopg.connect(console, autocommit=True) as conn:
        page = fetch_page(conn, JobFilter(), page=1, page_size=20)
        assert page.total >= 2
        assert fetch_history(conn, job_id=_job_id(pipeline.dsn, keys[1])) is not None
        request_one(
            conn, Action.CANCEL, _job_id(pipeline.dsn, keys[1]), reason="console", actor="alice"
        )
    with psycopg.connect(operator, autocommit=True) as conn:
        controls.pause_instance(conn, "shop-roles", reason="flagged", actor="bob")
        assert any(c.target == "shop-roles" for c in controls.controls(conn))
    # Prune as of a month from now: both READ jobs are settled and older than 7 days then.
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    result = prune(prune_dsn, older_than=dt.timedelta(days=7), now=later)
    assert result.jobs >= 2
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT payload ? 'pruned_at' FROM outbox_jobs WHERE idempotency_key = %s", (keys[1],)
        ).fetchone()
    assert row == (True,)


REFUSED: list[tuple[str, str]] = [
    ("webhook", "UPDATE outbox_jobs SET status = 'READ'"),
    ("webhook", "SELECT payload FROM outbox_jobs LIMIT 1"),
    (
        "webhook",
        "INSERT INTO outbox_job_events (job_id, to_status, version, actor) "
        "VALUES (1, 'READ', 99, 'x')",
    ),  # fmt: skip
    ("console", "ALTER TABLE outbox_jobs ADD COLUMN owned_by_console INT"),
    ("console", "UPDATE outbox_jobs SET status = 'READ'"),
    ("console", "DELETE FROM outbox_job_events"),
    (
        "console",
        "INSERT INTO outbox_controls (kind, target, action, reason, actor) "
        "VALUES ('instance', 'x', 'pause', 'r', 'a')",
    ),  # fmt: skip
    ("sink", "SELECT payload FROM outbox_jobs LIMIT 1"),
    ("sink", "DELETE FROM outbox_jobs"),
    ("sink", "UPDATE outbox_jobs SET payload = '{}'"),
    ("worker", "UPDATE outbox_jobs SET status = 'READ'"),
    ("worker", "SELECT payload FROM outbox_jobs LIMIT 1"),
    ("relay", "SELECT payload FROM outbox_jobs LIMIT 1"),
    (
        "relay",
        "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) "
        "VALUES ('x', '{}', 'relay-insert')",
    ),  # fmt: skip
    # The app may UPDATE the outbox article's columns (a trigger answers those writes,
    # test below), never state_version, which tells the sink's writes apart.
    ("app", "UPDATE outbox_jobs SET state_version = 99"),
    ("app", "UPDATE outbox_jobs SET payload = '{}'"),
    ("app", "DELETE FROM outbox_jobs"),
    ("operator", "UPDATE outbox_jobs SET status = 'READ'"),
    ("operator", "DROP TABLE outbox_controls"),
    ("prune", "UPDATE outbox_jobs SET status = 'READ'"),
    (
        "prune",
        "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) "
        "VALUES ('x', '{}', 'prune-insert')",
    ),  # fmt: skip
    ("prune", "TRUNCATE outbox_job_events"),
    ("webhook", "CREATE TABLE webhook_owned (x INT)"),
]


@pytest.mark.parametrize(("component", "statement"), REFUSED)
def test_a_component_role_is_refused_what_its_component_never_does(
    pipeline: LocalPipeline, component: str, statement: str
) -> None:
    with psycopg.connect(pipeline.component_dsn(component), autocommit=True) as conn:
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute(statement.encode())


def test_the_articles_updates_as_the_application_role_get_the_triggers_answer(
    pipeline: LocalPipeline,
) -> None:
    # Not a bare "permission denied": the app role may run the outbox article's UPDATEs,
    # and the trigger of migration 0009, running as that role, says what to do instead.
    key = f"{uuid.uuid4().hex[:8]}-article"
    with psycopg.connect(pipeline.component_dsn("app")) as conn:
        conn.execute(
            article_sql.INSERT.encode(),
            ("shop", '{"type":"text","to":"5511900000601","text":"hi"}', key),
        )
    wait_for_status(pipeline.dsn, [key], "READ", 90)
    job_id = _job_id(pipeline.dsn, key)
    with psycopg.connect(pipeline.component_dsn("app"), autocommit=True) as conn:
        assert conn.execute(article_sql.CLAIM.encode()).fetchall() == []
        with pytest.raises(pg_errors.InsufficientPrivilege, match="sent by zapstream's worker"):
            conn.execute(article_sql.MARK_SENT.encode(), (job_id,))
        with pytest.raises(pg_errors.InsufficientPrivilege, match="sent by zapstream's worker"):
            conn.execute(article_sql.MARK_FAILED.encode(), ("DEAD", 5, "timeout", job_id))
        with pytest.raises(pg_errors.ObjectNotInPrerequisiteState, match="is READ, and only"):
            conn.execute(article_sql.REPROCESS.encode(), (job_id,))
        (status,) = conn.execute(article_sql.IDEMPOTENCY.encode(), (key,)).fetchone() or ("",)
    assert status == "READ"


def _doctor(pipeline: LocalPipeline, dsn: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, **pipeline.env(), "ZAPSTREAM_DATABASE_URL": dsn}
    code, out, _ = zapstream(["doctor", "--timeout-s", "10", *args], env)
    return code, "\n".join(line for line in out.splitlines() if " role: " in line)


def test_doctor_passes_each_components_own_role_and_names_what_is_too_much(
    pipeline: LocalPipeline,
) -> None:
    for component in LOGIN_ROLES:
        _, lines = _doctor(pipeline, pipeline.component_dsn(component))
        assert lines.startswith("OK   role: "), (component, lines)
        assert "FAIL" not in lines, (component, lines)
    # The one all-powerful role of before, given to the webhook.
    _, lines = _doctor(pipeline, pipeline.dsn, "--component", "webhook")
    assert "FAIL role: postgres is a SUPERUSER" in lines
    # The relay's role used for the webhook: REPLICATION it must not have, columns it
    # must not read are missing... and the ones the webhook needs are missing.
    _, lines = _doctor(pipeline, pipeline.component_dsn("relay"), "--component", "webhook")
    assert (
        "has REPLICATION, which only the relay needs -> ALTER ROLE zs_relay NOREPLICATION" in lines
    )
    assert (
        "may not SELECT (id, instance_id, idempotency_key, conversation_key, gateway_job_id)"
        in lines
    )
    # A write grant the sink never needs.
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        conn.execute("GRANT DELETE ON outbox_jobs TO zapstream_sink")
    try:
        code, lines = _doctor(pipeline, pipeline.component_dsn("sink"))
    finally:
        with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
            conn.execute("REVOKE DELETE ON outbox_jobs FROM zapstream_sink")
    assert code == 1
    assert (
        "FAIL role: zs_sink may DELETE on outbox_jobs, a write the sink never does -> "
        "REVOKE DELETE ON outbox_jobs FROM zs_sink" in lines
    )
