"""The worker answers every command with a structured outcome; INVALID is terminal (no I/O)."""

from __future__ import annotations

import pytest

from streams.job_processor import JobProcessor, RetryPolicy
from streams.kernel.contract import CommandOutcome, CommandRequested, IntentCaptured, JobStatus
from streams.kernel.errors import PermanentGatewayError, TransientGatewayError
from streams.kernel.ports import CancelOutcome, SendAccepted
from streams.kernel.state_machine import ALLOWED, SETTLED, InvalidTransition, JobRef, transition
from tests.unit.streams.test_job_processor import MemoryPublisher, MemoryStore, ScriptedGateway

S = JobStatus
OK = SendAccepted("g-1", "queued", S.ACCEPTED)


def _intent() -> IntentCaptured:
    return IntentCaptured(
        job_id=7,
        instance_id="i",
        conversation_key="c",
        idempotency_key="k",
        message_type="text",
        to="5511987654321",
        text="hi",
        max_attempts=1,
    )


def _command(command: str, command_id: int) -> CommandRequested:
    return CommandRequested(
        command_id=command_id,
        command=command,
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        reason="asked",
        actor="ops:ana",
        intent=_intent().to_dict(),
    )


def _processor(gateway: ScriptedGateway) -> tuple[JobProcessor, MemoryStore]:
    store = MemoryStore()
    policy = RetryPolicy(schedule_s=(60,), jitter=0.0)
    return JobProcessor(gateway, store, MemoryPublisher(), policy), store


async def test_cancel_answers_carry_the_command_id_and_outcome() -> None:
    p, _ = _processor(ScriptedGateway())
    cancelled = await p.on_cancel(_command("cancel", 11), 0)
    assert cancelled is not None
    assert (cancelled.status, cancelled.outcome, cancelled.command_id) == (
        "CANCELLED",
        "cancelled",
        11,
    )
    again = await p.on_cancel(_command("cancel", 12), 0)
    assert again is not None and (again.outcome, again.command_id) == ("cancel_refused", 12)


@pytest.mark.parametrize(
    ("gateway_says", "outcome"),
    [
        (CancelOutcome.CANCELLED, CommandOutcome.CANCELLED),
        (CancelOutcome.REFUSED, CommandOutcome.CANCEL_REFUSED),
        (CancelOutcome.UNSUPPORTED, CommandOutcome.CANCEL_UNSUPPORTED),
    ],
)
async def test_cancel_of_an_accepted_job_reports_what_the_gateway_said(
    gateway_says: CancelOutcome, outcome: CommandOutcome
) -> None:
    gateway = ScriptedGateway(OK)
    gateway.cancel_outcome = gateway_says
    p, _ = _processor(gateway)
    await p.on_intent(_intent(), 0)
    answer = await p.on_cancel(_command("cancel", 21), 0)
    assert answer is not None and answer.outcome == outcome and answer.command_id == 21
    # The next record of the job answers no command.
    follow = transition(JobRef(7, "k", "i", "c"), answer, JobStatus(answer.status))
    assert follow.outcome is None and follow.command_id is None


async def test_reprocess_answers_then_moves_on_without_the_outcome() -> None:
    p, store = _processor(ScriptedGateway(TransientGatewayError("503"), OK))
    await p.on_intent(_intent(), 0)
    assert store.states[7].status == "DEAD"
    await p.on_intent(_intent(), 0, reprocess=_command("reprocess", 31))
    answered = [s for s in store.history if s.command_id == 31]
    assert [(s.status, s.outcome) for s in answered] == [("DEAD", "reprocessed")]
    assert store.history[-1].status == "ACCEPTED" and store.history[-1].outcome is None


async def test_reprocess_of_a_job_that_is_not_reprocessable_is_refused_with_its_outcome() -> None:
    p, store = _processor(ScriptedGateway(OK))
    await p.on_intent(_intent(), 0)
    await p.on_intent(_intent(), 0, reprocess=_command("reprocess", 41))
    last = store.history[-1]
    assert (last.status, last.outcome, last.command_id) == ("ACCEPTED", "reprocess_refused", 41)
    p2, store2 = _processor(ScriptedGateway(PermanentGatewayError("400")))
    await p2.on_intent(_intent(), 0)
    assert store2.states[7].status == "FAILED"


def test_invalid_is_terminal() -> None:
    ref = JobRef(7, "k", "i", "c")
    invalid = transition(ref, None, S.INVALID, reason="payload is a JSON list", actor="relay")
    assert invalid.status == "INVALID" and invalid.version == 1
    assert ALLOWED[S.INVALID] == frozenset() and S.INVALID in SETTLED
    for target in (S.CANCELLED, S.ATTEMPTING, S.PENDING):
        with pytest.raises(InvalidTransition):
            transition(ref, invalid, target)
