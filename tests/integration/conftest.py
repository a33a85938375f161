"""Fixtures that start real processes: PostgreSQL, Kafka, the simulator, relays and workers.

Each test module gets its own PostgreSQL cluster. Apache Kafka is started once per test
process (:mod:`devtools.stack.shared_broker`): each pipeline works in its own topic namespace
(``ZAPSTREAM_KAFKA_TOPIC_PREFIX``, :attr:`LocalPipeline.topics`), and a test that kills or
restarts its broker gets its own (``own_broker=True``). A missing binary fails the run
with the reason, never a silent skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.outbox.migrate import migrate
from devtools.stack import shared_broker
from devtools.stack.devstack import PostgresCluster
from devtools.stack.local_pipeline import LocalPipeline

LOG_TAIL_LINES = 40
"""Lines of each process's log a failed test's report carries."""


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used a pipeline reports the tail of each of its processes' logs
    (worker, relay, sink, simulator): a pipeline's directory goes with it, and a failure in
    CI is read from its output alone."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    for pipeline in {id(v): v for v in funcargs.values() if isinstance(v, LocalPipeline)}.values():
        for proc in pipeline.processes:
            try:
                tail = proc.log_tail(LOG_TAIL_LINES)
            except OSError as exc:
                tail = f"(no log: {exc})"
            report.sections.append((f"log tail: {proc.name}", tail))
