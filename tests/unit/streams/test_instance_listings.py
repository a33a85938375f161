"""Reconciliation asks the listing per instance, not per job; within a per-minute bound;
backs off after a failure; and a job whose outcome cannot be settled waits a bounded time,
then is UNCERTAIN and its conversation moves on (issue 15, items 1 and 2)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

import pytest

from streams.job_processor import Done, JobProcessor, Park, RetryPolicy
from streams.kernel.contract import IntentCaptured, JobStatus, StatusChanged
from streams.kernel.errors import ListingUnreadable, TransientGatewayError
from streams.kernel.ports import ListedJob, SendAccepted, TextMessage
from streams.reconcile import (
    InstanceListings,
    ListingDeferred,
    Reconciliation,
    Verdict,
    reconcile,
)

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


class Clock:
    """Monotonic and wall time that move only when told; ``sleep`` moves them."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def mono(self) -> float:
        return self.t

    def wall(self) -> float:
        return NOW.timestamp() + self.t

    def now(self) -> dt.datetime:
        return NOW + dt.timedelta(seconds=self.t)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)


class CountingListing:
    """A gateway listing that counts its requests (pages) and answers from a script."""

    name = "stackzap"

    def __init__(self, listed: list[ListedJob], pages: int = 1, clock: Clock | None = None) -> None:
        self.clock = clock
        self.stamps: list[float] = []
        """The clock's time at each request."""
        self.listed = listed
        self.pages = pages
        self.calls: list[tuple[tuple[str, ...], dt.datetime | None]] = []
        self.requests = 0
        self.error: Exception | None = None

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> list[ListedJob] | None:
        self.calls.append((tuple(references), since))
        for _ in range(self.pages):
            if before_page is not None:
                await before_page()
            self.requests += 1
            if self.clock is not None:
                self.stamps.append(self.clock.t)
            await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        return list(self.listed)

    async def send_text(self, message: TextMessage) -> SendAccepted:
        raise AssertionError("reconciliation never sends")


async def reconcile_together(
    listings: InstanceListings, jobs: int, created: list[dt.datetime] | None = None
) -> list[Reconciliation]:
    """Jobs 0..jobs-1 of instance ``i`` (attempt 1 each) reconciled at the same time."""
    return await asyncio.gather(
        *(
            reconcile(
                listings,
                instance_id="i",
                job_id=n,
                to="t",
                text="x",
                authoritative=True,
                attempt_seq=1,
                created_at=created[n].isoformat() if created else None,
            )
            for n in range(jobs)
        )
    )


def listed(reference: str) -> ListedJob:
    return ListedJob(f"g-{reference}", reference, None, None, JobStatus.ACCEPTED, "queued")


async def test_jobs_of_one_instance_waiting_together_share_one_request() -> None:
    clock = Clock()
    gateway = CountingListing([listed(f"{n}-1") for n in range(0, 40, 2)])
    listings = InstanceListings(gateway, gather_s=0.01, clock=clock.mono, wall=clock.wall)
    since = [NOW - dt.timedelta(minutes=n) for n in range(40)]
    results = await reconcile_together(listings, 40, since)
    assert gateway.requests == 1, f"{gateway.requests} requests for 40 waiting jobs"
    references, asked_since = gateway.calls[0]
    assert set(references) == {f"{n}-1" for n in range(40)}
    assert asked_since is not None and asked_since <= since[39], "the earliest job's window"
    verdicts = [r.verdict for r in results]
    assert verdicts == [Verdict.ADOPT if n % 2 == 0 else Verdict.RESEND for n in range(40)]


async def test_at_most_n_requests_per_instance_in_any_minute_pages_included() -> None:
    clock = Clock()
    gateway = CountingListing([], pages=3, clock=clock)
    listings = InstanceListings(
        gateway,
        listings_per_minute=5,
        gather_s=0,
        clock=clock.mono,
        wall=clock.wall,
        sleep=clock.sleep,
    )
    deferred = 0
    for _ in range(6):
        retry_at = listings.deferred_until("i")
        if retry_at is not None:
            with pytest.raises(ListingDeferred) as info:
                await listings.list_for_reconciliation("i", references=["1-1"])
            assert info.value.retry_at == retry_at
            assert "ZAPSTREAM_WORKER_RECONCILE_LISTINGS_PER_MINUTE" in str(info.value)
            deferred += 1
            clock.t = retry_at - NOW.timestamp()
        await listings.list_for_reconciliation("i", references=["1-1"])
    assert gateway.requests == 18 and deferred >= 1
    assert max_in_window(gateway.stamps, 60.0) <= 5, gateway.stamps
    assert gateway.stamps[-1] >= 180.0, "18 requests at 5 a minute take over 3 minutes"
    # Another instance has its own bound: asked at once.
    before = clock.t
    await listings.list_for_reconciliation("j", references=["2-1"])
    assert gateway.requests == 21 and clock.t == before


def max_in_window(stamps: list[float], window: float) -> int:
    return max(
        (sum(1 for t in stamps if start <= t < start + window) for start in stamps), default=0
    )


async def test_the_bound_holds_across_pages_of_one_request() -> None:
    clock = Clock()
    gateway = CountingListing([], pages=7, clock=clock)
    listings = InstanceListings(
        gateway,
        listings_per_minute=3,
        gather_s=0,
        clock=clock.mono,
        wall=clock.wall,
        sleep=clock.sleep,
    )
    await listings.list_for_reconciliation("i")
    assert len(gateway.stamps) == 7
    assert max_in_window(gateway.stamps, 60.0) <= 3, gateway.stamps
    assert gateway.stamps[-1] >= 120.0, "pages 4 and 7 waited for the window to free"


async def test_a_failed_listing_backs_off_per_instance_capped_and_resets_on_success() -> None:
    clock = Clock()
    gateway = CountingListing([])
    gateway.error = ListingUnreadable("stackzap: listing has no array of jobs")
    listings = InstanceListings(
        gateway, gather_s=0, clock=clock.mono, wall=clock.wall, rng=random.Random(3)
    )
    delays = []
    for _ in range(8):
        with pytest.raises(ListingUnreadable):
            await listings.list_for_reconciliation("i")
        retry_at = listings.deferred_until("i")
        assert retry_at is not None
        delays.append(retry_at - clock.wall())
        with pytest.raises(ListingDeferred, match="asked again in"):
            await listings.list_for_reconciliation("i")
        clock.t += delays[-1] + 0.001
    assert gateway.requests == 8, "a deferred job asks nothing"
    assert 1.6 <= delays[0] <= 2.0 and 3.2 <= delays[1] <= 4.0
    assert all(d <= 60.0 for d in delays) and delays[-1] >= 48.0, delays
    gateway.error = None
    assert await listings.list_for_reconciliation("i") == []
    assert listings.deferred_until("i") is None


class Store:
    def __init__(self) -> None:
        self.states: dict[int, StatusChanged] = {}

    def get(self, job_id: int) -> StatusChanged | None:
        return self.states.get(job_id)

    async def put(self, state: StatusChanged, partition: int) -> None:
        self.states[state.job_id] = state


class Publisher:
    async def attempt_finished(self, record: object, key: bytes) -> Awaitable[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def job_dead(self, record: object) -> None:
        raise AssertionError("an unknown outcome never ends DEAD")


def intent(job_id: int) -> IntentCaptured:
    return IntentCaptured(
        job_id=job_id,
        idempotency_key=f"k{job_id}",
        instance_id="i",
        conversation_key=f"c{job_id}",
        to="5511987654321",
        text="hi",
        created_at=NOW.isoformat(),
        max_attempts=1,
        message_type="text",
    )


def in_flight(store: Store, job_id: int) -> None:
    """A crash after the journal write: ATTEMPTING with attempts == max_attempts."""
    store.states[job_id] = StatusChanged(
        job_id=job_id,
        idempotency_key=f"k{job_id}",
        instance_id="i",
        conversation_key=f"c{job_id}",
        status=JobStatus.ATTEMPTING,
        previous=JobStatus.PENDING,
        version=1,
        attempts=1,
        attempt_seq=1,
        attempt_id=f"{job_id}-1",
        at=NOW.isoformat(),
    )


def unreadable_processor(clock: Clock, store: Store) -> tuple[JobProcessor, CountingListing]:
    gateway = CountingListing([])
    gateway.error = ListingUnreadable("stackzap: listing has no array of jobs")
    listings = InstanceListings(gateway, gather_s=0, clock=clock.mono, wall=clock.wall)
    processor = JobProcessor(
        gateway,  # type: ignore[arg-type]
        store,
        Publisher(),  # type: ignore[arg-type]
        RetryPolicy(),
        now=clock.now,
        listings=listings,
        reconcile_max_wait_s=30.0,
    )
    return processor, gateway


async def test_an_unreadable_listing_ends_uncertain_within_the_bound_never_dead() -> None:
    clock = Clock()
    store = Store()
    processor, gateway = unreadable_processor(clock, store)
    in_flight(store, 1)
    parks = 0
    while True:
        outcome = await processor.on_intent(intent(1), 0)
        if isinstance(outcome, Done):
            break
        assert isinstance(outcome, Park) and outcome.state is not None
        assert outcome.state.status == "ATTEMPTING"
        assert outcome.due <= (NOW + dt.timedelta(seconds=30)).timestamp(), "never past the bound"
        parks += 1
        assert parks < 50
        clock.t = outcome.due - NOW.timestamp()
    assert outcome.state is not None and outcome.state.status == "UNCERTAIN"
    assert "did not conclude within 30s" in (outcome.state.reason or "")
    assert clock.t == pytest.approx(30.0, abs=1.0), f"decided at {clock.t}s, bound 30 s"
    assert gateway.requests < parks + 1 <= 12, "the backoff grows: few requests in 30 s"


async def test_a_transient_listing_failure_of_the_whole_batch_is_shared() -> None:
    clock = Clock()
    gateway = CountingListing([])
    gateway.error = TransientGatewayError("stackzap: HTTP 503")
    listings = InstanceListings(gateway, gather_s=0.01, clock=clock.mono, wall=clock.wall)
    results = await reconcile_together(listings, 10)
    assert gateway.requests == 1
    assert {r.verdict for r in results} == {Verdict.LATER}


async def test_jobs_giving_up_together_are_one_warning_per_instance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="streams.job_processor")
    clock = Clock()
    store = Store()
    processor, _ = unreadable_processor(clock, store)
    for job_id in range(1, 21):
        in_flight(store, job_id)
    for job_id in range(1, 21):  # each starts its wait
        assert isinstance(await processor.on_intent(intent(job_id), 0), Park)
    clock.t = 31.0
    outcomes = [await processor.on_intent(intent(job_id), 0) for job_id in range(1, 21)]
    assert all(isinstance(o, Done) and o.state and o.state.status == "UNCERTAIN" for o in outcomes)
    lines = [r.getMessage() for r in caplog.records if "UNCERTAIN" in r.getMessage()]
    assert len(lines) == 1 and "ZAPSTREAM_WORKER_RECONCILE_MAX_WAIT_S" in lines[0], lines
    assert "5511987654321" not in caplog.text and "hi" not in lines[0].split(";")[-1]
    in_flight(store, 99)
    assert isinstance(await processor.on_intent(intent(99), 0), Park)
    clock.t = 400.0  # past the summary interval: one line counts the 19 held back and this one
    await processor.on_intent(intent(99), 0)
    lines = [r.getMessage() for r in caplog.records if "UNCERTAIN" in r.getMessage()]
    assert len(lines) == 2 and "20 job(s) UNCERTAIN in the last" in lines[1], lines
