"""The dispatcher's decisions against a scripted gateway (no network, no Faust)."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from streams.contract import IntentCaptured, JobStatus
from streams.dispatcher import RetryPolicy, dispatch, job_ref
from streams.gateway import (
    PermanentGatewayError,
    SendAccepted,
    TextMessage,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.state_machine import transition

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


class ScriptedGateway:
    name = "scripted"

    def __init__(self, *outcomes: SendAccepted | Exception) -> None:
        self.outcomes = list(outcomes)
        self.sent: list[TextMessage] = []

    async def send_text(self, message: TextMessage) -> SendAccepted:
        self.sent.append(message)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


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


OK = SendAccepted("g-1", "queued", JobStatus.ACCEPTED)
sleeps: list[float] = []


async def _sleep(seconds: float) -> None:
    sleeps.append(seconds)


async def _run(gateway: ScriptedGateway, intent: IntentCaptured, current=None):  # type: ignore[no-untyped-def]
    return await dispatch(
        intent,
        current,
        gateway,
        RetryPolicy(base_s=0.1, cap_s=1.0),
        now=lambda: NOW,
        sleep=_sleep,
        rng=random.Random(1),
    )


async def test_accepted_records_one_attempt_and_reference() -> None:
    gw = ScriptedGateway(OK)
    decision = await _run(gw, _intent())
    assert decision.state is not None and decision.state.status == "ACCEPTED"
    assert decision.state.gateway_job_id == "g-1" and decision.state.attempts == 1
    assert [a.outcome for a in decision.attempts] == ["accepted"]
    assert gw.sent[0].reference == "7-1"


async def test_settled_job_is_a_duplicate_and_nothing_is_sent() -> None:
    gw = ScriptedGateway()
    current = transition(job_ref(_intent()), None, JobStatus.ACCEPTED)
    decision = await _run(gw, _intent(), current)
    assert decision.duplicate and decision.state is None and gw.sent == []


async def test_expired_is_never_sent() -> None:
    gw = ScriptedGateway(OK)
    decision = await _run(gw, _intent(expires_at=(NOW - dt.timedelta(seconds=1)).isoformat()))
    assert decision.state is not None and decision.state.status == "EXPIRED"
    assert gw.sent == []


async def test_transient_is_retried_with_backoff_honouring_retry_after() -> None:
    sleeps.clear()
    gw = ScriptedGateway(TransientGatewayError("503", retry_after_s=2.5), OK)
    decision = await _run(gw, _intent())
    assert decision.state is not None and decision.state.status == "ACCEPTED"
    assert [a.outcome for a in decision.attempts] == ["transient", "accepted"]
    assert sleeps == [2.5]
    assert [m.reference for m in gw.sent] == ["7-1", "7-2"]


async def test_transient_until_max_attempts_fails_with_reason() -> None:
    gw = ScriptedGateway(*[TransientGatewayError("down")] * 3)
    decision = await _run(gw, _intent(max_attempts=3))
    assert decision.state is not None and decision.state.status == "FAILED"
    assert decision.state.attempts == 3 and "gave up after 3" in (decision.state.reason or "")


async def test_permanent_is_not_retried() -> None:
    gw = ScriptedGateway(PermanentGatewayError("401 bad key"), OK)
    decision = await _run(gw, _intent())
    assert decision.state is not None and decision.state.status == "FAILED"
    assert len(gw.sent) == 1


async def test_uncertain_is_never_resent_blindly() -> None:
    gw = ScriptedGateway(UncertainGatewayError("reset mid-response"), OK)
    decision = await _run(gw, _intent())
    assert decision.state is not None and decision.state.status == "UNCERTAIN"
    assert len(gw.sent) == 1


async def test_unknown_label_goes_to_review_not_success() -> None:
    gw = ScriptedGateway(SendAccepted("g-2", "weird", JobStatus.REVIEW))
    decision = await _run(gw, _intent())
    assert decision.state is not None and decision.state.status == "REVIEW"
    assert "'weird'" in (decision.state.reason or "")


@pytest.mark.parametrize(("retry", "cap"), [(0, 0.1), (3, 0.8), (10, 1.0)])
def test_backoff_is_capped_and_jittered(retry: int, cap: float) -> None:
    delay = RetryPolicy(base_s=0.1, cap_s=1.0).delay_s(retry, None, random.Random(0))
    assert cap / 2 <= delay <= cap
