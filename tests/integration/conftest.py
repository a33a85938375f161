"""Fixtures that start real processes: PostgreSQL, Kafka, the simulator, relays and workers.

Each test module gets its own PostgreSQL cluster. Apache Kafka is started once per test
process (:mod:`devtools.shared_broker`): each pipeline works in its own topic namespace
(``ZAPSTREAM_KAFKA_TOPIC_PREFIX``, :attr:`LocalPipeline.topics`), and a test that kills or
restarts its broker gets its own (``own_broker=True``). A missing binary fails the run
with the reason, never a silent skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.outbox.migrate import migrate
from devtools import shared_broker
from devtools.devstack import PostgresCluster


@pytest.fixture(scope="session", autouse=True)
def one_kafka_broker_per_process() -> Iterator[None]:
    """Pipelines of this process share one Apache Kafka node (started on first use)."""
    shared_broker.share_one_broker()
    yield
    shared_broker.share_one_broker(False)
    shared_broker.stop_shared_broker()


@pytest.fixture(scope="module")
def outbox_db() -> Iterator[str]:
    """A throwaway PostgreSQL with the outbox schema; yields its DSN."""
    with PostgresCluster() as cluster:
        dsn = cluster.dsn()
        migrate(dsn)
        yield dsn
