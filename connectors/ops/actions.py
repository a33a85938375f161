"""Operator actions on jobs (cancel, reprocess): plan, request, wait for the worker's answer.

The one core behind ``zapstream jobs cancel|reprocess`` and the console's
buttons; the front ends only word what it decides.

- Policy: which statuses an action is refused for before anything is written
  (:func:`refused_here`), which the console offers it for (:func:`offered`), and
  which a bulk action touches (:data:`BULK_TARGETS`). The statuses come from
  :mod:`streams.kernel.state_machine`, the worker's own table; the worker
  checks again when it applies the command, since only it knows the job's
  latest state.
- Plan: for one job (:func:`plan_one`) or every job a filter matches
  (:func:`plan_many`): how many, which may already have been delivered
  (:mod:`connectors.ops.delivery_risk`), whether the operator must confirm.
- Request: the command rows (:mod:`connectors.outbox.commands`), each request in
  its own transaction.
- Wait: poll the job's events for the event that carries the command's id
  (:func:`wait_for_answer`); a reprocess also waits for the job's next settled
  state.

Functions take an open sync psycopg connection (autocommit); the console runs
them in a thread.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Any

import psycopg

from connectors.ops.delivery_risk import DeliveryRisk, delivery_risk
from connectors.ops.job_filter import JobFilter
from connectors.ops.jobs_sql import (
    Job,
    JobEvent,
    count_jobs,
    fetch_events,
    fetch_events_of,
    fetch_job,
    fetch_statuses,
    matching_job_ids,
    poll_events,
)
from connectors.outbox.commands import (
    request_cancel_by_id,
    request_reprocess,
    request_reprocess_many,
)
from streams.kernel.contract import CommandOutcome, JobStatus
from streams.kernel.state_machine import ALLOWED, REPROCESSABLE

__all__ = [
    "BULK_CONFIRM_ABOVE",
    "BULK_TARGETS",
    "CANCELLABLE",
    "IN_PROGRESS",
    "Action",
    "Answer",
    "BulkPlan",
    "Plan",
    "bulk_refused",
    "offered",
    "plan_many",
    "plan_one",
    "refused_here",
    "request_many",
    "request_one",
    "settled",
    "wait_for_answer",
]

S = JobStatus


class Action(enum.StrEnum):
    """What an operator may ask of a job."""

    CANCEL = "cancel"
    REPROCESS = "reprocess"


CANCELLABLE = frozenset(s for s, to in ALLOWED.items() if S.CANCELLED in to)
"""Statuses the state machine lets a cancel move on (the console offers the button for these)."""

BULK_TARGETS: dict[Action, frozenset[JobStatus]] = {
    # A bulk cancel only asks for jobs not handed to the gateway yet: one at the gateway
    # needs its own look (a gateway cancel may be refused or unsupported).
    Action.CANCEL: frozenset({S.PENDING, S.SCHEDULED, S.RETRY_WAIT}),
    Action.REPROCESS: REPROCESSABLE,
}
"""The statuses a bulk action touches."""

IN_PROGRESS = frozenset({S.PENDING, S.ATTEMPTING, S.RETRY_WAIT})
"""A reprocessed job in these has not reached its next settled state yet."""

BULK_CONFIRM_ABOVE = 10
"""A bulk action on more jobs than this needs the operator's confirmation."""


def refused_here(action: Action, status: str) -> bool:
    """Whether ``action`` is refused for a job in ``status`` before any command is written.

    INVALID (the relay rejected the row) is refused for both: the job was never
    sent and its row is malformed. A reprocess is refused unless the job will not
    be attempted again on its own (DEAD, FAILED, UNCERTAIN). Any other cancel is
    for the worker to decide (it answers ``cancel_refused`` when it is too late).
    """
    if status == S.INVALID:
        return True
    return action is Action.REPROCESS and status not in REPROCESSABLE


def offered(action: Action, status: str) -> bool:
    """Whether the console offers ``action`` for a job in ``status``."""
    if action is Action.CANCEL:
        return status in CANCELLABLE
    return status in REPROCESSABLE


def bulk_refused(action: Action, statuses: Iterable[str]) -> list[JobStatus]:
    """The asked-for statuses a bulk ``action`` may not touch, sorted."""
    return sorted({S(s) for s in statuses} - BULK_TARGETS[action])


# --- plan -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One job, its history, and what ``action`` on it would mean."""

    action: Action
    job: Job
    history: list[JobEvent]

    @property
    def refused(self) -> bool:
        return refused_here(self.action, self.job.status)

    @property
    def risk(self) -> DeliveryRisk | None:
        """Why a reprocess may send the message twice; None for a cancel or a safe resend."""
        if self.action is not Action.REPROCESS:
            return None
        return delivery_risk(self.job.status, self.history)

    @property
    def needs_confirmation(self) -> bool:
        """The operator must accept a possible duplicate first."""
        return self.risk is not None


def plan_one(conn: psycopg.Connection[Any], action: Action, job_id: int) -> Plan | None:
    """The plan for ``action`` on job ``job_id``; None when there is no such job."""
    job = fetch_job(conn, job_id)
    if job is None:
        return None
    return Plan(action, job, fetch_events(conn, job_id))


@dataclasses.dataclass(frozen=True, slots=True)
class BulkPlan:
    """Every job a filter matches that ``action`` may touch, and what acting would mean."""

    action: Action
    job_filter: JobFilter
    """The operator's filter narrowed to :data:`BULK_TARGETS`."""
    total: int
    """How many jobs match in all."""
    chosen: list[int]
    """The ones acted on now: the oldest, at most the limit."""
    risky: list[int]
    """Those of ``chosen`` that may already have been delivered (reprocess only)."""

    @property
    def needs_confirmation(self) -> bool:
        """More than :data:`BULK_CONFIRM_ABOVE` jobs, or any that may be sent twice."""
        return len(self.chosen) > BULK_CONFIRM_ABOVE or bool(self.risky)


def plan_many(
    conn: psycopg.Connection[Any], action: Action, job_filter: JobFilter, *, limit: int
) -> BulkPlan:
    """The plan for ``action`` on the oldest ``limit`` jobs matching ``job_filter``.

    The filter is narrowed to the statuses the action touches (a filter on other
    statuses matches nothing); the caller decides whether to refuse those first
    (:func:`bulk_refused`).
    """
    if limit < 1:
        raise ValueError("limit must be positive")
    narrowed = job_filter.with_statuses(frozenset(BULK_TARGETS[action]))
    total = count_jobs(conn, narrowed)
    chosen = matching_job_ids(conn, narrowed, limit=limit) if total else []
    risky: list[int] = []
    if action is Action.REPROCESS and chosen:
        statuses = fetch_statuses(conn, chosen)
        histories = fetch_events_of(conn, chosen)
        risky = [
            job_id
            for job_id in chosen
            if delivery_risk(statuses.get(job_id, ""), histories[job_id]) is not None
        ]
    return BulkPlan(action, narrowed, total, chosen, risky)


# --- request ----------------------------------------------------------------------------


def request_one(
    conn: psycopg.Connection[Any], action: Action, job_id: int, *, reason: str, actor: str
) -> int:
    """Write the command for ``action`` on job ``job_id`` in its own transaction; its id.

    Raises :class:`~connectors.outbox.commands.InvalidCommand` when the database
    refuses it (an empty reason, a pruned job).
    """
    with conn.transaction():
        if action is Action.CANCEL:
            return request_cancel_by_id(conn, job_id, reason, actor)
        return request_reprocess(conn, job_id, reason, actor)


def request_many(
    conn: psycopg.Connection[Any], plan: BulkPlan, *, reason: str, actor: str
) -> list[int]:
    """Write one command per job of ``plan.chosen``, all in one transaction; their ids.

    Only the jobs the plan looked at are asked for (so none skips the
    delivered-already check); a reprocess leaves out any that is no longer
    reprocessable when the statement runs.
    """
    with conn.transaction():
        if plan.action is Action.REPROCESS:
            return request_reprocess_many(conn, plan.chosen, reason, actor)
        return [request_cancel_by_id(conn, job_id, reason, actor) for job_id in plan.chosen]


# --- wait -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """The job's events as last seen after command ``command_id``, read for its answer."""

    command_id: int
    events: list[JobEvent]

    @property
    def event(self) -> JobEvent | None:
        """The worker's answer: the event that carries the command's id, or None (not yet)."""
        return next((e for e in self.events if e.command_id == self.command_id), None)

    @property
    def followed(self) -> list[JobEvent]:
        """The answer and every event after it, in version order (empty: no answer yet)."""
        answer = self.event
        if answer is None:
            return []
        return [answer, *(e for e in self.events if e.version > answer.version)]

    @property
    def moves(self) -> list[JobEvent]:
        """The job's moves after the answer (notes left out)."""
        return [e for e in self.followed[1:] if not e.is_note]

    @property
    def status(self) -> str | None:
        """Where the job is after the answer: its last move, else the answer's status."""
        moves = self.moves
        if moves:
            return moves[-1].to_status
        answer = self.event
        return None if answer is None else answer.to_status

    @property
    def in_progress(self) -> bool:
        """Taken up but not at a settled state yet (a reprocess still attempting)."""
        return not self.moves or self.moves[-1].to_status in IN_PROGRESS


def settled(action: Action, answer: Answer) -> bool:
    """Whether to stop waiting: a cancel has its answer; a reprocess its refusal, or its
    next settled state once taken up."""
    event = answer.event
    if event is None:
        return False
    if action is Action.CANCEL or event.outcome != CommandOutcome.REPROCESSED:
        return True
    return not answer.in_progress


def wait_for_answer(
    conn: psycopg.Connection[Any],
    action: Action,
    job_id: int,
    command_id: int,
    *,
    wait_s: float,
    poll_interval_s: float,
) -> Answer:
    """Poll the job's events up to ``wait_s`` seconds until :func:`settled` says so."""
    events = poll_events(
        conn,
        job_id,
        wait_s=wait_s,
        poll_interval_s=poll_interval_s,
        settled=lambda evs: settled(action, Answer(command_id, evs)),
    )
    return Answer(command_id, events)
