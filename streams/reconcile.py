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

A listing that is unavailable (transient) or unreadable
(:class:`~streams.kernel.errors.ListingUnreadable`) says nothing about the job: the
verdict is LATER, never a resend. The job processor asks again with the
instance's backoff and, past ``ZAPSTREAM_WORKER_RECONCILE_MAX_WAIT_S``, makes the
job UNCERTAIN (:mod:`streams.job_processor`). Unreadable listings are counted
in ``zapstream_reconcile_listing_unreadable_total``; the gateway client logs
them once per instance per outage.

One request per instance, not per job (:class:`InstanceListings`): the jobs of
an instance that need the listing at about the same time (after a crash, every
conversation's head) share one request, asked for all their references; an
instance's listing is asked at most ``listings_per_minute`` times in any 60 s,
one request at a time, and after a failure not before a capped exponential
backoff. A job that finds its instance's listing deferred gets LATER at once,
with the time the listing may be asked again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import enum
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from streams.kernel.errors import GatewayError, ListingUnreadable, TransientGatewayError
from streams.kernel.ports import ListedJob
from streams.metrics import LISTING_LIMIT, LISTING_REQUESTS, LISTING_UNREADABLE

SINCE_MARGIN = dt.timedelta(minutes=10)
"""How much earlier than the job's creation the listing is asked from: the gateway's
clock and ours may differ, and a listing that starts too late would hide the job."""


class Listing(Protocol):
    """What reconciliation needs of a gateway: its name and its listing."""

    name: str

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> list[ListedJob] | None: ...


class ListingDeferred(TransientGatewayError):
    """The instance's listing may not be asked now (its backoff, or its per-minute bound);
    not a gateway failure: nothing was sent."""

    def __init__(self, message: str, *, retry_at: float) -> None:
        super().__init__(message)
        self.retry_at = retry_at
        """Epoch seconds from which the listing may be asked again."""


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
    retry_at: float | None = None
    """With LATER: epoch seconds from which the listing may be asked again (None: now)."""


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
    job_id: int,
    attempt_seq: int,
    created_at: str | None,
    reference_of: Callable[[int], Sequence[str]] | None = None,
) -> tuple[list[str], dt.datetime | None]:
    """``(references, since)`` to ask the listing for: every reference of every attempt of
    the job so far (an earlier attempt may be the one the gateway took; ``reference_of``
    gives an attempt's, default its attempt id) and the job's creation time minus
    :data:`SINCE_MARGIN`. The gateway client decides how many references fit in its URL;
    the rest it recognises in the answer."""
    references = [
        ref
        for n in range(1, attempt_seq + 1)
        for ref in (reference_of(n) if reference_of is not None else [f"{job_id}-{n}"])
    ]
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
    gateway: Listing,
    *,
    instance_id: str,
    job_id: int,
    to: str,
    text: str,
    authoritative: bool,
    attempt_seq: int = 0,
    created_at: str | None = None,
    reference_of: Callable[[int], Sequence[str]] | None = None,
) -> Reconciliation:
    """Look the job up at the gateway (narrowly, see :func:`listing_query`) and decide."""
    references, since = listing_query(job_id, attempt_seq, created_at, reference_of)
    try:
        listed = await gateway.list_for_reconciliation(
            instance_id, references=references, since=since
        )
    except ListingDeferred as exc:
        return Reconciliation(Verdict.LATER, str(exc), retry_at=exc.retry_at)
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


@dataclasses.dataclass(slots=True)
class _Batch:
    """The jobs of one instance waiting for the same listing request."""

    future: asyncio.Future[list[ListedJob] | None]
    references: set[str] = dataclasses.field(default_factory=set)
    since: dt.datetime | None = None
    whole: bool = False
    """A job asked without ``since``: the listing is asked without it too."""


@dataclasses.dataclass(slots=True)
class _InstanceListing:
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    collecting: _Batch | None = None
    requests: collections.deque[float] = dataclasses.field(default_factory=collections.deque)
    """Monotonic times of this instance's listing requests in the last 60 s."""
    failures: int = 0
    retry_at: float = 0.0
    """Monotonic time before which the listing is not asked (backoff after a failure)."""
    last_error: str = ""


class InstanceListings:
    """The gateway's listing as reconciliation asks it: per instance, one request at a
    time shared by every waiting job, at most ``listings_per_minute`` requests (pages
    included) in any 60 s, and a capped exponential backoff after a failure.

    A :class:`Listing` itself, so :func:`reconcile` asks it as it would the gateway.
    """

    WINDOW_S = 60.0

    def __init__(
        self,
        gateway: Listing,
        *,
        listings_per_minute: int = 60,
        backoff_s: tuple[float, float] = (2.0, 60.0),
        gather_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.gateway = gateway
        self.name = gateway.name
        self.listings_per_minute = max(1, listings_per_minute)
        self.backoff_s = backoff_s
        """First and longest delay after a failed listing of an instance (doubling)."""
        self.gather_s = gather_s
        """How long a new request waits for other jobs of its instance to join it."""
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._instances: dict[str, _InstanceListing] = {}
        LISTING_LIMIT.labels(self.name).set(self.listings_per_minute)

    def deferred_until(self, instance_id: str) -> float | None:
        """Epoch seconds before which the instance's listing will not be asked, or None."""
        state = self._instances.get(instance_id)
        if state is None:
            return None
        now = self._clock()
        self._forget_old(state, now)
        free_at = 0.0
        if state.retry_at > now:
            free_at = state.retry_at
        if len(state.requests) >= self.listings_per_minute:
            free_at = max(free_at, state.requests[0] + self.WINDOW_S)
        return self._wall() + (free_at - now) if free_at > now else None

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> list[ListedJob] | None:
        """Every job of the shared request (a superset of this job's): raises
        :class:`ListingDeferred` at once when the instance's listing may not be asked now.
        ``before_page`` is ignored: this object paces the requests itself."""
        state = self._instances.setdefault(instance_id, _InstanceListing())
        batch = state.collecting
        if batch is None:
            retry_at = self.deferred_until(instance_id)
            if retry_at is not None:
                raise ListingDeferred(
                    self._deferred_reason(instance_id, state, retry_at), retry_at=retry_at
                )
            batch = _Batch(asyncio.get_running_loop().create_future())
            batch.future.add_done_callback(_retrieve)
            state.collecting = batch
            asyncio.get_running_loop().create_task(self._ask(instance_id, state, batch))
        batch.references.update(references)
        if since is None:
            batch.whole = True
        elif batch.since is None or since < batch.since:
            batch.since = since
        return await asyncio.shield(batch.future)

    def _deferred_reason(self, instance_id: str, state: _InstanceListing, retry_at: float) -> str:
        wait = max(0.0, retry_at - self._wall())
        if state.retry_at > self._clock():
            return (
                f"listing of instance {instance_id} failed ({state.last_error}); "
                f"asked again in {wait:.0f}s"
            )
        return (
            f"listing of instance {instance_id} was asked {self.listings_per_minute} times in "
            f"the last minute (ZAPSTREAM_WORKER_RECONCILE_LISTINGS_PER_MINUTE); "
            f"asked again in {wait:.0f}s"
        )

    async def _ask(self, instance_id: str, state: _InstanceListing, batch: _Batch) -> None:
        try:
            await self._sleep(self.gather_s)
            async with state.lock:
                if state.collecting is batch:
                    state.collecting = None  # later jobs start the next request
                listed = await self._list(instance_id, state, batch)
        except asyncio.CancelledError:
            batch.future.cancel()
            raise
        except GatewayError as exc:
            state.failures += 1
            first, longest = self.backoff_s
            delay = min(longest, first * 2 ** (state.failures - 1))
            state.retry_at = self._clock() + self._rng.uniform(delay * 0.8, delay)
            what = "unreadable" if isinstance(exc, ListingUnreadable) else "unavailable"
            state.last_error = f"listing {what}: {exc}"[:240]
            batch.future.set_exception(exc)
            return
        except Exception as exc:  # a bug: every waiter raises it
            batch.future.set_exception(exc)
            return
        state.failures = 0
        state.retry_at = 0.0
        batch.future.set_result(listed)

    async def _list(
        self, instance_id: str, state: _InstanceListing, batch: _Batch
    ) -> list[ListedJob] | None:
        async def before_page() -> None:
            now = self._clock()
            self._forget_old(state, now)
            if len(state.requests) >= self.listings_per_minute:
                await self._sleep(state.requests[0] + self.WINDOW_S - now)
                now = self._clock()
                self._forget_old(state, now)
            state.requests.append(now)
            LISTING_REQUESTS.labels(self.name, instance_id).inc()

        return await self.gateway.list_for_reconciliation(
            instance_id,
            references=sorted(batch.references),
            since=None if batch.whole else batch.since,
            before_page=before_page,
        )

    def _forget_old(self, state: _InstanceListing, now: float) -> None:
        while state.requests and state.requests[0] <= now - self.WINDOW_S:
            state.requests.popleft()


def _retrieve(future: asyncio.Future[list[ListedJob] | None]) -> None:
    """Every waiter may have gone (a stopping worker): the error is theirs, not asyncio's."""
    if not future.cancelled():
        future.exception()
