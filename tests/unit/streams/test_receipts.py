"""Receipts apply only to the job's current attempt, each event once (issue 7, item 5)."""

from __future__ import annotations

import dataclasses
import random

from streams.job_processor import Done, JobProcessor, RetryPolicy
from streams.kernel.attempt_reference import (
    TAG_HEX,
    ParsedReference,
    ReferenceKey,
    parse_reference,
)
from streams.kernel.contract import JobStatus, ReceiptReceived, StatusChanged
from streams.kernel.errors import UncertainGatewayError
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


class StackZapScripted(ScriptedGateway):
    """The scripted gateway under StackZap's name: the receipts here come from its path."""

    name = "stackzap"


KEY = ReferenceKey("a deployment's reference key, 32+ characters")
TAGGED_2 = KEY.reference("stackzap", "i", 7, 2)
"""The reference attempt 2 of job 7 told StackZap for instance ``i``."""


def _receipt(
    label: str,
    status: str,
    event: str,
    *,
    gateway_job_id: str = "G1",
    reference: str | None = "7-1",
    gateway: str = "stackzap",
) -> ReceiptReceived:
    return ReceiptReceived(
        event_id=event,
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        gateway=gateway,
        gateway_job_id=gateway_job_id,
        label=label,
        status=status,
        reference=reference,
    )


def _processor(*outcomes: SendAccepted) -> tuple[JobProcessor, MemoryStore]:
    store = MemoryStore()
    gateway = StackZapScripted(*outcomes)
    processor = JobProcessor(
        gateway,
        store,
        MemoryPublisher(),
        RetryPolicy(schedule_s=(60,), jitter=0.0),
        rng=random.Random(1),
        references=KEY,
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


def _ignored(current: StatusChanged, receipt: ReceiptReceived) -> str | None:
    why = ignored_because(current, receipt, gateway="stackzap", key=KEY)
    return why.reason if why is not None else None


def test_a_receipt_about_another_attempt_or_gateway_job_is_ignored() -> None:
    current = _accepted()
    old = ignored_because(current, _receipt("failed", "FAILED", "e1"), gateway="stackzap", key=KEY)
    assert old is not None and old.reason == "other_attempt"
    assert "7-1" in old.detail and "7-2" in old.detail
    assert _ignored(current, _receipt("failed", "FAILED", "e1", reference=None)) == (
        "other_gateway_job"
    )
    foreign = _receipt("failed", "FAILED", "e1", reference="not-ours")
    assert _ignored(current, foreign) == "other_gateway_job"


def test_a_receipt_about_the_current_attempt_applies() -> None:
    current = _accepted()
    assert _ignored(current, _receipt("read", "READ", "e1", gateway_job_id="G2")) is None
    tagged = _receipt("read", "READ", "e1", gateway_job_id="G2", reference=TAGGED_2)
    assert _ignored(current, tagged) is None
    # The attempt recorded no gateway job id (a send answered without one): the verified
    # reference binds the receipt, and fills the id in.
    bare = _accepted(gateway_job_id=None)
    assert _ignored(bare, _receipt("read", "READ", "e1", reference=TAGGED_2)) is None
    # An earlier attempt adopted by reconciliation: its gateway id is the job's.
    adopted = _accepted(attempt_id="7-2", gateway_job_id="G1")
    assert _ignored(adopted, _receipt("read", "READ", "e1", reference=None)) is None


# --- binding (issue 18, finding 2) ---------------------------------------------------------


def test_the_same_receipt_replayed_to_another_gateway_path_does_not_bind() -> None:
    current = _accepted()
    at_stackzap = _receipt("read", "READ", "e1", gateway_job_id="G2", reference=TAGGED_2)
    assert _ignored(current, at_stackzap) is None
    # The same bytes POSTed to /v1/webhooks/zapapi: the path names another gateway.
    replayed = dataclasses.replace(at_stackzap, gateway="zapapi")
    assert _ignored(current, replayed) == "bad_reference"
    untagged = dataclasses.replace(replayed, reference=None)
    assert _ignored(current, untagged) == "other_gateway"
    legacy = dataclasses.replace(replayed, reference="7-2")
    assert _ignored(current, legacy) == "other_gateway"


def test_a_receipt_with_another_gateway_job_id_does_not_bind_even_with_the_reference() -> None:
    current = _accepted()
    other = _receipt("failed", "FAILED", "e1", gateway_job_id="G-other", reference=TAGGED_2)
    why = ignored_because(current, other, gateway="stackzap", key=KEY)
    assert why is not None and why.reason == "other_gateway_job"
    assert "G-other" in why.detail and "G2" in why.detail


def test_a_meta_receipt_with_another_phone_number_id_does_not_bind() -> None:
    meta_key_ref = KEY.reference("meta", "i", 7, 2)
    current = _accepted()
    mine = dataclasses.replace(
        _receipt("read", "READ", "e1", gateway_job_id="G2", reference=meta_key_ref),
        gateway="meta",
        phone_number_id="i",
    )
    assert ignored_because(current, mine, gateway="meta", key=KEY) is None
    for other in ("106540352242922", None):
        moved = dataclasses.replace(mine, phone_number_id=other)
        why = ignored_because(current, moved, gateway="meta", key=KEY)
        assert why is not None and why.reason == "other_phone_number"


def test_references_are_unguessable_and_specific_to_gateway_instance_and_deployment() -> None:
    current = _accepted()
    other_deployment = ReferenceKey("another deployment's key, 32+ chars").reference(
        "stackzap", "i", 7, 2
    )
    for forged in (
        other_deployment,
        KEY.reference("stackzap", "other-instance", 7, 2),
        KEY.reference("stackzap", "i", 8, 2).replace("8-", "7-", 1),
        "7-2-" + "0" * TAG_HEX,
    ):
        receipt = _receipt("read", "READ", "e1", gateway_job_id="G2", reference=forged)
        assert _ignored(current, receipt) == "bad_reference", forged
    # Without the key, nothing verifies.
    tagged = _receipt("read", "READ", "e1", gateway_job_id="G2", reference=TAGGED_2)
    keyless = ignored_because(current, tagged, gateway="stackzap", key=None)
    assert keyless is not None and keyless.reason == "bad_reference"
    named = _receipt(
        "read", "READ", "e1", gateway_job_id="G2", reference=KEY.reference("stackzap", "i", 8, 2)
    )
    assert _ignored(current, named) == "bad_reference"


def test_a_receipt_nothing_binds_is_ignored() -> None:
    """No verified reference and no gateway job id on the attempt: it was applied before."""
    bare = _accepted(gateway_job_id=None)
    for reference in (None, "7-2", "not-ours"):
        receipt = _receipt("read", "READ", "e1", reference=reference)
        assert _ignored(bare, receipt) == "unbound", reference


def test_legacy_references_bind_only_through_the_gateway_job_id() -> None:
    """An attempt made before the upgrade (``<job>-<seq>``): its receipts still apply when
    their gateway job id is the attempt's; the legacy reference alone proves nothing."""
    current = _accepted()
    assert (
        _ignored(current, _receipt("read", "READ", "e1", gateway_job_id="G2", reference="7-2"))
        is None
    )
    assert (
        _ignored(current, _receipt("read", "READ", "e1", gateway_job_id="G9", reference="7-2"))
        == "other_gateway_job"
    )
    assert _ignored(
        current, _receipt("read", "READ", "e1", gateway_job_id="G1", reference="7-1")
    ) == ("other_attempt")


def test_parse_reference_reads_tagged_and_legacy_references_only() -> None:
    parsed = parse_reference(TAGGED_2)
    assert parsed is not None and (parsed.job_id, parsed.seq, parsed.attempt_id) == (7, 2, "7-2")
    assert parse_reference("7-2") == ParsedReference(7, 2, None)
    for bad in ("7", "7-2-xyz", "7-2-" + "A" * TAG_HEX, "7-0", "0-1", "7-2-1-2", "x" * 200, "७-1"):
        assert parse_reference(bad) is None, bad
    assert repr(KEY) == "ReferenceKey(***)"


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


async def test_the_worker_tells_the_gateway_a_tagged_reference_and_binds_receipts_to_it() -> None:
    gateway = StackZapScripted(
        UncertainGatewayError("reset mid-response"), SendAccepted("G2", "queued", S.ACCEPTED)
    )
    gateway.listing = []  # authoritative and empty: attempt 1 was not taken
    publisher = MemoryPublisher()
    p = JobProcessor(
        gateway,
        MemoryStore(),
        publisher,
        RetryPolicy(schedule_s=(0,), jitter=0.0),
        rng=random.Random(1),
        references=KEY,
    )
    await p.on_intent(_intent(), 0)
    await p.on_intent(_intent(), 0)
    sent = [m.reference for m in gateway.sent]
    assert sent == [KEY.reference("stackzap", "i", 7, 1), TAGGED_2]
    assert [a.reference for a in publisher.attempts][-1] == TAGGED_2
    # Reconciliation asks the listing for the tagged reference and, for an attempt made
    # before the upgrade, the legacy one.
    queried = {ref for refs, _ in gateway.listing_queries for ref in refs}
    assert {sent[0], "7-1"} <= queried
    forged = await p.on_receipt(
        _receipt("read", "READ", "e-forged", gateway_job_id="G2", reference="7-2-" + "a" * TAG_HEX),
        0,
    )
    assert forged is None
    read = await p.on_receipt(
        _receipt("read", "READ", "e-read", gateway_job_id="G2", reference=TAGGED_2), 0
    )
    assert read is not None and read.status == "READ"
