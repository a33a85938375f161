"""Did the gateway take a message whose outcome we do not know? Ask its listing.

Used before any resend of an attempt that may have reached the gateway: an
intent redelivered while its job is ATTEMPTING (a crash or rebalance between
the journal write and the outcome), and every uncertain outcome (read timeout
after the body was written, connection reset mid-response).

Matching, in order:

1. by reference: a listed job whose reference is one of this job's attempt ids
   (``<job_id>-<n>``, the ``Idempotency-Key`` we sent) is this job;
2. when the listing hides references: by recipient and text. One match is
   adopted; several are ambiguous.

No match means "not accepted" only when the listing is authoritative (it shows
every job the gateway took); then the message may be sent again. Anything else
is UNCERTAIN: shown to operators, never resent automatically.
"""

from __future__ import annotations

import dataclasses
import enum

from streams.errors import GatewayError
from streams.ports import Gateway, ListedJob


class Verdict(enum.StrEnum):
    ADOPT = "adopt"
    RESEND = "resend"
    UNCERTAIN = "uncertain"
    LATER = "later"
    """The listing could not be read now (transient): try again after a backoff."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reconciliation:
    verdict: Verdict
    reason: str
    job: ListedJob | None = None


def match(
    listed: list[ListedJob], *, job_id: int, to: str, text: str, authoritative: bool
) -> Reconciliation:
    """Decide from a listing (sans-IO): adopt, resend or uncertain."""
    prefix = f"{job_id}-"
    by_reference = [j for j in listed if j.reference and j.reference.startswith(prefix)]
    if by_reference:
        return Reconciliation(Verdict.ADOPT, "found by reference", by_reference[0])
    references_shown = any(j.reference for j in listed)
    if not references_shown:
        by_content = [j for j in listed if j.to == to and j.text == text]
        if len(by_content) == 1:
            return Reconciliation(Verdict.ADOPT, "found by recipient and text", by_content[0])
        if len(by_content) > 1:
            return Reconciliation(
                Verdict.UNCERTAIN,
                f"{len(by_content)} jobs at the gateway match recipient and text; "
                "cannot tell which is this one",
            )
    if authoritative:
        return Reconciliation(Verdict.RESEND, "not in the gateway's listing")
    return Reconciliation(
        Verdict.UNCERTAIN, "not found, and the gateway's listing is not authoritative"
    )


async def reconcile(
    gateway: Gateway, *, instance_id: str, job_id: int, to: str, text: str, authoritative: bool
) -> Reconciliation:
    """Look the job up at the gateway and decide."""
    try:
        listed = await gateway.list_for_reconciliation(instance_id)
    except GatewayError as exc:
        if exc.retriable:
            return Reconciliation(Verdict.LATER, f"listing unavailable: {exc}")
        return Reconciliation(Verdict.UNCERTAIN, f"listing failed: {exc}")
    if listed is None:
        return Reconciliation(Verdict.UNCERTAIN, f"{gateway.name} has no job listing")
    return match(listed, job_id=job_id, to=to, text=text, authoritative=authoritative)
