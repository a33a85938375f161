"""FailureLog: one line when a failure class starts, rate-limited summaries, one when it ends."""

from __future__ import annotations

import logging

import pytest

from streams.failure_log import FailureLog, error_class
from streams.kernel.errors import InstanceUnavailableError, TransientGatewayError


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
    failures.record_success("i", 1100.0)  # 39 s after the last failure: not quiet yet
    assert len(caplog.records) == 3 and failures.open_classes("i") == {"transient": 51}
    failures.record_success("i", 1121.0)
    assert "transient failures ended after 61s: 51 in all" in caplog.messages[-1]
    assert failures.open_classes("i") == {} and failures.open_classes("j") == {"transient": 1}


def test_a_flapping_gateway_is_one_outage(caplog: pytest.LogCaptureFixture) -> None:
    """Fail, succeed, fail ... within the quiet period: one start line, summaries at most
    every 5 minutes, one end line after the quiet period (issue: 40 starts in 6 s)."""
    caplog.set_level(logging.INFO, logger="streams.failure_log")
    failures = FailureLog(summary_interval_s=300, quiet_period_s=60)
    refused = TransientGatewayError("stackzap: ConnectError: connection refused")
    now = 1000.0
    for _ in range(1200):  # 20 minutes: a failure and a success every second, 4 instances
        for instance in ("a", "b", "c", "d"):
            failures.record(instance, refused, now)
            failures.record_success(instance, now + 0.5)
        now += 1.0
    started = [m for m in caplog.messages if "failures started" in m]
    ended = [m for m in caplog.messages if "failures ended" in m]
    summaries = [m for m in caplog.messages if "more transient failures" in m]
    assert len(started) == 4 and ended == []
    assert len(summaries) == 4 * 3  # at 300, 600, 900 s of each instance's outage
    last_failure = now - 1.0
    for instance in ("a", "b", "c", "d"):
        failures.record_success(instance, last_failure + 59.0)
    assert [m for m in caplog.messages if "failures ended" in m] == []
    for instance in ("a", "b", "c", "d"):
        failures.record_success(instance, last_failure + 60.0)
    ended = [m for m in caplog.messages if "failures ended" in m]
    assert len(ended) == 4 and all("1200 in all" in m for m in ended)
    failures.record("a", refused, now + 61.0)  # after the end: a new outage, a new line
    assert len([m for m in caplog.messages if "failures started" in m]) == 5


def test_classes() -> None:
    assert error_class(InstanceUnavailableError("401", status_code=401)) == "instance"
    assert error_class(TransientGatewayError("503")) == "transient"
