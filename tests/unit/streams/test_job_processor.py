"""JobProcessor decisions against a scripted gateway and an in-memory store (no I/O)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Awaitable, Callable, Sequence

import pytest

from streams.instance_pauses import InstancePauses
from streams.job_processor import Done, JobProcessor, Park, RetryPolicy
from streams.kernel.contract import (
    AttemptFinished,
    CommandRequested,
    IntentCaptured,
    JobDead,
    JobStatus,
    ReceiptReceived,
    StatusChanged,
)
from streams.kernel.errors import (
    InstanceUnavailableError,
    PermanentGatewayError,
    RateLimitedError,
    RecipientOptedOut,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.kernel.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.kernel.templates import TemplatePaused, TemplateRejected, WindowClosed
from streams.pacing import Pacer
from streams.reconcile import InstanceListings

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
S = JobStatus


class ScriptedGateway:
    name = "scripted"

    def __init__(self, *outcomes: SendAccepted | Exception) -> None:
        self.outcomes = list(outcomes)
        self.sent: list[TextMessage] = []
        self.listing: list[ListedJob] | None = []
        self.listing_queries: list[tuple[tuple[str, ...], dt.datetime | None]] = []
        self.cancel_outcome = CancelOutcome.CANCELLED
        self.cancelled: list[str] = []

    async def send_text(self, message: TextMessage) -> SendAccepted:
        self.sent.append(message)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> list[ListedJob] | None:
        if before_page is not None:
            await before_page()
        self.listing_queries.append((tuple(references), since))
        return self.listing

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        self.cancelled.append(gateway_job_id)
        return self.cancel_outcome

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class MemoryStore:
    def __init__(self) -> None:
        self.states: dict[int, StatusChanged] = {}
        self.history: list[StatusChanged] = []

    def get(self, job_id: int) -> StatusChanged | None:
        return self.states.get(job_id)

    async def put(self, state: StatusChanged, partition: int) -> None:
        previous = self.states.get(state.job_id)
        assert previous is None or state.version == previous.version + 1
        self.states[state.job_id] = state
        self.history.append(state)


class MemoryPublisher:
    def __init__(self) -> None:
        self.attempts: list[AttemptFinished] = []
        self.dead: list[JobDead] = []

    async def attempt_finished(self, record: AttemptFinished, key: bytes) -> Awaitable[object]:
        # Like Kafka: the record counts once its acknowledgement is awaited, so a
        # forgotten await loses the attempt here (and warns of an un-awaited coroutine).
        async def acknowledged() -> None:
            self.attempts.append(record)

        return acknowledged()

    async def job_dead(self, record: JobDead) -> None:
        self.dead.append(record)


def _intent(**kw: object) -> IntentCaptured:
    base: dict[str, object] = {
        "job_id": 7,
        "instance_id": "i",
        "conversation_key": "c",
        "idempotency_key": "k",
        "message_type": "text",
        "to": "5511987654321",
        "text": "hi",
        "max_attempts": 3,
    }
    base.update(kw)
    return IntentCaptured(**base)  # type: ignore[arg-type]


def _processor(
    gateway: ScriptedGateway,
    *,
    authoritative: bool = True,
    pauses: InstancePauses | None = None,
    listings: InstanceListings | None = None,
) -> tuple[JobProcessor, MemoryStore, MemoryPublisher]:
    store, publisher = MemoryStore(), MemoryPublisher()
    processor = JobProcessor(
        gateway,
        store,
        publisher,
        RetryPolicy(schedule_s=(60, 300), jitter=0.0),
        listing_authoritative=authoritative,
        now=lambda: NOW,
        rng=random.Random(1),
        pauses=pauses,
        listings=listings or InstanceListings(gateway, gather_s=0),
    )
    return processor, store, publisher


OK = SendAccepted("g-1", "queued", S.ACCEPTED)


async def test_journal_then_accept_with_attempt_id_as_reference() -> None:
    gw = ScriptedGateway(OK)
    p, store, pub = _processor(gw)
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Done) and outcome.state is not None
    assert [s.status for s in store.history] == ["ATTEMPTING", "ACCEPTED"]
    assert store.history[0].attempt_id == "7-1" and gw.sent[0].reference == "7-1"
    assert outcome.state.gateway_job_id == "g-1" and outcome.state.version == 2
    assert [a.outcome for a in pub.attempts] == ["accepted"]


async def test_settled_job_is_a_duplicate_and_nothing_is_sent() -> None:
    gw = ScriptedGateway(OK)
    p, store, _ = _processor(gw)
    await p.on_intent(_intent(), 0)
    again = await p.on_intent(_intent(), 0)
    assert again == Done(None) and len(gw.sent) == 1


async def test_expired_is_never_sent() -> None:
    gw = ScriptedGateway(OK)
    p, store, _ = _processor(gw)
    outcome = await p.on_intent(_intent(expires_at=(NOW - dt.timedelta(seconds=1)).isoformat()), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "EXPIRED"
    assert gw.sent == []


async def test_transient_parks_on_the_schedule_honouring_retry_after() -> None:
    gw = ScriptedGateway(TransientGatewayError("503", retry_after_s=120), OK)
    p, store, pub = _processor(gw)
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Park)
    assert outcome.due == (NOW + dt.timedelta(seconds=120)).timestamp()  # max(60, Retry-After)
    assert outcome.state.status == "RETRY_WAIT" and outcome.state.errors == ["503"]
    again = await p.on_intent(_intent(), 0)
    assert isinstance(again, Done) and again.state and again.state.status == "ACCEPTED"
    assert [m.reference for m in gw.sent] == ["7-1", "7-2"]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_rate_limit_waits_retry_after_and_spends_no_attempt() -> None:
    limited = [RateLimitedError("429", retry_after_s=2) for _ in range(5)]
    gw = ScriptedGateway(*limited, OK)
    p, store, pub = _processor(gw)
    clock = _Clock()
    p.pacer = Pacer(clock=clock)
    for n in range(5):
        outcome = await p.on_intent(_intent(), 0)
        assert isinstance(outcome, Park), n
        # Retry-After, not the schedule's 60 s; the attempt is given back every time.
        assert outcome.due == (NOW + dt.timedelta(seconds=2)).timestamp()
        assert outcome.state is not None and outcome.state.status == "RETRY_WAIT"
        assert outcome.state.attempts == 0
        # Before the wait is over the instance sends nothing: the job parks unchanged.
        held = await p.on_intent(_intent(), 0)
        assert isinstance(held, Park) and held.state == outcome.state
        clock.now += 2.0
    done = await p.on_intent(_intent(), 0)  # max_attempts is 3: five limits spent none
    assert isinstance(done, Done) and done.state and done.state.status == "ACCEPTED"
    assert [m.reference for m in gw.sent] == [f"7-{n}" for n in range(1, 7)]
    assert pub.dead == []


async def test_a_recipient_limit_backs_off_four_to_the_n() -> None:
    gw = ScriptedGateway(*[RateLimitedError("131056", limit="recipient") for _ in range(2)], OK)
    p, _, _ = _processor(gw)
    clock = _Clock()
    p.pacer = Pacer(clock=clock)
    dues = []
    for _ in range(2):
        outcome = await p.on_intent(_intent(), 0)
        assert isinstance(outcome, Park)
        dues.append(outcome.due - NOW.timestamp())
        clock.now += dues[-1]
    assert dues == [4.0, 16.0]
    other = await p.on_intent(_intent(job_id=8, conversation_key="d", idempotency_key="k8"), 0)
    assert isinstance(other, Done)  # another recipient of the instance is not held


async def test_exhausted_retries_end_dead_with_every_error_on_the_dead_topic() -> None:
    gw = ScriptedGateway(*[TransientGatewayError(f"down {n}") for n in range(3)])
    p, store, pub = _processor(gw)
    for _ in range(2):
        assert isinstance(await p.on_intent(_intent(max_attempts=3), 0), Park)
    outcome = await p.on_intent(_intent(max_attempts=3), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "DEAD"
    assert pub.dead[0].errors == ["down 0", "down 1", "down 2"]
    assert "gave up after 3 attempts" in pub.dead[0].reason


async def test_permanent_is_not_retried() -> None:
    gw = ScriptedGateway(PermanentGatewayError("401 bad key"), OK)
    p, store, _ = _processor(gw)
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "FAILED"
    assert len(gw.sent) == 1


def _listed(reference: str | None, text: str = "hi") -> ListedJob:
    return ListedJob("g-9", reference, "5511987654321", text, S.ACCEPTED, "queued")


async def test_uncertain_found_by_reference_is_adopted_not_resent() -> None:
    gw = ScriptedGateway(UncertainGatewayError("reset mid-response"))
    gw.listing = [_listed("7-1")]
    p, store, _ = _processor(gw)
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "ACCEPTED"
    assert outcome.state.gateway_job_id == "g-9" and len(gw.sent) == 1


async def test_uncertain_not_listed_is_resent_through_the_retry_budget_with_new_id() -> None:
    gw = ScriptedGateway(UncertainGatewayError("reset"), OK)
    gw.listing = [_listed("99-1")]
    p, store, _ = _processor(gw)
    outcome = await p.on_intent(_intent(), 0)
    # Not accepted: the attempt counts and the job waits on the schedule, no tight loop.
    assert isinstance(outcome, Park) and outcome.state is not None
    assert outcome.state.status == "RETRY_WAIT" and outcome.state.attempts == 1
    assert outcome.due == (NOW + dt.timedelta(seconds=60)).timestamp()
    assert len(gw.sent) == 1
    again = await p.on_intent(_intent(), 0)
    assert isinstance(again, Done) and again.state and again.state.status == "ACCEPTED"
    assert [m.reference for m in gw.sent] == ["7-1", "7-2"]
    assert again.state.attempts == 2


async def test_uncertain_resends_end_dead_at_max_attempts() -> None:
    gw = ScriptedGateway(*[UncertainGatewayError(f"reset {n}") for n in range(3)])
    gw.listing = []  # authoritative and empty: never accepted
    p, _, pub = _processor(gw)
    outcomes = [await p.on_intent(_intent(max_attempts=3), 0) for _ in range(3)]
    assert [type(o) for o in outcomes] == [Park, Park, Done]
    last = outcomes[-1]
    assert isinstance(last, Done) and last.state and last.state.status == "DEAD"
    assert len(gw.sent) == 3 and len(pub.dead) == 1


async def test_uncertain_with_listing_unavailable_stays_attempting_and_reconciles_first() -> None:
    gw = ScriptedGateway(UncertainGatewayError("502 after accept"))

    class FlakyListing:
        calls = 0

    async def listing(instance_id: str, **_: object) -> list[ListedJob] | None:
        FlakyListing.calls += 1
        if FlakyListing.calls == 1:
            raise TransientGatewayError("listing timed out")
        return [_listed("7-1")]

    gw.list_for_reconciliation = listing  # type: ignore[method-assign]
    clock = [1000.0]
    listings = InstanceListings(
        gw,
        gather_s=0,
        clock=lambda: clock[0],
        wall=lambda: NOW.timestamp() + clock[0] - 1000.0,
    )
    p, store, _ = _processor(gw, listings=listings)
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Park) and outcome.state is not None
    assert outcome.state.status == "ATTEMPTING" and outcome.state.next_retry_at
    # Asked again at once, the instance's listing is backing off: LATER, nothing asked.
    deferred = await p.on_intent(_intent(), 0)
    assert isinstance(deferred, Park) and FlakyListing.calls == 1
    waited = deferred.due - NOW.timestamp()
    assert 1.6 <= waited <= 2.0, f"the instance's first backoff step is 2 s, not {waited}"
    clock[0] += 2.0
    again = await p.on_intent(_intent(), 0)
    assert isinstance(again, Done) and again.state and again.state.status == "ACCEPTED"
    assert len(gw.sent) == 1, "never resent before the listing was read"


async def test_hidden_references_match_by_content_or_end_uncertain() -> None:
    gw = ScriptedGateway(UncertainGatewayError("reset"))
    gw.listing = [_listed(None, "hi")]
    p, _, _ = _processor(gw, authoritative=False)
    adopted = await p.on_intent(_intent(), 0)
    assert isinstance(adopted, Done) and adopted.state and adopted.state.status == "ACCEPTED"

    gw2 = ScriptedGateway(UncertainGatewayError("reset"))
    gw2.listing = [_listed(None, "other text")]
    p2, _, _ = _processor(gw2, authoritative=False)
    unknown = await p2.on_intent(_intent(), 0)
    assert isinstance(unknown, Done) and unknown.state and unknown.state.status == "UNCERTAIN"
    assert len(gw2.sent) == 1

    gw3 = ScriptedGateway(UncertainGatewayError("reset"))
    gw3.listing = [_listed(None, "hi"), _listed(None, "hi")]
    p3, _, _ = _processor(gw3, authoritative=True)
    ambiguous = await p3.on_intent(_intent(), 0)
    assert isinstance(ambiguous, Done) and ambiguous.state
    assert ambiguous.state.status == "UNCERTAIN" and "2 jobs" in (ambiguous.state.reason or "")


async def test_redelivered_while_attempting_is_reconciled_before_any_resend() -> None:
    gw = ScriptedGateway(OK)
    gw.listing = [_listed("7-1")]
    p, store, _ = _processor(gw)
    # A previous owner journaled attempt 7-1 and died before recording the outcome.
    from streams.job_processor import job_ref
    from streams.kernel.state_machine import transition

    store.states[7] = transition(
        job_ref(_intent()), None, S.ATTEMPTING, attempts=1, attempt_seq=1, attempt_id="7-1"
    )
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "ACCEPTED"
    assert gw.sent == []


def _command(command: str, **kw: object) -> CommandRequested:
    base: dict[str, object] = {
        "command_id": 1,
        "command": command,
        "job_id": 7,
        "idempotency_key": "k",
        "instance_id": "i",
        "conversation_key": "c",
        "reason": "customer asked",
        "actor": "ops:ana",
    }
    base.update(kw)
    return CommandRequested(**base)  # type: ignore[arg-type]


async def test_reprocess_dead_job_sends_once_more_with_fresh_attempt_id() -> None:
    gw = ScriptedGateway(*[TransientGatewayError("down")] * 3, OK)
    p, store, _ = _processor(gw)
    for _ in range(3):
        await p.on_intent(_intent(max_attempts=3), 0)
    assert store.get(7) and store.get(7).status == "DEAD"  # type: ignore[union-attr]
    cmd = _command("reprocess", intent=_intent(max_attempts=3).to_dict())
    outcome = await p.on_intent(_intent(max_attempts=3), 0, reprocess=cmd)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "ACCEPTED"
    assert gw.sent[-1].reference == "7-4"
    note = [s for s in store.history if s.actor == "ops:ana"]
    assert note and "reprocess requested: customer asked" in (note[0].reason or "")


async def test_reprocess_refused_unless_dead_uncertain_or_failed() -> None:
    gw = ScriptedGateway(OK)
    p, store, _ = _processor(gw)
    await p.on_intent(_intent(), 0)
    outcome = await p.on_intent(_intent(), 0, reprocess=_command("reprocess"))
    assert isinstance(outcome, Done) and outcome.state and "refused" in (outcome.state.reason or "")
    assert len(gw.sent) == 1


async def test_cancel_before_sending_and_after_acceptance() -> None:
    gw = ScriptedGateway(OK)
    p, store, _ = _processor(gw)
    assert p.cancels_without_gateway(_command("cancel"))
    cancelled = await p.on_cancel(_command("cancel"), 0)
    assert cancelled and cancelled.status == "CANCELLED" and cancelled.actor == "ops:ana"
    assert await p.on_intent(_intent(), 0) == Done(None)
    assert gw.sent == []

    gw2 = ScriptedGateway(OK)
    p2, _, _ = _processor(gw2)
    await p2.on_intent(_intent(), 0)
    assert not p2.cancels_without_gateway(_command("cancel"))
    confirmed = await p2.on_cancel(_command("cancel"), 0)
    assert confirmed and confirmed.status == "CANCELLED" and gw2.cancelled == ["g-1"]

    gw3 = ScriptedGateway(OK)
    gw3.cancel_outcome = CancelOutcome.REFUSED
    p3, _, _ = _processor(gw3)
    await p3.on_intent(_intent(), 0)
    refused = await p3.on_cancel(_command("cancel"), 0)
    assert refused and refused.status == "ACCEPTED" and "already sent" in (refused.reason or "")


def _receipt(label: str, status: str, event: str) -> ReceiptReceived:
    return ReceiptReceived(
        event_id=event,
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        gateway="scripted",  # the gateway the attempt went through
        gateway_job_id="g-1",
        label=label,
        status=status,
    )


async def test_receipts_move_forward_only_and_duplicates_change_nothing() -> None:
    gw = ScriptedGateway(OK)
    p, store, _ = _processor(gw)
    await p.on_intent(_intent(), 0)
    assert (await p.on_receipt(_receipt("read", "READ", "e3"), 0)).status == "READ"  # type: ignore[union-attr]
    assert await p.on_receipt(_receipt("sent", "ACCEPTED", "e1"), 0) is None
    assert await p.on_receipt(_receipt("delivered", "DELIVERED", "e2"), 0) is None
    assert await p.on_receipt(_receipt("read", "READ", "e3"), 0) is None
    assert store.get(7).status == "READ"  # type: ignore[union-attr]


async def test_a_failed_receipt_records_the_gateways_reason() -> None:
    gw = ScriptedGateway(OK)
    p, store, _ = _processor(gw)
    await p.on_intent(_intent(), 0)
    failed = dataclasses.replace(
        _receipt("failed", "FAILED", "e9"), reason="131026 Message undeliverable"
    )
    moved = await p.on_receipt(failed, 0)
    assert moved is not None and moved.status == "FAILED"
    assert moved.reason == "receipt 'failed': 131026 Message undeliverable"


@pytest.mark.parametrize(("attempts", "expected"), [(1, 60), (2, 300), (5, 300)])
def test_schedule_steps_and_last_repeats(attempts: int, expected: float) -> None:
    assert (
        RetryPolicy(schedule_s=(60, 300), jitter=0).delay_s(attempts, None, random.Random(0))
        == expected
    )


# --- instance pauses -----------------------------------------------------------------

REFUSED = InstanceUnavailableError("stackzap: HTTP 401: unauthorized", status_code=401)


async def test_refused_instance_parks_the_job_without_spending_its_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = ScriptedGateway(REFUSED, OK)
    pauses = InstancePauses(probe_interval_s=30)
    p, store, _ = _processor(gw, pauses=pauses)
    outcome = await p.on_intent(_intent(max_attempts=1), 0)
    assert isinstance(outcome, Park) and outcome.state is not None
    assert outcome.state.status == "RETRY_WAIT" and outcome.state.attempts == 0
    assert outcome.due == (NOW + dt.timedelta(seconds=30)).timestamp()
    assert outcome.state.errors == []
    assert pauses.paused("i")
    paused_lines = [r for r in caplog.records if "paused" in r.getMessage()]
    assert len(paused_lines) == 1 and paused_lines[0].levelname == "ERROR"
    assert "refused credentials (401)" in paused_lines[0].getMessage()
    # The probe succeeds: the job is sent, with max_attempts=1 still available.
    probed = await p.on_intent(_intent(max_attempts=1), 0, probe=True)
    assert isinstance(probed, Done) and probed.state and probed.state.status == "ACCEPTED"
    assert not pauses.paused("i")
    assert [m.reference for m in gw.sent] == ["7-1", "7-2"]


async def test_paused_instance_holds_other_intents_without_calling_the_gateway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = ScriptedGateway(REFUSED, OK)
    p, store, _ = _processor(gw, pauses=InstancePauses(probe_interval_s=30))
    await p.on_intent(_intent(), 0)
    for job in (8, 9, 10):
        held = await p.on_intent(_intent(job_id=job, conversation_key=f"c{job}"), 0)
        assert isinstance(held, Park) and held.state is None  # still PENDING, unchanged
    assert len(gw.sent) == 1
    assert 8 not in store.states
    # Another instance flows.
    other = await p.on_intent(_intent(job_id=11, instance_id="j"), 0)
    assert isinstance(other, Done) and other.state and other.state.status == "ACCEPTED"
    assert len([r for r in caplog.records if "paused" in r.getMessage()]) == 1


async def test_failed_probes_never_spend_attempts_or_kill_the_job() -> None:
    gw = ScriptedGateway(*[REFUSED] * 10)
    pauses = InstancePauses(probe_interval_s=30)
    p, store, pub = _processor(gw, pauses=pauses)
    for _ in range(10):
        outcome = await p.on_intent(_intent(max_attempts=2), 0, probe=True)
        assert isinstance(outcome, Park) and outcome.state is not None
        assert outcome.state.status == "RETRY_WAIT" and outcome.state.attempts == 0
    assert pub.dead == [] and pauses.paused("i")
    assert store.states[7].attempt_seq == 10  # every probe had its own attempt id


async def test_refused_listing_during_reconciliation_pauses_and_keeps_attempting() -> None:
    gw = ScriptedGateway(UncertainGatewayError("reset"))

    async def refused_listing(instance_id: str, **_: object) -> list[ListedJob] | None:
        raise REFUSED

    gw.list_for_reconciliation = refused_listing  # type: ignore[method-assign]
    pauses = InstancePauses(probe_interval_s=30)
    p, store, _ = _processor(gw, pauses=pauses)
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Park) and outcome.state is not None
    assert outcome.state.status == "ATTEMPTING" and pauses.paused("i")
    assert store.states[7].status == "ATTEMPTING"


async def test_a_transient_probe_keeps_the_instance_paused() -> None:
    gw = ScriptedGateway(REFUSED, TransientGatewayError("503"))
    pauses = InstancePauses(probe_interval_s=30)
    p, _, _ = _processor(gw, pauses=pauses)
    await p.on_intent(_intent(), 0)
    outcome = await p.on_intent(_intent(), 0, probe=True)
    assert isinstance(outcome, Park) and pauses.paused("i")


def test_probe_claimed_once_per_interval_and_release_window() -> None:
    pauses = InstancePauses(probe_interval_s=30)
    t0 = 1000.0
    due = pauses.pause("i", REFUSED, t0, parked=False)
    assert due == t0 + 30
    assert not pauses.claim_probe("i", t0 + 29)
    assert pauses.claim_probe("i", t0 + 30)
    assert not pauses.claim_probe("i", t0 + 31)
    assert pauses.claim_probe("i", t0 + 60)
    assert pauses.resume("i", t0 + 61) and not pauses.resume("i", t0 + 62)
    assert pauses.released("i", t0 + 90, t0 + 62)  # parked for the pause: runs now
    assert not pauses.released("i", t0 + 9000, t0 + 62)  # a long backoff keeps its time
    assert not pauses.released("i", t0 + 90, t0 + 200)  # window over


async def test_reprocess_of_a_paused_instance_is_not_dropped() -> None:
    gw = ScriptedGateway(*[TransientGatewayError("down")] * 3, REFUSED, REFUSED, OK)
    p, store, _ = _processor(gw, pauses=InstancePauses(probe_interval_s=30))
    for _ in range(3):
        await p.on_intent(_intent(max_attempts=3), 0)
    await p.on_intent(_intent(job_id=8, conversation_key="c8"), 0)  # pauses the instance
    cmd = _command("reprocess", intent=_intent(max_attempts=3).to_dict())
    outcome = await p.on_intent(_intent(max_attempts=3), 0, reprocess=cmd)
    # Sent (as a probe would be), refused: waiting in RETRY_WAIT, not left DEAD.
    assert isinstance(outcome, Park) and outcome.state and outcome.state.status == "RETRY_WAIT"
    probed = await p.on_intent(_intent(max_attempts=3), 0, probe=True)
    assert isinstance(probed, Done) and probed.state and probed.state.status == "ACCEPTED"


async def test_failures_in_a_row_trip_the_instance_breaker() -> None:
    gw = ScriptedGateway(*[TransientGatewayError(f"503 #{n}") for n in range(3)], OK)
    p, _, _ = _processor(gw)
    p.breaker_failures = 3
    for n in range(3):
        outcome = await p.on_intent(
            _intent(job_id=10 + n, conversation_key=f"c{n}", idempotency_key=f"k{n}"), 0
        )
        assert isinstance(outcome, Park) and outcome.state and outcome.state.status == "RETRY_WAIT"
    assert p.pauses.paused("i")
    held = await p.on_intent(_intent(job_id=20, conversation_key="d", idempotency_key="k20"), 0)
    assert isinstance(held, Park) and held.state is None  # waits unchanged, nothing sent
    assert len(gw.sent) == 3
    probe = await p.on_intent(
        _intent(job_id=20, conversation_key="d", idempotency_key="k20"), 0, probe=True
    )
    assert isinstance(probe, Done) and not p.pauses.paused("i")


async def test_a_held_instance_parks_its_jobs_unchanged_and_a_reprocess_goes_through() -> None:
    gw = ScriptedGateway(OK, OK)
    p, store, _ = _processor(gw)

    @dataclasses.dataclass
    class Ctl:
        kind: str
        target: str
        action: str
        reason: str = "maintenance"
        actor: str = "ana"

    p.controls.apply(Ctl("campaign", "promo", "pause"), NOW.timestamp())
    held = await p.on_intent(_intent(purpose="promo"), 0)
    assert isinstance(held, Park) and held.state is None and gw.sent == []
    assert held.due >= NOW.timestamp() + 3600
    other = await p.on_intent(_intent(job_id=8, idempotency_key="k8", purpose="otp"), 0)
    assert isinstance(other, Done) and len(gw.sent) == 1
    p.controls.apply(Ctl("campaign", "promo", "resume"), NOW.timestamp())
    done = await p.on_intent(_intent(purpose="promo"), 0)
    assert isinstance(done, Done) and done.state and done.state.status == "ACCEPTED"


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_gateway_call_and_accepted_to_delivered_are_observed() -> None:
    gw = ScriptedGateway(OK)
    p, _, _ = _processor(gw)
    calls = _sample("zapstream_gateway_call_seconds_count", gateway=gw.name, outcome="accepted")
    delivered = _sample("zapstream_accepted_to_delivered_seconds_count", instance="i")
    await p.on_intent(_intent(), 0)
    assert (
        _sample("zapstream_gateway_call_seconds_count", gateway=gw.name, outcome="accepted")
        == calls + 1
    )
    await p.on_receipt(_receipt("delivered", "DELIVERED", "e1"), 0)
    await p.on_receipt(_receipt("read", "READ", "e2"), 0)  # not from ACCEPTED: not again
    assert _sample("zapstream_accepted_to_delivered_seconds_count", instance="i") == delivered + 1


# --- templates ------------------------------------------------------------------------------

TEMPLATE = {"name": "order_update", "language": {"code": "pt_BR"}}


class TemplateGateway(ScriptedGateway):
    """Meta's: it sends templates."""

    sends_templates = True


def _template_intent(job_id: int = 7, to: str = "5511987654321", **kw: object) -> IntentCaptured:
    return _intent(
        job_id=job_id,
        idempotency_key=f"k{job_id}",
        conversation_key=f"c{job_id}",
        to=to,
        message_type="template",
        text="[template order_update/pt_BR]",
        template=TEMPLATE,
        **kw,
    )


async def test_a_template_intent_is_sent_with_its_template() -> None:
    gw = TemplateGateway(OK)
    p, store, _ = _processor(gw)
    outcome = await p.on_intent(_template_intent(), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "ACCEPTED"
    assert gw.sent[0].template == TEMPLATE


async def test_a_gateway_without_templates_fails_a_template_intent_without_calling_it() -> None:
    gw = ScriptedGateway(OK)
    p, store, pub = _processor(gw)
    outcome = await p.on_intent(_template_intent(), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "FAILED"
    assert gw.sent == []
    assert outcome.state.reason is not None
    assert "cannot send WhatsApp templates" in outcome.state.reason
    assert "ZAPSTREAM_GATEWAY=meta" in outcome.state.reason
    assert [a.outcome for a in pub.attempts] == ["permanent"]


async def test_a_closed_window_sends_the_fallback_template_once_in_place_of_the_text() -> None:
    closed = WindowClosed("meta: HTTP 400: code 131047: Re-engagement message", status_code=400)
    gw = TemplateGateway(closed, OK)
    p, store, pub = _processor(gw)
    outcome = await p.on_intent(_intent(template=TEMPLATE), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "ACCEPTED"
    text, template = gw.sent
    assert (text.template, text.text) == (None, "hi")
    assert template.template == TEMPLATE and template.reference == "7-2"
    assert [s.status for s in store.history] == [
        "ATTEMPTING",
        "ATTEMPTING",
        "ATTEMPTING",
        "ACCEPTED",
    ]
    assert "sending the fallback template order_update/pt_BR" in str(store.history[1].reason)
    assert outcome.state.attempts == 1, "the refused text's attempt is given back"
    attempts = sorted((a.attempt, a.outcome) for a in pub.attempts)
    assert attempts == [(1, "permanent"), (2, "accepted")]


async def test_a_closed_window_without_a_fallback_fails_the_text() -> None:
    gw = TemplateGateway(WindowClosed("code 131047", status_code=400))
    p, _, _ = _processor(gw)
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "FAILED"
    assert len(gw.sent) == 1


async def test_template_errors_fail_the_job_and_never_pause_the_instance() -> None:
    errors = [TemplateRejected("code 132001: no such template", code=132001) for _ in range(7)]
    gw = TemplateGateway(*errors, OK)
    p, _, _ = _processor(gw)
    for n in range(7):
        outcome = await p.on_intent(_template_intent(job_id=10 + n, to=f"55119876543{n:02d}"), 0)
        assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "FAILED"
        assert "no such template" in str(outcome.state.reason)
    assert not p.pauses.paused("i"), "a template's fault is not the number's"


async def test_a_paused_template_holds_its_jobs_until_a_re_check_gets_through() -> None:
    paused = TemplatePaused("code 132015: Template is Paused", code=132015, status_code=400)
    gw = TemplateGateway(paused, OK, OK, OK)
    p, store, _ = _processor(gw)
    recheck = p.template_pauses.recheck_interval_s
    first = await p.on_intent(_template_intent(job_id=1), 0)
    assert isinstance(first, Park) and first.state is not None
    assert first.state.status == "RETRY_WAIT" and first.state.attempts == 0
    assert first.due == NOW.timestamp() + recheck
    assert "template order_update/pt_BR paused by Meta" in str(first.state.reason)
    # Another job of the template waits unchanged, Meta not called; a text goes on.
    held = await p.on_intent(_template_intent(job_id=2), 0)
    assert isinstance(held, Park) and held.state is None and held.due == first.due
    text = await p.on_intent(_intent(job_id=3, idempotency_key="k3", conversation_key="c3"), 0)
    assert isinstance(text, Done) and len(gw.sent) == 2
    # At the re-check, one job goes; the other waits for its answer, then follows.
    later = NOW + dt.timedelta(seconds=recheck)
    p.now = lambda: later
    probe = await p.on_intent(_template_intent(job_id=1), 0)
    assert isinstance(probe, Done) and probe.state and probe.state.status == "ACCEPTED"
    assert p.template_pauses.paused() == []
    follows = await p.on_intent(_template_intent(job_id=2), 0)
    assert isinstance(follows, Done) and follows.state and follows.state.status == "ACCEPTED"
    assert [m.template is not None for m in gw.sent] == [True, False, True, True]


async def test_while_a_template_re_check_is_in_flight_the_others_wait_briefly() -> None:
    from streams.template_pauses import PROBE_WAIT_S, TemplatePauses

    pauses = TemplatePauses(recheck_interval_s=100)
    assert pauses.pause("i", "t/pt_BR", "132015", 0.0) == 100.0
    assert pauses.hold("i", "t/pt_BR", 50.0) == 100.0
    assert pauses.hold("i", "t/pt_BR", 100.0) is None  # the re-check
    assert pauses.hold("i", "t/pt_BR", 101.0) == 101.0 + PROBE_WAIT_S
    assert pauses.pause("i", "t/pt_BR", "132015", 102.0) == 202.0  # still paused
    assert pauses.hold("i", "t/pt_BR", 103.0) == 202.0
    assert pauses.hold("i", "other/pt_BR", 103.0) is None
    assert pauses.resume("i", "t/pt_BR", 203.0) and pauses.hold("i", "t/pt_BR", 203.0) is None


# --- opt-outs (streams/optouts.py) -----------------------------------------------------


def _opted_out(processor: JobProcessor, instance: str = "i", person: str = "5511987654321") -> None:
    processor.optouts.add(instance, person)


async def test_a_bulk_job_to_an_opted_out_recipient_ends_opted_out_never_sent() -> None:
    gw = ScriptedGateway(OK)
    p, store, pub = _processor(gw)
    _opted_out(p)
    outcome = await p.on_intent(_intent(priority="bulk", to="5511987654321@s.whatsapp.net"), 0)
    assert isinstance(outcome, Done) and outcome.state is not None
    assert outcome.state.status == "OPTED_OUT" and outcome.state.actor == "worker"
    assert "opted out" in (outcome.state.reason or "")
    assert gw.sent == [] and [a.outcome for a in pub.attempts] == ["opted_out"]
    assert [s.status for s in store.history] == ["OPTED_OUT"]


async def test_an_operational_job_is_sent_unless_it_respects_the_opt_out() -> None:
    gw = ScriptedGateway(OK, OK)
    p, _, _ = _processor(gw)
    _opted_out(p)
    sent = await p.on_intent(_intent(), 0)
    assert isinstance(sent, Done) and sent.state and sent.state.status == "ACCEPTED"
    marked = await p.on_intent(_intent(job_id=8, idempotency_key="k8", respect_opt_out=True), 0)
    assert isinstance(marked, Done) and marked.state and marked.state.status == "OPTED_OUT"
    # A bulk job the application marked respect_opt_out=False is sent too.
    bulk = await p.on_intent(
        _intent(job_id=9, idempotency_key="k9", priority="bulk", respect_opt_out=False), 0
    )
    assert isinstance(bulk, Done) and bulk.state and bulk.state.status == "ACCEPTED"
    assert len(gw.sent) == 2


async def test_an_opt_in_sends_bulk_again_and_other_instances_are_not_touched() -> None:
    gw = ScriptedGateway(OK, OK)
    p, _, _ = _processor(gw)
    _opted_out(p, instance="other")
    other = await p.on_intent(_intent(priority="bulk"), 0)
    assert isinstance(other, Done) and other.state and other.state.status == "ACCEPTED"
    _opted_out(p)
    p.optouts.remove("i", "5511987654321")
    again = await p.on_intent(_intent(job_id=8, idempotency_key="k8", priority="bulk"), 0)
    assert isinstance(again, Done) and again.state and again.state.status == "ACCEPTED"


async def test_a_bulk_job_waits_until_the_opt_out_list_is_read() -> None:
    gw = ScriptedGateway(OK)
    p, store, _ = _processor(gw)
    p.optouts.ready = False
    outcome = await p.on_intent(_intent(priority="bulk"), 0)
    assert isinstance(outcome, Park) and outcome.state is None
    assert gw.sent == [] and store.history == []
    # An operational job does not wait: the list cannot stop it.
    sent = await p.on_intent(_intent(job_id=8, idempotency_key="k8"), 0)
    assert isinstance(sent, Done) and sent.state and sent.state.status == "ACCEPTED"


async def test_a_job_waiting_for_a_retry_meets_an_opt_out_made_meanwhile() -> None:
    gw = ScriptedGateway(TransientGatewayError("503"), OK)
    p, store, _ = _processor(gw)
    first = await p.on_intent(_intent(priority="bulk"), 0)
    assert isinstance(first, Park) and store.get(7).status == "RETRY_WAIT"  # type: ignore[union-attr]
    _opted_out(p)
    retried = await p.on_intent(_intent(priority="bulk"), 0)
    assert isinstance(retried, Done) and retried.state and retried.state.status == "OPTED_OUT"
    assert len(gw.sent) == 1


async def test_the_gateways_opt_out_ends_the_job_and_is_honoured_at_once() -> None:
    refused = RecipientOptedOut("meta: HTTP 400: code 131050: opted out", status_code=400)
    gw = ScriptedGateway(*([refused] * 6), OK)
    p, store, pub = _processor(gw)
    outcome = await p.on_intent(_intent(), 0)
    assert isinstance(outcome, Done) and outcome.state is not None
    assert outcome.state.status == "OPTED_OUT" and outcome.state.actor == "gateway:scripted"
    assert [s.status for s in store.history] == ["ATTEMPTING", "OPTED_OUT"]
    assert [a.outcome for a in pub.attempts] == ["permanent"]
    # Before the opt-out's round trip through PostgreSQL: a bulk job is not sent.
    bulk = await p.on_intent(_intent(job_id=8, idempotency_key="k8", priority="bulk"), 0)
    assert isinstance(bulk, Done) and bulk.state and bulk.state.status == "OPTED_OUT"
    assert len(gw.sent) == 1
    # Opt-outs of many recipients in a row are not a configuration fault: none pauses.
    for n in range(5):
        to = f"55119876500{n:02d}"
        done = await p.on_intent(_intent(job_id=20 + n, idempotency_key=f"x{n}", to=to), 0)
        assert isinstance(done, Done) and done.state and done.state.status == "OPTED_OUT"
    assert not p.pauses.paused("i")


async def test_metas_failed_status_with_131050_ends_the_job_opted_out() -> None:
    gw = ScriptedGateway(OK)
    gw.name = "meta"
    p, _, _ = _processor(gw)
    await p.on_intent(_intent(), 0)
    receipt = dataclasses.replace(
        _receipt("failed", "FAILED", "e1"),
        gateway="meta",
        phone_number_id="i",
        reason="131050 Unable to deliver the message: the recipient stopped marketing messages",
    )
    moved = await p.on_receipt(receipt, 0)
    assert moved is not None and moved.status == "OPTED_OUT" and moved.actor == "gateway:meta"
    # Another code, or 131050 from another gateway, is a plain FAILED.
    p2, _, _ = _processor(ScriptedGateway(OK))
    await p2.on_intent(_intent(), 0)
    other = dataclasses.replace(_receipt("failed", "FAILED", "e2"), reason="131050 opted out")
    failed = await p2.on_receipt(other, 0)
    assert failed is not None and failed.status == "FAILED"


async def test_quiet_hours_hold_a_bulk_job_until_the_window_ends_not_an_operational_one() -> None:
    from streams.quiet_hours import QuietHours

    gw = ScriptedGateway(OK, OK)
    p, store, _ = _processor(gw)
    # A window around NOW in the recipient's zone (Sao Paulo, from the calling code 55).
    local = NOW.astimezone(dt.timezone(dt.timedelta(hours=-3)))
    start = (local - dt.timedelta(minutes=5)).strftime("%H:%M:%S")
    end_local = local + dt.timedelta(minutes=30)
    p.quiet_hours = QuietHours.parse(f"{start}-{end_local.strftime('%H:%M:%S')}")
    ends = end_local.astimezone(dt.UTC).replace(microsecond=0)

    held = await p.on_intent(_intent(priority="bulk"), 0)
    assert isinstance(held, Done) and held.state is not None and held.state.status == "SCHEDULED"
    assert held.state.next_retry_at == ends.isoformat() and gw.sent == []
    # Never past its expiry: released then, and the attempt settles it EXPIRED.
    soon = NOW + dt.timedelta(minutes=10)
    capped = await p.on_intent(_intent(job_id=8, priority="bulk", expires_at=soon.isoformat()), 0)
    assert (
        isinstance(capped, Done) and capped.state and capped.state.next_retry_at == soon.isoformat()
    )
    # An operational job to the same recipient goes now.
    sent = await p.on_intent(_intent(job_id=9), 0)
    assert isinstance(sent, Done) and sent.state and sent.state.status == "ACCEPTED"
    # Released after the window: SCHEDULED -> ATTEMPTING -> ACCEPTED.
    p.quiet_hours = None
    later = await p.on_intent(_intent(priority="bulk"), 0)
    assert isinstance(later, Done) and later.state and later.state.status == "ACCEPTED"
    assert [s.status for s in store.history if s.job_id == 7] == [
        "SCHEDULED",
        "ATTEMPTING",
        "ACCEPTED",
    ]
