"""Fixtures that start real processes: PostgreSQL, Tansu, the simulator, relays and workers.

Each test module gets its own cluster and broker (isolation by construction);
a missing binary fails the run with the reason, never a silent skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.outbox.migrate import migrate
from devtools.devstack import PostgresCluster


@pytest.fixture(scope="module")
def outbox_db() -> Iterator[str]:
    """A throwaway PostgreSQL with the outbox schema; yields its DSN."""
    with PostgresCluster() as cluster:
        dsn = cluster.dsn()
        migrate(dsn)
        yield dsn
