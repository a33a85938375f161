"""``INSERT ... RETURNING id`` for the outbox's insert-only tables, sync and async.

Controls and opt-outs are rows an application or an operator appends (never updates):
both write one row and hand back its id, the same way.
"""

from __future__ import annotations

from typing import Any

import psycopg


def insert_returning_id(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> int:
    """Run ``sql`` (an ``INSERT ... RETURNING id``) in the caller's transaction; its id."""
    with conn.cursor() as cur:
        cur.execute(sql, params, prepare=False)
        row = cur.fetchone()
    assert row is not None  # INSERT ... RETURNING always returns the row
    return int(row[0])


async def insert_returning_id_async(
    conn: psycopg.AsyncConnection[Any], sql: str, params: tuple[Any, ...]
) -> int:
    """The async flavour of :func:`insert_returning_id`."""
    async with conn.cursor() as cur:
        await cur.execute(sql, params, prepare=False)
        row = await cur.fetchone()
    assert row is not None  # INSERT ... RETURNING always returns the row
    return int(row[0])
