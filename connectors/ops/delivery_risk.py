"""May this job already have been delivered? The one rule the CLI and the console warn with.

Read from the job's structured history (the ``outbox_job_events`` statuses the
worker writes, :mod:`streams.job_processor`), never from reason text. What the
worker records, and what each means for a resend:

- Before each gateway call it journals a move into ATTEMPTING; the attempt ends
  with the next move out of ATTEMPTING. RETRY_WAIT, DEAD, FAILED and EXPIRED
  end an attempt the gateway certainly did not take: a transient or permanent
  error, or an uncertain one that reconciliation settled as "not in the
  gateway's authoritative listing". ATTEMPTING -> ATTEMPTING is a note
  (reconciling again), not a new attempt.
- UNCERTAIN: the outcome is unknown (reconciliation could not tell). A later
  reprocess does not make that earlier attempt any less possibly delivered.
- REVIEW: the gateway took the message but reported a status label this
  pipeline does not know; it may mean delivered.
- DELIVERED or READ: a receipt said the recipient has it (a FAILED receipt
  afterwards does not undo that).
- ACCEPTED followed by a FAILED receipt is the gateway's own word that it
  failed: no risk.

An attempt whose end is missing from the history (the job is ATTEMPTING, or the
next recorded move does not leave ATTEMPTING because events are missing) has no
definitive outcome, so it counts as a risk too.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from streams.kernel.contract import JobStatus

__all__ = ["DeliveryRisk", "StatusMove", "delivery_risk"]

S = JobStatus


class StatusMove(Protocol):
    """What the rule reads of one event: where the job came from and went to."""

    @property
    def from_status(self) -> str | None: ...

    @property
    def to_status(self) -> str: ...


class DeliveryRisk(enum.StrEnum):
    """Why a resend may duplicate a message the recipient already has."""

    UNCERTAIN_NOW = "uncertain_now"
    UNCERTAIN_BEFORE = "uncertain_before"
    UNKNOWN_LABEL = "unknown_label"
    RECEIPT_DELIVERED = "receipt_delivered"
    ATTEMPT_UNRECORDED = "attempt_unrecorded"

    @property
    def explanation(self) -> str:
        """The reason in words, to follow "WARNING: " (lower case, no final stop)."""
        return _EXPLANATIONS[self]


_EXPLANATIONS = {
    DeliveryRisk.UNCERTAIN_NOW: "the outcome of this job's last attempt is UNCERTAIN",
    DeliveryRisk.UNCERTAIN_BEFORE: (
        "an earlier attempt of this job ended UNCERTAIN (its outcome was never known)"
    ),
    DeliveryRisk.UNKNOWN_LABEL: (
        "the gateway took this job and reported a status this pipeline does not know (REVIEW)"
    ),
    DeliveryRisk.RECEIPT_DELIVERED: "a receipt said this job was DELIVERED",
    DeliveryRisk.ATTEMPT_UNRECORDED: (
        "an attempt of this job started and its outcome was never recorded"
    ),
}

_SEEN_BY_RECIPIENT = frozenset({S.DELIVERED, S.READ})


def delivery_risk(status: str, events: Sequence[StatusMove]) -> DeliveryRisk | None:
    """Why job in ``status`` with ``events`` (in version order) may have been delivered; or None.

    None means every attempt of the job has a definitive outcome in which the
    recipient did not get the message, so a resend cannot duplicate it.
    """
    if status == S.UNCERTAIN:
        return DeliveryRisk.UNCERTAIN_NOW
    if status == S.ATTEMPTING:
        return DeliveryRisk.ATTEMPT_UNRECORDED
    open_attempt = False
    for event in events:
        to = event.to_status
        if to == S.UNCERTAIN:
            return DeliveryRisk.UNCERTAIN_BEFORE
        if to == S.REVIEW:
            return DeliveryRisk.UNKNOWN_LABEL
        if to in _SEEN_BY_RECIPIENT:
            return DeliveryRisk.RECEIPT_DELIVERED
        if event.from_status == to:
            continue  # a note: the job did not move
        if open_attempt and event.from_status != S.ATTEMPTING:
            # The move that ended the attempt is missing: how it ended is unknown.
            return DeliveryRisk.ATTEMPT_UNRECORDED
        open_attempt = to == S.ATTEMPTING
    return DeliveryRisk.ATTEMPT_UNRECORDED if open_attempt else None
