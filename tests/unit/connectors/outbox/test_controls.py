"""Controls' validation: bad input raises InvalidControl before any SQL is sent."""

from __future__ import annotations

import math
from typing import Any

import pytest

from connectors.outbox import controls
from connectors.outbox.controls import InvalidControl


class _Untouchable:
    """A connection that fails the test if anything is executed on it."""

    def cursor(self) -> Any:
        raise AssertionError("SQL was sent for invalid input")

    def execute(self, *args: object) -> Any:
        raise AssertionError("SQL was sent for invalid input")


CONN: Any = _Untouchable()


@pytest.mark.parametrize(
    "write",
    [
        controls.pause_instance,
        controls.resume_instance,
        controls.pause_campaign,
        controls.resume_campaign,
    ],
)
@pytest.mark.parametrize(
    ("target", "reason", "actor", "message"),
    [
        ("", "why", "alice", "is required"),
        ("  ", "why", "alice", "is required"),
        ("shop-1", "", "alice", "reason is required"),
        ("shop-1", " \n", "alice", "reason is required"),
        ("shop-1", "why", "", "actor is required"),
        ("shop-1", "why", None, "actor is required"),
        (None, "why", "alice", "is required"),
    ],
)
def test_invalid_controls_write_nothing(
    write: Any, target: Any, reason: Any, actor: Any, message: str
) -> None:
    with pytest.raises(InvalidControl, match=message):
        write(CONN, target, reason=reason, actor=actor)


def test_the_target_is_named_in_the_error() -> None:
    with pytest.raises(InvalidControl, match="^instance is required$"):
        controls.pause_instance(CONN, "", reason="x", actor="y")
    with pytest.raises(InvalidControl, match=r"^campaign \(purpose\) is required$"):
        controls.pause_campaign(CONN, "", reason="x", actor="y")


@pytest.mark.parametrize("max_age_s", [-1, math.nan, math.inf, "60", True, None])
def test_should_hold_needs_a_number_of_seconds(max_age_s: Any) -> None:
    with pytest.raises(InvalidControl, match="max_age_s must be a number of seconds"):
        controls.should_hold(CONN, "shop-1", max_age_s)


def test_backlog_filters_must_not_be_blank() -> None:
    with pytest.raises(InvalidControl, match="instance is required"):
        controls.backlog(CONN, instance=" ")
    with pytest.raises(InvalidControl, match="purpose is required"):
        controls.backlog(CONN, purpose="")


async def test_async_flavours_validate_the_same_way() -> None:
    with pytest.raises(InvalidControl, match="reason is required"):
        await controls.pause_instance_async(CONN, "shop-1", reason="", actor="alice")
    with pytest.raises(InvalidControl, match="actor is required"):
        await controls.resume_campaign_async(CONN, "promo", reason="ok", actor=" ")
    with pytest.raises(InvalidControl, match="max_age_s"):
        await controls.should_hold_async(CONN, "shop-1", -5)
