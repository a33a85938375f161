"""FailureLog: one line when a failure class starts, rate-limited summaries, one when it ends."""

from __future__ import annotations

import logging

import pytest

from streams.errors import InstanceUnavailableError, TransientGatewayError
from streams.failure_log import FailureLog, error_class


def test_one_line_per_class_then_summaries_then_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streams.failure_log")
    failures = FailureLog(summary_interval_s=60)
    refused = TransientGatewayError("stackzap: ConnectError: connection refused")
    for second in range(50):
        failures.record("i", refused, 1000.0 + second)
    assert len(caplog.records) == 1
    assert caplog.records[0].levelname == "WARNING"
    assert "gateway failures started (transient)" in caplog.records[0].getMessage()
    failures.record("i", refused, 1061.0)
    assert len(caplog.records) == 2 and "50 more transient failures" in caplog.messages[1]
    failures.record("j", refused, 1062.0)  # another instance has its own line
    assert len(caplog.records) == 3
    failures.record_success("i", 1100.0)
    assert "transient failures ended after 100s: 51 in all" in caplog.messages[-1]
    assert failures.open_classes("i") == {} and failures.open_classes("j") == {"transient": 1}


def test_classes() -> None:
    assert error_class(InstanceUnavailableError("401", status_code=401)) == "instance"
    assert error_class(TransientGatewayError("503")) == "transient"
