"""The scheduled release's loop: only while streaming, batch after batch until none is due."""

from __future__ import annotations

from typing import Any

import psycopg

from connectors.cdc import scheduled_release
from connectors.cdc.scheduled_release import ScheduledRelease


class _Cursor:
    def __init__(self, released: int) -> None:
        self.released = released

    async def fetchone(self) -> tuple[int]:
        return (self.released,)


class _Transaction:
    async def __aenter__(self) -> None: ...

    async def __aexit__(self, *exc: object) -> None: ...


class _Connection:
    """Answers each release statement with the next count of released rows."""

    def __init__(self, counts: list[int | Exception]) -> None:
        self.counts = counts
        self.batches: list[dict[str, Any]] = []
        self.closed = False

    def transaction(self) -> _Transaction:
        return _Transaction()

    async def execute(self, sql: str, params: dict[str, Any]) -> _Cursor:
        assert sql == "SELECT zapstream_release_due(%(batch)s)" == scheduled_release.RELEASE_SQL
        self.batches.append(params)
        count = self.counts.pop(0)
        if isinstance(count, Exception):
            raise count
        return _Cursor(count)

    async def close(self) -> None:
        self.closed = True

    def cancel_safe(self) -> None: ...


def _release(conn: _Connection, *, streaming: bool = True) -> ScheduledRelease:
    async def connect() -> psycopg.AsyncConnection[Any]:
        return conn  # type: ignore[return-value]

    return ScheduledRelease(
        "postgresql://unused", interval_s=0, batch=3, streaming=lambda: streaming, connect=connect
    )


async def test_a_tick_releases_one_batch_so_a_crowd_enters_at_a_batch_per_interval() -> None:
    conn = _Connection([3, 3, 1, 0])
    release = _release(conn)
    assert [await release.tick() for _ in range(4)] == [3, 3, 1, 0]
    assert [b["batch"] for b in conn.batches] == [3, 3, 3, 3]
    assert release.stats.released == 7 and release.stats.batches == 3
    assert "7 scheduled jobs released in 3 batches" in release.summary()


async def test_a_standby_relay_releases_nothing() -> None:
    conn = _Connection([3])
    assert await _release(conn, streaming=False).tick() == 0
    assert conn.batches == []


async def test_postgresql_away_ends_the_tick_and_the_next_one_tries_again() -> None:
    conn = _Connection([psycopg.OperationalError("connection refused"), 2])
    release = _release(conn)
    assert await release.tick() == 0
    assert await release.tick() == 2
