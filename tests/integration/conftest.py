"""Fixtures that start real processes: PostgreSQL, Tansu, the simulator, relays and workers.

Each test module gets its own cluster and broker (isolation by construction);
a missing binary fails the run with the reason, never a silent skip.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from connectors.devstack import PostgresCluster
from connectors.migrate import migrate


@pytest.fixture(scope="module")
def outbox_db() -> Iterator[str]:
    """A throwaway PostgreSQL with the outbox schema; yields its DSN."""
    with PostgresCluster() as cluster:
        dsn = cluster.dsn()
        migrate(dsn)
        yield dsn


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.2
) -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def count_rows(dsn: str, sql: str, params: tuple[object, ...] = ()) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
        return int(row[0]) if row else 0
