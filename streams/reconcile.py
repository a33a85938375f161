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

The listing is asked narrowly (:func:`listing_query`): for this job's attempt ids
(``?reference=<job>-1&reference=<job>-2...``) and for jobs created since the
job was (minus :data:`SINCE_MARGIN` for clock differences); a gateway that
cannot filter answers everything, which is still correct, only slower.

A listing that is unavailable (transient) or unreadable (it does not parse
with the configured field names, :class:`~streams.errors.ListingUnreadable`)
says nothing about the job: the verdict is LATER, never UNCERTAIN and never a
resend. Unreadable listings are counted in
``zapstream_reconcile_listing_unreadable_total``; the gateway client logs them
once per instance per outage.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum

from streams.errors import GatewayError, ListingUnreadable
from streams.metrics import LISTING_UNREADABLE
from streams.ports import Gateway, ListedJob

SINCE_MARGIN = dt.timedelta(minutes=10)
"""How much earlier than the job's creation the listing is asked from: the gateway's
clock and ours may differ, and a listing that starts too late would hide the job."""
MAX_REFERENCES = 20
"""Beyond this many attempts the listing is asked by time window only (URL length)."""


class Verdict(enum.StrEnum):
    ADOPT = "adopt"
    RESEND = "resend"
    UNCERTAIN = "uncertain"
    LATER = "later"
    """The listing could not be read now (transient, or unreadable): try again later."""


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


def listing_query(
    job_id: int, attempt_seq: int, created_at: str | None
) -> tuple[list[str], dt.datetime | None]:
    """``(references, since)`` to ask the listing for: every attempt id of the job so far
    (an earlier attempt may be the one the gateway took) and the job's creation time
    minus :data:`SINCE_MARGIN`."""
    references = (
        [f"{job_id}-{n}" for n in range(1, attempt_seq + 1)]
        if 0 < attempt_seq <= MAX_REFERENCES
        else []
    )
    since: dt.datetime | None = None
    if created_at:
        try:
            created = dt.datetime.fromisoformat(created_at)
        except ValueError:
            created = None
        if created is not None:
            if created.tzinfo is None:
                created = created.replace(tzinfo=dt.UTC)
            since = created - SINCE_MARGIN
    return references, since


async def reconcile(
    gateway: Gateway,
    *,
    instance_id: str,
    job_id: int,
    to: str,
    text: str,
    authoritative: bool,
    attempt_seq: int = 0,
    created_at: str | None = None,
) -> Reconciliation:
    """Look the job up at the gateway (narrowly, see :func:`listing_query`) and decide."""
    references, since = listing_query(job_id, attempt_seq, created_at)
    try:
        listed = await gateway.list_for_reconciliation(
            instance_id, references=references, since=since
        )
    except ListingUnreadable as exc:
        LISTING_UNREADABLE.labels(gateway.name, instance_id).inc()
        return Reconciliation(Verdict.LATER, f"listing unreadable: {exc}")
    except GatewayError as exc:
        if exc.retriable:
            return Reconciliation(Verdict.LATER, f"listing unavailable: {exc}")
        return Reconciliation(Verdict.UNCERTAIN, f"listing failed: {exc}")
    if listed is None:
        return Reconciliation(Verdict.UNCERTAIN, f"{gateway.name} has no job listing")
    return match(listed, job_id=job_id, to=to, text=text, authoritative=authoritative)
