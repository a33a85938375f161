"""The worker's start-up gateway check: what each probe outcome logs and pauses (no I/O)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from streams.gateway_check import PLACEHOLDER_INSTANCE, GatewayStartCheck
from streams.instance_pauses import InstancePauses
from streams.kernel.errors import (
    GatewayError,
    GatewayMisconfigured,
    InstanceUnavailableError,
    ListingUnreadable,
    TransientGatewayError,
)

T0 = 1_800_000_000.0


class ProbedGateway:
    """Only what the check calls: ``probe_configuration``, scripted per instance."""

    name = "scripted"
    credential_setting = "ZAP_TOKEN"

    def __init__(self, outcomes: dict[str, str | GatewayError | None]) -> None:
        self.outcomes = outcomes
        """``None``: never answers."""
        self.asked: list[str] = []

    async def probe_configuration(self, instance_id: str) -> str:
        self.asked.append(instance_id)
        outcome = self.outcomes[instance_id]
        if outcome is None:
            await asyncio.Event().wait()
        if isinstance(outcome, GatewayError):
            raise outcome
        assert isinstance(outcome, str)
        return outcome


def wrong_route() -> GatewayMisconfigured:
    return GatewayMisconfigured(
        "zapapi: HTTP 404 (no such route, check ZAP_API_URL)",
        setting="ZAP_API_URL",
        status_code=404,
    )


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def run(
    gateway: ProbedGateway, instances: list[str], timeout_s: float = 1.0
) -> tuple[GatewayStartCheck, InstancePauses]:
    pauses = InstancePauses(2.0)
    check = GatewayStartCheck(
        gateway,  # type: ignore[arg-type]
        pauses,
        instances,
        timeout_s=timeout_s,
        clock=lambda: T0,
    )
    await check.start()
    await check.start()  # idempotent: asked once
    return check, pauses


async def test_a_wrong_route_on_the_placeholder_is_one_error_and_pauses_nothing_yet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = ProbedGateway({PLACEHOLDER_INSTANCE: wrong_route()})
    _, pauses = await run(gateway, [])
    assert gateway.asked == [PLACEHOLDER_INSTANCE]
    (line,) = errors(caplog)
    assert "ZAP_API_URL" in line
    assert pauses.paused_instances() == [] and pauses.misconfigured() == ["ZAP_API_URL"]
    # The first real send meeting it pauses its instance without another ERROR.
    pauses.pause("inst-00", wrong_route(), T0 + 1, parked=False)
    assert len(errors(caplog)) == 1


async def test_a_wrong_route_pauses_the_configured_instances_with_one_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = ProbedGateway({f"inst-{n}": wrong_route() for n in range(4)} | {"ok": "fine"})
    _, pauses = await run(gateway, ["inst-0", "inst-1", "inst-2", "inst-3", "ok"])
    assert sorted(pauses.paused_instances()) == ["inst-0", "inst-1", "inst-2", "inst-3"]
    (line,) = errors(caplog)
    assert "ZAP_API_URL" in line


async def test_refused_credentials_pause_a_configured_instance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = InstanceUnavailableError("zapapi: HTTP 401 (refused credentials)", status_code=401)
    _, pauses = await run(
        ProbedGateway({"inst-0": refused, "inst-1": "fine"}), ["inst-0", "inst-1"]
    )
    assert pauses.paused_instances() == ["inst-0"]
    _, placeholder = await run(ProbedGateway({PLACEHOLDER_INSTANCE: refused}), [])
    assert placeholder.paused_instances() == []
    assert any("ZAP_TOKEN" in line for line in errors(caplog))


async def test_an_unreadable_listing_is_one_error_naming_the_setting_and_pauses_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unreadable = ListingUnreadable("stackzap: listing has no jobs array (top-level keys: x)")
    gateway = ProbedGateway({"a": unreadable, "b": unreadable, "c": "fine"})
    _, pauses = await run(gateway, ["a", "b", "c"])
    (line,) = errors(caplog)
    assert "ZAPSTREAM_STACKZAP_LISTING_FIELDS" in line and "2 instance(s)" in line
    assert pauses.paused_instances() == []


async def test_a_down_or_silent_gateway_is_one_warning_within_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = TransientGatewayError("zapapi: ClientConnectorError: refused")
    gateway = ProbedGateway({"a": down, "b": None})
    loop = asyncio.get_running_loop()
    started = loop.time()
    check, pauses = await run(gateway, ["a", "b"], timeout_s=0.2)
    elapsed = loop.time() - started
    assert elapsed < 1.0, f"the check took {elapsed:.2f}s, bound 0.2s"
    assert errors(caplog) == [] and pauses.paused_instances() == []
    assert isinstance(check.outcomes["b"], TimeoutError)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 instance(s)" in warnings[0]


async def test_an_instance_first_seen_later_is_probed_once_in_the_background(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    unreadable = ListingUnreadable("scripted: listing has no array of jobs (top-level keys: x)")
    gateway = ProbedGateway({"a": "ok", "late": unreadable, "later": unreadable, "fine": "ok"})
    check, _ = await run(gateway, ["a"])
    assert gateway.asked == ["a"]
    for _ in range(5):  # every intent of the instance tells the check; one probe
        check.first_sight("late")
        check.first_sight("a")  # asked at start: not again
    await asyncio.wait_for(asyncio.gather(*check._tasks), 1.0)
    assert gateway.asked == ["a", "late"]
    assert isinstance(check.outcomes["late"], ListingUnreadable)
    assert len([e for e in errors(caplog) if "ZAPSTREAM_STACKZAP_LISTING_FIELDS" in e]) == 1
    check.first_sight("later")  # the same fault on another instance: no second alarm
    await asyncio.wait_for(asyncio.gather(*check._tasks), 1.0)
    assert isinstance(check.outcomes["later"], ListingUnreadable)
    assert len(errors(caplog)) == 1
    assert any("unreadable for instance(s) later too" in m for m in caplog.messages)
    check.first_sight("fine")
    await check.stop()  # a probe still running is cancelled, never left behind
    assert not check._tasks
