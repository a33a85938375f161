"""The application's side through PgBouncer in transaction pooling mode; the relay refuses it.

A real PgBouncer 1.18 (Debian's, :mod:`devtools.stack.pgbouncer`) with ``pool_mode=transaction``
and 5 server connections stands in front of the pipeline's PostgreSQL, so 20 client
connections share 5 server connections and consecutive transactions of one client land on
different ones: a server-side prepared statement (psycopg prepares a query after its 5th run on
a connection) or any session state would fail here. The relay and the worker run as usual,
the relay connected directly; every message must reach the gateway simulator once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import os
import re
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from connectors.outbox.commands import cancel, cancel_async
from connectors.outbox.enqueue import enqueue, enqueue_async
from devtools.stack.delivery_audit import demo_key, demo_text
from devtools.stack.dev_runner import demo_recipient
from devtools.stack.local_pipeline import REPO_ROOT, LocalPipeline
from devtools.stack.pgbouncer import PgBouncer
from tests.integration.support import Arrivals, wait_for_status, zapstream

pytestmark = pytest.mark.integration

SYNC_CONNECTIONS = 7
ASYNC_CONNECTIONS = 7
SQL_CONNECTIONS = 6
PER_CONNECTION = 100
"""20 connections x 100 = 2,000 intents, each in a transaction of its own."""

_PLAIN_INSERT = (
    "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES (%s, %s, %s)"
)
"""The application guide's plain SQL statement ("Plain SQL, from any language")."""


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4) as p:
        p.start_relay()
        p.start_worker()
        yield p


@pytest.fixture(scope="module")
def pgbouncer(pipeline: LocalPipeline) -> Iterator[PgBouncer]:
    with PgBouncer(pipeline.postgres.port, pool_size=5) as bouncer:
        yield bouncer


def _intent(run: str, connection: int, seq: int) -> tuple[str, str, str, str]:
    """(instance, recipient, text, key): one conversation per connection, in commit order."""
    instance = f"inst-{connection % 4:02d}"
    key = demo_key(run, instance, connection, seq)
    return instance, demo_recipient(connection), demo_text(key), key


def _sync_api(dsn: str, run: str, connection: int) -> list[str]:
    """``enqueue`` on a connection with psycopg's defaults (it would prepare after 5 runs)."""
    keys = []
    with psycopg.connect(dsn) as conn:
        for seq in range(PER_CONNECTION):
            instance, to, text, key = _intent(run, connection, seq)
            with conn.transaction():
                enqueue(conn, instance_id=instance, to=to, text=text, idempotency_key=key)
            keys.append(key)
    return keys


def _plain_sql(dsn: str, run: str, connection: int) -> list[str]:
    """The guide's INSERT from the application's own code: it sets ``prepare_threshold=None``
    (docs/guides/application.md, "Through PgBouncer")."""
    keys = []
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        for seq in range(PER_CONNECTION):
            instance, to, text, key = _intent(run, connection, seq)
            with conn.transaction():
                payload = Jsonb({"type": "text", "to": to, "text": text})
                conn.execute(_PLAIN_INSERT, (instance, payload, key))
            keys.append(key)
    return keys


async def _async_api(dsn: str, run: str, connection: int) -> list[str]:
    keys = []
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for seq in range(PER_CONNECTION):
            instance, to, text, key = _intent(run, connection, seq)
            async with conn.transaction():
                await enqueue_async(
                    conn, instance_id=instance, to=to, text=text, idempotency_key=key
                )
            keys.append(key)
    return keys


async def _async_connections(dsn: str, run: str, first: int) -> list[str]:
    batches = await asyncio.gather(
        *(_async_api(dsn, run, first + i) for i in range(ASYNC_CONNECTIONS))
    )
    return [key for batch in batches for key in batch]


def test_2000_intents_from_20_pooled_connections_arrive_once(
    pipeline: LocalPipeline, pgbouncer: PgBouncer
) -> None:
    run = uuid.uuid4().hex[:8]
    dsn = pgbouncer.dsn()
    arrivals = Arrivals(pipeline)
    keys: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(SYNC_CONNECTIONS + SQL_CONNECTIONS + 1) as pool:
        futures = [pool.submit(_sync_api, dsn, run, c) for c in range(SYNC_CONNECTIONS)]
        futures += [
            pool.submit(_plain_sql, dsn, run, SYNC_CONNECTIONS + c) for c in range(SQL_CONNECTIONS)
        ]
        futures.append(
            pool.submit(
                asyncio.run, _async_connections(dsn, run, SYNC_CONNECTIONS + SQL_CONNECTIONS)
            )
        )
        for future in futures:
            keys.extend(future.result())
    expected = (SYNC_CONNECTIONS + ASYNC_CONNECTIONS + SQL_CONNECTIONS) * PER_CONNECTION
    assert len(set(keys)) == expected == 2000
    report = arrivals.wait_for(keys, timeout_s=120)
    print(report.summary())
    assert report.duplicate_count == 0, dict(list(report.duplicates.items())[:5])
    assert not report.order_violations, report.order_violations[:5]
    assert report.ok


def test_cancel_through_pgbouncer_stops_a_queued_message(
    pipeline: LocalPipeline, pgbouncer: PgBouncer
) -> None:
    run = uuid.uuid4().hex[:8]
    first, doomed, scheduled = f"{run}-first", f"{run}-doomed", f"{run}-later"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    pipeline.sim_config(latency_ms=1500)  # doomed waits behind first in its conversation
    try:
        with psycopg.connect(pgbouncer.dsn()) as conn:
            for key in (first, doomed):
                with conn.transaction():
                    enqueue(
                        conn, instance_id="shop", to="5511900000301", text=f"m [{key}:0]",
                        idempotency_key=key,
                    )  # fmt: skip
            with conn.transaction():
                enqueue(
                    conn, instance_id="shop", to="5511900000302", text=f"m [{scheduled}:0]",
                    idempotency_key=scheduled, send_at=later,
                )  # fmt: skip
            with conn.transaction():
                cancel(conn, doomed, "order cancelled by the customer")

        async def cancel_scheduled() -> None:
            async with await psycopg.AsyncConnection.connect(pgbouncer.dsn()) as aconn:
                async with aconn.transaction():
                    await cancel_async(aconn, scheduled, "appointment moved")

        asyncio.run(cancel_scheduled())
        wait_for_status(pipeline.dsn, [doomed, scheduled], "CANCELLED", 60)
        wait_for_status(pipeline.dsn, [first], "ACCEPTED", 60)
    finally:
        pipeline.sim_config(latency_ms=0)
    texts = [m["text"] for m in Arrivals(pipeline).refresh()]
    assert f"m [{first}:0]" in texts
    assert f"m [{doomed}:0]" not in texts and f"m [{scheduled}:0]" not in texts


def test_relay_pointed_at_pgbouncer_exits_2_naming_the_setting(
    pipeline: LocalPipeline, pgbouncer: PgBouncer
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
    env = {
        **env,
        "PYTHONPATH": str(REPO_ROOT),
        **pipeline.env(),
        "ZAPSTREAM_DATABASE_URL": pgbouncer.dsn(),
        "ZAPSTREAM_RELAY_SLOT": "zapstream_pooled",
    }
    try:
        code, _stdout, stderr = zapstream(["relay"], env, timeout_s=60)
    finally:
        # Whatever went through before the refusal (an ordinary connection may provision the
        # slot) is cleaned up.
        with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = 'zapstream_pooled'"
            )
    assert code == 2
    closing = stderr.strip().splitlines()[-1]
    assert closing.startswith("zapstream: relay cannot start:"), stderr
    assert "ZAPSTREAM_DATABASE_URL" in closing and "pooler" in closing, closing
    assert "replication connection cannot go through a pooler" in closing, closing
    # PgBouncer refuses the first connection that asks for what it cannot pool: the replication
    # connection, or, when the relay first checks its slot's record on an ordinary connection,
    # that connection's session settings (``options``).
    assert re.search(r"unsupported startup parameter: (replication|options)\b", closing), closing
    assert "postgresql://" not in stderr  # the DSN itself is never printed
