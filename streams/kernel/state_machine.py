"""The job states and the transitions allowed between them.

Every state change goes through :func:`transition`, which refuses a move the
table below does not allow (the caller logs it and applies nothing) and bumps
the job's version by one. The version is what the state sink compares, so a
job in PostgreSQL never moves backwards whatever order records arrive in.

A transition to the same state is a *note*: it records an event (say, "cancel
refused by the gateway") without changing where the job is.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from streams.kernel.contract import CommandOutcome, JobStatus, StatusChanged

S = JobStatus

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    S.PENDING: frozenset(
        {
            S.ATTEMPTING,
            S.SCHEDULED,
            S.EXPIRED,
            S.CANCELLED,
            S.DEAD,
            S.FAILED,
            S.INVALID,
            S.OPTED_OUT,
        }
    ),
    S.SCHEDULED: frozenset(
        {S.ATTEMPTING, S.EXPIRED, S.CANCELLED, S.FAILED, S.DEAD, S.INVALID, S.OPTED_OUT}
    ),
    S.ATTEMPTING: frozenset(
        {
            S.ACCEPTED,
            S.DELIVERED,
            S.READ,
            S.RETRY_WAIT,
            S.FAILED,
            S.DEAD,
            S.EXPIRED,
            S.UNCERTAIN,
            S.REVIEW,
            S.ATTEMPTING,
            S.OPTED_OUT,
        }
    ),
    S.RETRY_WAIT: frozenset(
        {S.ATTEMPTING, S.SCHEDULED, S.DEAD, S.EXPIRED, S.CANCELLED, S.FAILED, S.OPTED_OUT}
    ),
    S.ACCEPTED: frozenset({S.DELIVERED, S.READ, S.FAILED, S.CANCELLED, S.REVIEW, S.OPTED_OUT}),
    S.DELIVERED: frozenset({S.READ, S.FAILED, S.OPTED_OUT}),
    S.READ: frozenset(),
    S.UNCERTAIN: frozenset(
        {S.ACCEPTED, S.DELIVERED, S.READ, S.ATTEMPTING, S.CANCELLED, S.EXPIRED, S.OPTED_OUT}
    ),
    S.REVIEW: frozenset({S.ACCEPTED, S.DELIVERED, S.READ, S.FAILED, S.CANCELLED}),
    S.FAILED: frozenset({S.ATTEMPTING, S.EXPIRED, S.OPTED_OUT}),
    S.DEAD: frozenset({S.ATTEMPTING, S.EXPIRED, S.OPTED_OUT}),
    S.EXPIRED: frozenset(),
    S.OPTED_OUT: frozenset(),
    S.CANCELLED: frozenset(),
    S.INVALID: frozenset(),
}
"""From each state, the states a job may move to (besides a note to itself).
FAILED, DEAD and UNCERTAIN move on only by an operator's reprocess. INVALID (the relay
rejected the row; written by the state sink from ``zapstream.invalid``) never moves: the
row itself is malformed, so neither cancel nor reprocess applies. OPTED_OUT (the recipient
opted out: the worker skipped the job, or the gateway refused it for that, Meta's 131050) never
moves either: the job is not to be sent; after an opt-in the application enqueues anew. A job
waiting (PENDING, RETRY_WAIT) or being reprocessed (FAILED, DEAD, UNCERTAIN) reaches it when
the opt-out is met before its next attempt; an accepted or delivered one when the gateway's
failed status says the recipient opted out (Meta's 131050 in a status webhook). SCHEDULED waits in
PostgreSQL: a job inserted due later never reaches the worker as SCHEDULED (its release
is its first intent); the worker moves a bulk job to SCHEDULED to hold it for the
recipient's quiet hours, and the release brings it back."""

SENT = frozenset({S.ACCEPTED, S.DELIVERED, S.READ})
"""The gateway has the message: sending it again would be a duplicate."""

SETTLED = SENT | {
    S.FAILED,
    S.DEAD,
    S.EXPIRED,
    S.CANCELLED,
    S.UNCERTAIN,
    S.REVIEW,
    S.INVALID,
    S.OPTED_OUT,
}
"""No automatic attempt follows from these; only an operator moves the job on."""

NOT_HANDED_OVER = frozenset({S.PENDING, S.SCHEDULED, S.RETRY_WAIT})
"""The gateway never had the job (or not this round): a cancel needs no gateway call."""

REPROCESSABLE = frozenset({S.DEAD, S.UNCERTAIN, S.FAILED})

RECEIPT_RANK: dict[JobStatus, int] = {S.ACCEPTED: 1, S.DELIVERED: 2, S.READ: 3}
"""Receipts only move a job forward along sent -> delivered -> read."""


class InvalidTransition(ValueError):
    """A state change the table does not allow. Logged and never applied."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobRef:
    """What identifies a job on the state topic."""

    job_id: int
    idempotency_key: str
    instance_id: str
    conversation_key: str


def transition(
    job: JobRef,
    current: StatusChanged | None,
    to: JobStatus,
    *,
    reason: str | None = None,
    actor: str = "worker",
    attempts: int | None = None,
    attempt_seq: int | None = None,
    attempt_id: str | None = None,
    gateway_job_id: str | None = None,
    next_retry_at: str | None = None,
    errors: list[str] | None = None,
    now: dt.datetime | None = None,
    outcome: CommandOutcome | None = None,
    command_id: int | None = None,
) -> StatusChanged:
    """The record that moves ``job`` from ``current`` (None: PENDING, version 0) to ``to``.

    ``outcome`` and ``command_id`` mark the record that answers an operator's or
    application's command; they are never carried over to the next record.
    """
    previous = JobStatus(current.status) if current else JobStatus.PENDING
    if to is not previous and to not in ALLOWED[previous]:
        raise InvalidTransition(f"job {job.job_id}: {previous} -> {to} is not allowed")
    at = (now or dt.datetime.now(dt.UTC)).isoformat()
    sent_at = current.sent_at if current else None
    if to in SENT and sent_at is None:
        sent_at = at
    return StatusChanged(
        job_id=job.job_id,
        idempotency_key=job.idempotency_key,
        instance_id=job.instance_id,
        conversation_key=job.conversation_key,
        status=to,
        previous=previous,
        version=(current.version if current else 0) + 1,
        attempts=attempts if attempts is not None else (current.attempts if current else 0),
        attempt_seq=attempt_seq
        if attempt_seq is not None
        else (current.attempt_seq if current else 0),
        attempt_id=attempt_id or (current.attempt_id if current else None),
        gateway_job_id=gateway_job_id or (current.gateway_job_id if current else None),
        next_retry_at=next_retry_at,
        errors=list(errors if errors is not None else (current.errors if current else [])),
        # Receipt dedup survives every other change of the job (notes, reprocess).
        receipt_events=list(current.receipt_events) if current else [],
        reason=reason,
        actor=actor,
        at=at,
        sent_at=sent_at,
        outcome=outcome.value if outcome is not None else None,
        command_id=command_id,
    )
