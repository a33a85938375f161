"""Which receipts may change a job: the current attempt's, each event once (sans-IO).

A gateway callback is about one attempt of a job: its ``reference`` is the
attempt id we sent (``<job>-<seq>``) and its gateway job id is what that attempt
was answered. After an operator reprocessed a job, callbacks about the earlier
attempt may still arrive (late, retried or replayed); they must not move the job
the new attempt put where it is. And a gateway retries a callback with the same
``event_id``: the job keeps the last :data:`MAX_RECEIPT_EVENTS` event ids it
applied and drops a receipt whose id is among them.

:func:`ignored_because` says why a receipt changes nothing (``None``: apply it
along the monotonic rules of :func:`moves_forward`); :func:`remember_event` is the
bounded list the job carries in
:attr:`~streams.kernel.contract.StatusChanged.receipt_events`. Every rule about
receipts is here; :meth:`streams.job_processor.JobProcessor.on_receipt` applies them.
"""

from __future__ import annotations

import dataclasses

from streams.kernel.contract import JobStatus, ReceiptReceived, StatusChanged
from streams.kernel.state_machine import RECEIPT_RANK

S = JobStatus

MAX_RECEIPT_EVENTS = 16
"""Event ids kept per job: a job gets a handful of receipts (sent, delivered, read)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ignored:
    """A receipt that changes nothing: ``reason`` is the metric label, ``detail`` the log."""

    reason: str
    detail: str


def attempt_of(reference: str | None, job_id: int) -> str | None:
    """The attempt id ``reference`` names for ``job_id`` (``"<job_id>-<seq>"``), else None."""
    if not reference:
        return None
    job, sep, seq = reference.strip().rpartition("-")
    if not sep or job != str(job_id) or not seq.isdigit():
        return None
    return f"{job_id}-{int(seq)}"


def ignored_because(current: StatusChanged, receipt: ReceiptReceived) -> Ignored | None:
    """Why ``receipt`` must not change ``current``, or None.

    The receipt is about the current attempt when its gateway job id is the job's
    or its reference is the job's current attempt id. It is about another attempt
    when its reference names another attempt of this job, or, without a usable
    reference, when the job has a gateway job id and the receipt another one.
    With nothing to compare (no reference, no gateway id on the job) it is applied.
    """
    if receipt.event_id in current.receipt_events:
        return Ignored("duplicate_event", f"event {receipt.event_id} was already applied")
    same_gateway_job = (
        current.gateway_job_id is not None and receipt.gateway_job_id == current.gateway_job_id
    )
    attempt = attempt_of(receipt.reference, receipt.job_id)
    if same_gateway_job or (attempt is not None and attempt == current.attempt_id):
        return None
    if attempt is not None:
        return Ignored(
            "other_attempt",
            f"about attempt {attempt} (gateway job {receipt.gateway_job_id}); "
            f"the current attempt is {current.attempt_id} "
            f"(gateway job {current.gateway_job_id})",
        )
    if current.gateway_job_id is not None:
        return Ignored(
            "other_gateway_job",
            f"about gateway job {receipt.gateway_job_id}; "
            f"the current one is {current.gateway_job_id}",
        )
    return None


def moves_forward(status: JobStatus, target: JobStatus) -> bool:
    """Whether a receipt saying ``target`` may move a job that is ``status`` (monotonic).

    Along ACCEPTED < DELIVERED < READ a receipt only moves forward (a late or duplicated
    "sent" never downgrades "read"); a FAILED receipt applies to an accepted or delivered
    job only; a REVIEW one (an unknown label) to an accepted job only. Anything else is left
    to the state machine, which refuses what it does not allow.
    """
    if target in RECEIPT_RANK and status in RECEIPT_RANK:
        return RECEIPT_RANK[target] > RECEIPT_RANK[status]
    if target is S.FAILED:
        return status in {S.ACCEPTED, S.DELIVERED}
    if target is S.REVIEW:
        return status is S.ACCEPTED
    return True


def remember_event(events: list[str], event_id: str) -> list[str]:
    """``events`` with ``event_id`` appended, the oldest dropped past the bound."""
    kept = [e for e in events if e != event_id]
    kept.append(event_id)
    return kept[-MAX_RECEIPT_EVENTS:]
