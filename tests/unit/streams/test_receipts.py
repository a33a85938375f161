"""Receipts apply only to the job's current attempt, each event once (issue 7, item 5)."""

from __future__ import annotations

import dataclasses
import random

from streams.job_processor import Done, JobProcessor, RetryPolicy
from streams.kernel.contract import JobStatus, ReceiptReceived, StatusChanged
from streams.kernel.ports import SendAccepted
from streams.kernel.state_machine import JobRef, transition
from streams.receipts import (
    MAX_RECEIPT_EVENTS,
    attempt_of,
    ignored_because,
    moves_forward,
    remember_event,
)
from tests.unit.streams.test_job_processor import (
    MemoryPublisher,
    MemoryStore,
    ScriptedGateway,
    _command,
    _intent,
)

S = JobStatus
REF = JobRef(7, "k", "i", "c")


def _receipt(
    label: str,
    status: str,
    event: str,
    *,
    gateway_job_id: str = "G1",
    reference: str | None = "7-1",
) -> ReceiptReceived:
    return ReceiptReceived(
        event_id=event,
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        gateway="stackzap",
        gateway_job_id=gateway_job_id,
        label=label,
        status=status,
        reference=reference,
    )


def _processor(*outcomes: SendAccepted) -> tuple[JobProcessor, MemoryStore]:
    store = MemoryStore()
    processor = JobProcessor(
        ScriptedGateway(*outcomes),
        store,
        MemoryPublisher(),
        RetryPolicy(schedule_s=(60,), jitter=0.0),
        rng=random.Random(1),
    )
    return processor, store


def _accepted(attempt_id: str = "7-2", gateway_job_id: str | None = "G2") -> StatusChanged:
    attempting = transition(
        REF, None, S.ATTEMPTING, attempts=1, attempt_seq=2, attempt_id=attempt_id
    )
    return transition(REF, attempting, S.ACCEPTED, gateway_job_id=gateway_job_id)


def test_attempt_of_reads_only_this_jobs_attempt_ids() -> None:
    assert attempt_of("7-1", 7) == "7-1"
    assert attempt_of(" 7-03 ", 7) == "7-3"
    assert attempt_of("8-1", 7) is None
    assert attempt_of("order-7-1", 7) is None
    assert attempt_of("7-x", 7) is None
    assert attempt_of(None, 7) is None and attempt_of("", 7) is None


def test_a_receipt_about_another_attempt_or_gateway_job_is_ignored() -> None:
    current = _accepted()
    old = ignored_because(current, _receipt("failed", "FAILED", "e1"))
    assert old is not None and old.reason == "other_attempt"
    assert "7-1" in old.detail and "7-2" in old.detail
    no_reference = ignored_because(current, _receipt("failed", "FAILED", "e1", reference=None))
    assert no_reference is not None and no_reference.reason == "other_gateway_job"
    foreign = ignored_because(current, _receipt("failed", "FAILED", "e1", reference="not-ours"))
    assert foreign is not None and foreign.reason == "other_gateway_job"


def test_a_receipt_about_the_current_attempt_applies() -> None:
    current = _accepted()
    assert ignored_because(current, _receipt("read", "READ", "e1", gateway_job_id="G2")) is None
    by_reference = _receipt("read", "READ", "e1", gateway_job_id="G-other", reference="7-2")
    assert ignored_because(current, by_reference) is None
    # An earlier attempt adopted by reconciliation: its gateway id is the job's.
    adopted = _accepted(attempt_id="7-2", gateway_job_id="G1")
    assert ignored_because(adopted, _receipt("read", "READ", "e1", reference="7-1")) is None
    # Nothing to compare with: applied.
    bare = _accepted(gateway_job_id=None)
    assert ignored_because(bare, _receipt("read", "READ", "e1", reference=None)) is None


def test_event_ids_are_bounded_and_most_recent_last() -> None:
    events: list[str] = []
    for n in range(MAX_RECEIPT_EVENTS + 5):
        events = remember_event(events, f"e{n}")
    assert len(events) == MAX_RECEIPT_EVENTS
    assert events[-1] == f"e{MAX_RECEIPT_EVENTS + 4}" and "e0" not in events
    assert remember_event(["a", "b"], "a") == ["b", "a"]
    seen = transition(REF, _accepted(), S.ACCEPTED, reason="a note")
    assert seen.receipt_events == []
    noted = transition(REF, _replace_events(_accepted(), ["e1"]), S.ACCEPTED, reason="note")
    assert noted.receipt_events == ["e1"], "a note keeps the job's event ids"


def _replace_events(state: StatusChanged, events: list[str]) -> StatusChanged:
    return dataclasses.replace(state, receipt_events=events)


async def test_replayed_failed_receipt_of_an_earlier_attempt_changes_nothing() -> None:
    """The incident: accepted G1, failed receipt, reprocessed, accepted G2, old "failed"
    replayed -> the job stayed ACCEPTED with G2 (it went FAILED with G1 before)."""
    p, store = _processor(
        SendAccepted("G1", "queued", S.ACCEPTED), SendAccepted("G2", "queued", S.ACCEPTED)
    )
    await p.on_intent(_intent(), 0)
    failed = await p.on_receipt(_receipt("failed", "FAILED", "e-failed"), 0)
    assert failed is not None and failed.status == "FAILED"
    outcome = await p.on_intent(_intent(), 0, reprocess=_command("reprocess"))
    assert isinstance(outcome, Done) and outcome.state is not None
    assert (outcome.state.status, outcome.state.gateway_job_id) == ("ACCEPTED", "G2")
    assert outcome.state.attempt_id == "7-2"
    history = len(store.history)
    # The same callback again (same event id), the same with a new event id, and
    # without a reference (found by its gateway id): nothing changes, no event.
    for receipt in (
        _receipt("failed", "FAILED", "e-failed"),
        _receipt("failed", "FAILED", "e-replayed"),
        _receipt("failed", "FAILED", "e-no-ref", reference=None),
        _receipt("read", "READ", "e-old-read"),
    ):
        assert await p.on_receipt(receipt, 0) is None
    state = store.get(7)
    assert state is not None and (state.status, state.gateway_job_id) == ("ACCEPTED", "G2")
    assert len(store.history) == history
    # The current attempt's receipts still apply, and its "failed" fails it.
    delivered = await p.on_receipt(
        _receipt("delivered", "DELIVERED", "e-d", gateway_job_id="G2"), 0
    )
    assert delivered is not None and delivered.status == "DELIVERED"
    assert delivered.gateway_job_id == "G2" and delivered.receipt_events[-1] == "e-d"
    now_failed = await p.on_receipt(
        _receipt("failed", "FAILED", "e-f2", gateway_job_id="G2", reference="7-2"), 0
    )
    assert now_failed is not None and now_failed.status == "FAILED"


async def test_a_duplicated_event_id_changes_nothing() -> None:
    p, store = _processor(SendAccepted("G1", "queued", S.ACCEPTED))
    await p.on_intent(_intent(), 0)
    review = await p.on_receipt(_receipt("exploded", "REVIEW", "e1"), 0)
    assert review is not None and review.status == "REVIEW"
    back = await p.on_receipt(_receipt("sent", "ACCEPTED", "e2"), 0)
    assert back is not None and back.status == "ACCEPTED"
    assert back.receipt_events == ["e1", "e2"]
    # Without the event id this would move the job to REVIEW again.
    assert await p.on_receipt(_receipt("exploded", "REVIEW", "e1"), 0) is None
    assert store.get(7).status == "ACCEPTED"  # type: ignore[union-attr]


def test_receipts_move_a_job_forward_only() -> None:
    assert moves_forward(S.ACCEPTED, S.DELIVERED) and moves_forward(S.DELIVERED, S.READ)
    assert not moves_forward(S.READ, S.DELIVERED)
    assert not moves_forward(S.DELIVERED, S.DELIVERED)
    assert moves_forward(S.DELIVERED, S.FAILED) and not moves_forward(S.READ, S.FAILED)
    assert moves_forward(S.ACCEPTED, S.REVIEW) and not moves_forward(S.DELIVERED, S.REVIEW)
