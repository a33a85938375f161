"""The operator-actions core: its policy, its plans and how it reads the worker's answers."""

from __future__ import annotations

import datetime as dt

import pytest

from connectors.ops.actions import (
    BULK_CONFIRM_ABOVE,
    BULK_TARGETS,
    Action,
    Answer,
    BulkPlan,
    Plan,
    bulk_refused,
    offered,
    refused_here,
    settled,
)
from connectors.ops.delivery_risk import DeliveryRisk
from connectors.ops.job_filter import JobFilter
from connectors.ops.jobs_sql import Job, JobEvent
from streams.kernel.contract import JobStatus

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
S = JobStatus


def _event(
    event_id: int,
    version: int,
    from_status: str,
    to_status: str,
    outcome: str | None = None,
    command_id: int | None = None,
) -> JobEvent:
    return JobEvent(event_id, version, from_status, to_status, "w", None, NOW, outcome, command_id)


# --- how the worker's answers are read (moved from test_jobs_cli) ---------------------------


def test_reprocess_settles_on_the_move_after_its_answer_whatever_the_ids() -> None:
    # The sink of an older release inserted a batch's events in reverse order: ids
    # no longer follow versions. Versions decide.
    history = [
        _event(1, 1, "PENDING", "ATTEMPTING"),
        _event(2, 2, "ATTEMPTING", "DEAD"),
        _event(9, 3, "DEAD", "DEAD", "reprocessed", 7),
        _event(8, 4, "DEAD", "ATTEMPTING"),
        _event(7, 5, "ATTEMPTING", "ACCEPTED"),
    ]
    events = sorted(history, key=lambda e: e.version)
    assert settled(Action.REPROCESS, Answer(7, events))
    assert [e.version for e in Answer(7, events).followed] == [3, 4, 5]
    assert not settled(Action.REPROCESS, Answer(7, events[:4]))  # still ATTEMPTING
    assert not settled(Action.REPROCESS, Answer(8, events))  # another command: not answered
    assert Answer(7, events).status == "ACCEPTED" and not Answer(7, events).in_progress
    assert Answer(7, events[:4]).in_progress


def test_reprocess_refusal_settles_at_once_and_other_commands_answers_are_ignored() -> None:
    events = [
        _event(1, 1, "PENDING", "FAILED"),
        _event(2, 2, "FAILED", "FAILED", "cancel_refused", 3),
        _event(3, 3, "FAILED", "FAILED", "reprocess_refused", 4),
    ]
    assert Answer(3, events).event == events[1]
    assert settled(Action.REPROCESS, Answer(4, events))
    assert Answer(5, events).event is None
    assert Answer(5, events).followed == [] and Answer(5, events).status is None


def test_a_cancel_settles_on_its_answer() -> None:
    events = [_event(1, 1, "PENDING", "CANCELLED", "cancelled", 3)]
    assert settled(Action.CANCEL, Answer(3, events))
    assert not settled(Action.CANCEL, Answer(4, events))


# --- the policy -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", list(JobStatus))
def test_one_policy_for_a_reprocess(status: JobStatus) -> None:
    reprocessable = status in {S.DEAD, S.FAILED, S.UNCERTAIN}
    assert refused_here(Action.REPROCESS, status) is not reprocessable
    assert offered(Action.REPROCESS, status) is reprocessable


@pytest.mark.parametrize("status", list(JobStatus))
def test_a_cancel_is_refused_here_only_for_invalid_jobs_and_the_worker_decides_the_rest(
    status: JobStatus,
) -> None:
    assert refused_here(Action.CANCEL, status) is (status is S.INVALID)


def test_a_cancel_is_offered_where_the_state_machine_allows_one() -> None:
    assert {s for s in JobStatus if offered(Action.CANCEL, s)} == {
        S.PENDING,
        S.SCHEDULED,
        S.RETRY_WAIT,
        S.ACCEPTED,
        S.UNCERTAIN,
        S.REVIEW,
    }


def test_bulk_actions_touch_only_their_targets() -> None:
    assert BULK_TARGETS[Action.CANCEL] == {S.PENDING, S.SCHEDULED, S.RETRY_WAIT}
    assert bulk_refused(Action.REPROCESS, ["FAILED", "INVALID", "PENDING"]) == [
        S.INVALID,
        S.PENDING,
    ]
    assert bulk_refused(Action.REPROCESS, ["DEAD", "UNCERTAIN"]) == []


# --- plans --------------------------------------------------------------------------------------


def _job(status: str) -> Job:
    return Job(7, "shop", "5511987654321", status, 1, None, None)


def test_a_reprocess_plan_needs_confirmation_only_when_it_may_send_twice() -> None:
    failed = [_event(1, 1, "PENDING", "ATTEMPTING"), _event(2, 2, "ATTEMPTING", "FAILED")]
    safe = Plan(Action.REPROCESS, _job("FAILED"), failed)
    assert not safe.refused and safe.risk is None and not safe.needs_confirmation
    history = [_event(1, 1, "PENDING", "ATTEMPTING"), _event(2, 2, "ATTEMPTING", "UNCERTAIN")]
    risky = Plan(Action.REPROCESS, _job("UNCERTAIN"), history)
    assert risky.risk is DeliveryRisk.UNCERTAIN_NOW and risky.needs_confirmation
    # A cancel never sends anything: no duplicate to confirm.
    assert Plan(Action.CANCEL, _job("UNCERTAIN"), history).risk is None
    assert Plan(Action.CANCEL, _job("INVALID"), []).refused


def test_a_bulk_plan_needs_confirmation_above_the_threshold_or_for_any_risky_job() -> None:
    few = list(range(1, BULK_CONFIRM_ABOVE + 1))
    job_filter = JobFilter(["FAILED"])
    assert not BulkPlan(Action.REPROCESS, job_filter, 10, few, []).needs_confirmation
    assert BulkPlan(Action.REPROCESS, job_filter, 10, few, [3]).needs_confirmation
    many = list(range(1, BULK_CONFIRM_ABOVE + 2))
    assert BulkPlan(Action.REPROCESS, job_filter, 11, many, []).needs_confirmation
