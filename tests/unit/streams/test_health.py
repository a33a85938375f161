"""The worker's readiness decision."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streams.health import not_ready_reason


def _app(
    *,
    started: bool = True,
    flow_active: bool = True,
    rebalancing: bool = False,
    in_recovery: bool = False,
) -> SimpleNamespace:
    consumer = SimpleNamespace(started=started, flow_active=flow_active)
    return SimpleNamespace(consumer=consumer, rebalancing=rebalancing, in_recovery=in_recovery)


def test_a_running_worker_is_ready() -> None:
    assert not_ready_reason(_app()) is None


@pytest.mark.parametrize(
    ("app", "reason"),
    [
        (_app(started=False), "starting"),
        (_app(rebalancing=True), "rebalancing"),
        (_app(in_recovery=True), "recovering tables"),
        (_app(flow_active=False), "flow stopped"),
    ],
)
def test_not_ready_while_not_processing(app: SimpleNamespace, reason: str) -> None:
    assert not_ready_reason(app) == reason
