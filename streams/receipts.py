"""Which receipts may change a job: the current attempt's, bound to it, each event once (sans-IO).

A gateway callback is about one attempt of a job: its ``reference`` is the
attempt reference we sent (``<job>-<seq>-<tag>``, :mod:`streams.kernel.attempt_reference`,
whose HMAC tag binds it to the gateway, the instance and this deployment) and its
gateway job id is what that attempt was answered. A receipt changes a job only when it
*binds* to the job's current attempt: the gateway of its webhook path is the attempt's,
its reference verifies and names the current attempt, its gateway job id is the one the
attempt recorded, and for Meta its ``phone_number_id`` is the job's instance
(:func:`ignored_because`). So a callback replayed to another gateway's path, about an
earlier attempt (late, retried or replayed after an operator reprocessed the job), or
about another gateway job, changes nothing. And a gateway retries a callback with the
same ``event_id``: the job keeps the last :data:`MAX_RECEIPT_EVENTS` event ids it
applied and drops a receipt whose id is among them.

:func:`ignored_because` says why a receipt changes nothing (``None``: apply it
along the monotonic rules of :func:`moves_forward`); :func:`remember_event` is the
bounded list the job carries in
:attr:`~streams.kernel.contract.StatusChanged.receipt_events`. Every rule about
receipts is here; :meth:`streams.job_processor.JobProcessor.on_receipt` applies them.
"""

from __future__ import annotations

import dataclasses

from streams.kernel.attempt_reference import ParsedReference, ReferenceKey, parse_reference
from streams.kernel.contract import JobStatus, ReceiptReceived, StatusChanged
from streams.kernel.state_machine import RECEIPT_RANK

S = JobStatus

META = "meta"
"""The gateway whose receipts carry the business number (``metadata.phone_number_id``)."""

MAX_RECEIPT_EVENTS = 16
"""Event ids kept per job: a job gets a handful of receipts (sent, delivered, read)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ignored:
    """A receipt that changes nothing: ``reason`` is the metric label, ``detail`` the log."""

    reason: str
    detail: str


def attempt_of(reference: str | None, job_id: int) -> str | None:
    """The attempt id ``reference`` names for ``job_id`` (``"<job_id>-<seq>"``), else None."""
    parsed = parse_reference(reference)
    if parsed is None or parsed.job_id != job_id:
        return None
    return parsed.attempt_id


def _current_seq(current: StatusChanged) -> int | None:
    if current.attempt_seq:
        return current.attempt_seq
    parsed = parse_reference(current.attempt_id)
    return parsed.seq if parsed is not None else None


def ignored_because(
    current: StatusChanged,
    receipt: ReceiptReceived,
    *,
    gateway: str,
    key: ReferenceKey | None,
) -> Ignored | None:
    """Why ``receipt`` must not change ``current``, or None (it binds to the current attempt).

    ``gateway`` is the gateway this worker sends through (the attempt's, unless a verified
    reference proves another); ``key`` verifies references (None: none verifies). A
    receipt binds when every check holds, in this order:

    - its event id was not applied yet (``duplicate_event``);
    - Meta: its ``phone_number_id`` is the job's instance (``other_phone_number``);
    - its reference, when it is one of ours, names this job and, when tagged, verifies for
      the receipt's gateway and the job's instance (``bad_reference``: made for another
      gateway, instance or deployment, or forged);
    - it is about the current attempt: its reference names it, or its gateway job id is
      the one the job recorded (an earlier attempt adopted by reconciliation)
      (``other_attempt``); when the job recorded a gateway job id, the receipt's is that
      one, even with a verified reference (``other_gateway_job``);
    - without a verified reference (none, a legacy ``<job>-<seq>`` one, or one that is not
      ours) the receipt's gateway is ``gateway`` (``other_gateway``) and its gateway job id
      matched the job's (``unbound``: nothing ties it to the attempt).
    """
    if receipt.event_id in current.receipt_events:
        return Ignored("duplicate_event", f"event {receipt.event_id} was already applied")
    if receipt.gateway == META and receipt.phone_number_id != current.instance_id:
        return Ignored(
            "other_phone_number",
            f"about phone number id {receipt.phone_number_id}; "
            f"the job's instance is {current.instance_id}",
        )
    parsed = parse_reference(receipt.reference)
    refused = _refused_reference(current, receipt, parsed, key)
    if refused is not None:
        return refused
    proven = parsed is not None and parsed.tag is not None  # verified just above
    same_gateway_job = (
        current.gateway_job_id is not None and receipt.gateway_job_id == current.gateway_job_id
    )
    if parsed is not None and parsed.seq != _current_seq(current) and not same_gateway_job:
        return Ignored(
            "other_attempt",
            f"about attempt {parsed.attempt_id} (gateway job {receipt.gateway_job_id}); "
            f"the current attempt is {current.attempt_id} "
            f"(gateway job {current.gateway_job_id})",
        )
    if current.gateway_job_id is not None and not same_gateway_job:
        return Ignored(
            "other_gateway_job",
            f"about gateway job {receipt.gateway_job_id}; "
            f"the current one is {current.gateway_job_id}",
        )
    if proven:
        return None
    if receipt.gateway != gateway:
        return Ignored(
            "other_gateway",
            f"from {receipt.gateway} without a verified reference; "
            f"the attempt went through {gateway}",
        )
    if not same_gateway_job:
        return Ignored(
            "unbound",
            "neither a verified reference nor a gateway job id ties it to the current attempt",
        )
    return None


def _refused_reference(
    current: StatusChanged,
    receipt: ReceiptReceived,
    parsed: ParsedReference | None,
    key: ReferenceKey | None,
) -> Ignored | None:
    """``bad_reference`` when the receipt's reference names another job or carries a tag
    that does not verify; None for a verified, legacy, missing or foreign reference."""
    if parsed is None:
        return None
    if parsed.job_id != receipt.job_id:
        return Ignored("bad_reference", f"the reference names job {parsed.job_id}")
    if parsed.tag is None:
        return None
    if key is not None and key.verifies(
        parsed, gateway=receipt.gateway, instance_id=current.instance_id
    ):
        return None
    return Ignored(
        "bad_reference",
        f"the reference of attempt {parsed.attempt_id} does not verify for "
        f"{receipt.gateway} and instance {current.instance_id}",
    )


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
