"""Instance pauses for configuration faults, and the permanent-error streak (sans-IO, fake time)."""

from __future__ import annotations

import logging

import pytest

from streams.instance_pauses import InstancePauses, PermanentStreaks
from streams.kernel.errors import (
    GatewayMisconfigured,
    InstanceUnavailableError,
    PermanentGatewayError,
)

T0 = 1_800_000_000.0


def wrong_route() -> GatewayMisconfigured:
    return GatewayMisconfigured(
        "zapapi: HTTP 404: 404: Not Found (no such route, check ZAP_API_URL)",
        setting="ZAP_API_URL",
        status_code=404,
    )


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_configuration_fault_is_one_error_for_every_instance_it_pauses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    pauses = InstancePauses(2.0, reminder_interval_s=300.0)
    for n, instance in enumerate(["inst-00", "inst-01", "inst-02", "inst-03"]):
        pauses.pause(instance, wrong_route(), T0 + n, parked=False)
        pauses.pause(instance, wrong_route(), T0 + n + 0.5, parked=True)  # a second send
    errors, warnings = lines(caplog, logging.ERROR), lines(caplog, logging.WARNING)
    print(f"errors {errors}\nwarnings {warnings}")
    assert len(errors) == 1 and "check ZAP_API_URL" in errors[0]
    assert "instance inst-00 paused" in errors[0]
    assert len(warnings) == 3 and all("paused too" in w for w in warnings)
    assert sorted(pauses.paused_instances()) == ["inst-00", "inst-01", "inst-02", "inst-03"]
    # Reminders come from the first instance only.
    caplog.clear()
    for instance in pauses.paused_instances():
        pauses.pause(instance, wrong_route(), T0 + 301, parked=True)
    reminders = lines(caplog, logging.ERROR)
    assert len(reminders) == 1 and "inst-00 still paused" in reminders[0]


def test_the_start_check_note_is_the_one_error_and_later_pauses_only_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    pauses = InstancePauses(2.0)
    pauses.note_misconfigured(wrong_route(), T0, where="zapapi, placeholder instance p")
    pauses.note_misconfigured(wrong_route(), T0 + 1, where="zapapi, placeholder instance p")
    pauses.pause("inst-00", wrong_route(), T0 + 2, parked=False)
    assert len(lines(caplog, logging.ERROR)) == 1
    assert "gateway check" in lines(caplog, logging.ERROR)[0]
    assert pauses.misconfigured() == ["ZAP_API_URL"]
    # The instance's probe gets through: the fault is over, one INFO line.
    assert pauses.resume("inst-00", T0 + 10)
    assert pauses.misconfigured() == []
    assert any("configuration fault" in m and "over" in m for m in lines(caplog, logging.INFO))


def test_a_fault_no_instance_holds_ends_at_the_first_success() -> None:
    pauses = InstancePauses(2.0)
    pauses.note_misconfigured(wrong_route(), T0, where="placeholder")
    assert not pauses.resume("inst-00", T0 + 1)  # inst-00 was never paused, but it works
    assert pauses.misconfigured() == []


def test_probes_of_a_configuration_fault_back_off_to_the_cap() -> None:
    pauses = InstancePauses(2.0, probe_max_s=10.0)
    pauses.pause("inst-00", wrong_route(), T0, parked=False)
    now, gaps = T0, []
    for _ in range(6):
        due = pauses.next_probe_at("inst-00", now)
        assert not pauses.claim_probe("inst-00", due - 0.01)
        assert pauses.claim_probe("inst-00", due)
        gaps.append(due - now)
        now = due
    assert gaps == [2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_probes_of_a_refused_key_keep_their_interval() -> None:
    pauses = InstancePauses(2.0, probe_max_s=10.0)
    pauses.pause("inst-00", InstanceUnavailableError("401", status_code=401), T0, parked=False)
    now, gaps = T0, []
    for _ in range(4):
        due = pauses.next_probe_at("inst-00", now)
        assert pauses.claim_probe("inst-00", due)
        gaps.append(due - now)
        now = due
    assert gaps == [2.0, 2.0, 2.0, 2.0]


# --- the permanent-error streak ---------------------------------------------------------


def schema_error(n: int = 0) -> PermanentGatewayError:
    # The same error for every message (digits differ: a request id).
    return PermanentGatewayError(
        f"zapapi: HTTP 422: unsupported body (request {n})", status_code=422
    )


def test_the_same_error_for_n_different_recipients_trips_at_the_nth() -> None:
    streaks = PermanentStreaks(5, setting="ZAP_API_URL")
    verdicts = [streaks.observe("i", f"55119000000{n:02d}", schema_error(n)) for n in range(7)]
    assert [v is not None for v in verdicts] == [False] * 4 + [True] * 3
    tripped = verdicts[4]
    assert isinstance(tripped, GatewayMisconfigured)
    assert tripped.setting == "ZAP_API_URL" and "5 sends in a row" in str(tripped)
    assert "55119" not in str(tripped)


def test_the_same_recipient_counts_once() -> None:
    streaks = PermanentStreaks(3)
    for _ in range(10):
        assert streaks.observe("i", "5511900000001", schema_error()) is None


def test_errors_about_the_recipient_never_trip_and_end_the_streak() -> None:
    streaks = PermanentStreaks(3)
    invalid = PermanentGatewayError("zapapi: HTTP 400: invalid recipient", status_code=400)
    for n in range(10):
        assert streaks.observe("i", f"551190000{n:04d}", invalid) is None
    assert streaks.observe("i", "a", schema_error()) is None
    assert streaks.observe("i", "b", schema_error()) is None
    assert streaks.observe("i", "c", invalid) is None  # ends it
    assert streaks.observe("i", "d", schema_error()) is None
    assert streaks.observe("i", "e", schema_error()) is None
    assert streaks.observe("i", "f", schema_error()) is not None


def test_a_success_or_another_error_ends_the_streak_and_instances_are_apart() -> None:
    streaks = PermanentStreaks(2)
    other = PermanentGatewayError("zapapi: HTTP 409: conflict", status_code=409)
    assert streaks.observe("i", "a", schema_error()) is None
    streaks.reset("i")
    assert streaks.observe("i", "b", schema_error()) is None
    assert streaks.observe("j", "c", schema_error()) is None  # another instance's streak
    assert streaks.observe("i", "d", other) is None
    assert streaks.observe("i", "e", schema_error()) is None
    assert streaks.observe("i", "f", schema_error()) is not None
    # Tripped: the same error trips again (a probe), another one releases it.
    assert streaks.observe("i", "f", schema_error()) is not None
    assert streaks.observe("i", "g", other) is None


def test_threshold_zero_switches_it_off() -> None:
    streaks = PermanentStreaks(0)
    assert all(streaks.observe("i", str(n), schema_error()) is None for n in range(20))
