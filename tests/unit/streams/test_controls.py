"""Operators' pauses: what they hold, and when a resume releases parked conversations."""

from __future__ import annotations

import dataclasses

from streams.controls import HOLD_S, Controls


@dataclasses.dataclass
class Ctl:
    kind: str
    target: str
    action: str
    reason: str = "ops ticket 12"
    actor: str = "ana"


def test_a_paused_instance_or_campaign_holds_its_messages_only() -> None:
    controls = Controls()
    controls.apply(Ctl("instance", "inst-1", "pause"), 100.0)
    controls.apply(Ctl("campaign", "black-friday", "pause"), 100.0)
    held = controls.held("inst-1", None)
    assert held is not None and held.describe() == "instance inst-1 paused by ana: ops ticket 12"
    assert controls.held("inst-2", "black-friday") is not None
    assert controls.held("inst-2", "otp") is None
    assert controls.held("inst-2", None) is None


def test_a_resume_releases_conversations_held_before_it_once() -> None:
    resumed: list[tuple[str, str]] = []
    controls = Controls(
        release_window_s=60, on_resume=lambda kind, target: resumed.append((kind, target))
    )
    controls.apply(Ctl("instance", "inst-1", "pause"), 100.0)
    held_due = 110.0 + HOLD_S  # parked at 110 while held
    assert not controls.released(held_due, 120.0)
    controls.apply(Ctl("instance", "inst-1", "resume"), 130.0)
    assert resumed == [("instance", "inst-1")]
    assert controls.held("inst-1", None) is None
    assert controls.released(held_due, 131.0)
    assert not controls.released(140.0 + HOLD_S, 141.0)  # parked after the resume
    assert not controls.released(held_due, 131.0 + 61)  # the window is over


def test_resume_of_something_never_paused_changes_nothing() -> None:
    resumed: list[tuple[str, str]] = []
    controls = Controls(on_resume=lambda kind, target: resumed.append((kind, target)))
    controls.apply(Ctl("campaign", "x", "resume"), 1.0)
    assert resumed == [] and not controls.released(HOLD_S, 2.0)
