"""Late redeliveries: the decision table, alone and inside JobProcessor.on_intent (no I/O)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import pytest

from streams.job_processor import Done, JobProcessor, Park, RetryPolicy
from streams.kernel.contract import CommandRequested, IntentCaptured, JobStatus, ReceiptReceived
from streams.kernel.job_history import (
    HistoricState,
    HistoryUnavailable,
    LateRedeliveries,
    LateVerdict,
)
from streams.kernel.ports import SendAccepted
from tests.unit.streams.test_job_processor import (
    OK as OK_SEND,
)
from tests.unit.streams.test_job_processor import (
    MemoryPublisher,
    MemoryStore,
    ScriptedGateway,
)

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
HORIZON_S, MARGIN_S = 1000.0, 100.0
S = JobStatus


class History:
    def __init__(self, status: str | None = None, error: HistoryUnavailable | None = None) -> None:
        self.status = status
        self.error = error
        self.asked: list[int] = []
        self._asked = asyncio.Event()

    def _ask(self, job_id: int) -> None:
        self.asked.append(job_id)
        self._asked.set()

    async def asked_at_least(self, n: int) -> None:
        """Return once ``n`` questions were asked (the signal, instead of a fixed sleep)."""
        while len(self.asked) < n:
            self._asked.clear()
            await self._asked.wait()

    async def status_of(self, job_id: int) -> str | None:
        self._ask(job_id)
        if self.error is not None:
            raise self.error
        return self.status

    async def state_of(self, job_id: int) -> HistoricState | None:
        self._ask(job_id)
        if self.error is not None:
            raise self.error
        return HistoricState(self.status, 4, 1, "g-1", 2) if self.status else None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _intent(age_s: float | None) -> IntentCaptured:
    committed = None if age_s is None else (NOW - dt.timedelta(seconds=age_s)).isoformat()
    return IntentCaptured(
        job_id=7,
        instance_id="i",
        conversation_key="c",
        idempotency_key="k",
        message_type="text",
        to="5511987654321",
        text="hi",
        committed_at=committed,
    )


def _late(history: History) -> LateRedeliveries:
    return LateRedeliveries(history, horizon_s=HORIZON_S, margin_s=MARGIN_S, retry_s=10.0)


OLD = HORIZON_S - MARGIN_S + 1
RECENT = HORIZON_S - MARGIN_S - 1


@pytest.mark.parametrize(
    ("age_s", "history", "verdict", "asked"),
    [
        (RECENT, History(S.ACCEPTED), LateVerdict.SEND, False),
        (OLD, History(S.ACCEPTED), LateVerdict.DUPLICATE, True),
        (OLD, History(S.DEAD), LateVerdict.DUPLICATE, True),
        (OLD, History(None), LateVerdict.DUPLICATE, True),
        (OLD, History(S.PENDING), LateVerdict.SEND, True),
        (None, History(S.PENDING), LateVerdict.SEND, True),
        (None, History(S.READ), LateVerdict.DUPLICATE, True),
        (OLD, History(error=HistoryUnavailable("refused")), LateVerdict.LATER, True),
        (
            OLD,
            History(error=HistoryUnavailable("bad password", permanent=True)),
            LateVerdict.LATER,
            True,
        ),
    ],
)
async def test_decision_table(
    age_s: float | None, history: History, verdict: LateVerdict, asked: bool
) -> None:
    assert await _late(history).check(_intent(age_s), NOW) is verdict
    assert bool(history.asked) is asked


def _processor(history: History) -> tuple[JobProcessor, ScriptedGateway, MemoryStore]:
    gateway = ScriptedGateway(SendAccepted("gw-1", "queued", S.ACCEPTED))
    store = MemoryStore()
    processor = JobProcessor(
        gateway,
        store,
        MemoryPublisher(),
        RetryPolicy(schedule_s=(1,)),
        now=lambda: NOW,
        late=_late(history),
    )
    return processor, gateway, store


async def test_unknown_recent_intent_is_sent_without_a_lookup() -> None:
    history = History(S.ACCEPTED)
    processor, gateway, store = _processor(history)
    outcome = await processor.on_intent(_intent(RECENT), 0)
    assert isinstance(outcome, Done) and outcome.state is not None
    assert outcome.state.status == S.ACCEPTED
    assert len(gateway.sent) == 1 and history.asked == []


async def test_unknown_old_intent_handled_before_is_dropped() -> None:
    processor, gateway, store = _processor(History(S.DELIVERED))
    assert await processor.on_intent(_intent(OLD), 0) == Done(None)
    assert gateway.sent == [] and store.history == []


async def test_unknown_old_intent_still_pending_is_sent() -> None:
    processor, gateway, _ = _processor(History(S.PENDING))
    outcome = await processor.on_intent(_intent(OLD), 0)
    assert isinstance(outcome, Done) and outcome.state is not None
    assert outcome.state.status == S.ACCEPTED and len(gateway.sent) == 1


async def test_history_unavailable_parks_without_sending() -> None:
    processor, gateway, store = _processor(History(error=HistoryUnavailable("connection refused")))
    outcome = await processor.on_intent(_intent(OLD), 0)
    assert outcome == Park(NOW.timestamp() + 10.0, None)
    assert gateway.sent == [] and store.history == []


async def test_a_job_in_the_table_is_never_looked_up() -> None:
    history = History(S.PENDING)
    processor, gateway, _ = _processor(history)
    await processor.on_intent(_intent(OLD), 0)
    assert await processor.on_intent(_intent(OLD), 0) == Done(None)  # settled: a redelivery
    assert history.asked == [7] and len(gateway.sent) == 1


def _recalling(history: History) -> tuple[JobProcessor, ScriptedGateway]:
    gw = ScriptedGateway(OK_SEND)
    processor = JobProcessor(
        gw,
        MemoryStore(),
        MemoryPublisher(),
        RetryPolicy(schedule_s=(60,), jitter=0.0),
        now=lambda: NOW,
        late=_late(history),
    )
    return processor, gw


async def test_a_receipt_for_a_forgotten_job_is_applied_from_outbox_jobs() -> None:
    processor, _ = _recalling(History(S.ACCEPTED))
    receipt = ReceiptReceived(
        event_id="e-read",
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        gateway="scripted",  # the gateway the attempt went through
        gateway_job_id="g-1",
        label="read",
        status="READ",
    )
    moved = await processor.on_receipt(receipt, 0)
    assert moved is not None and moved.status == "READ"
    assert moved.version == 5  # after outbox_jobs' version 4: the sink applies it


async def test_a_cancel_of_a_forgotten_accepted_job_asks_the_gateway() -> None:
    processor, gw = _recalling(History(S.ACCEPTED))
    command = CommandRequested(
        command_id=1,
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        command="cancel",
        reason="customer asked",
        actor="ana",
    )
    state = await processor.on_cancel(command, 0)
    assert state is not None and state.status == "CANCELLED"
    assert gw.cancelled == ["g-1"]


async def test_a_reprocess_of_a_forgotten_dead_job_never_reuses_an_attempt_id() -> None:
    processor, gw = _recalling(History(S.DEAD))
    command = CommandRequested(
        command_id=2,
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        command="reprocess",
        reason="fixed the number",
        actor="ana",
    )
    outcome = await processor.on_intent(_intent(None), 0, reprocess=command)
    assert isinstance(outcome, Done) and outcome.state and outcome.state.status == "ACCEPTED"
    assert [m.reference for m in gw.sent] == ["7-3"]  # outbox_jobs counted 2 attempts


async def test_a_receipt_waits_while_outbox_jobs_cannot_answer() -> None:
    history = History(S.ACCEPTED, error=HistoryUnavailable("refused"))
    processor, _ = _recalling(history)
    assert processor.late is not None
    processor.late.retry_s = 0.01
    receipt = ReceiptReceived(
        event_id="e1",
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        gateway="scripted",  # the gateway the attempt went through
        gateway_job_id="g-1",
        label="delivered",
        status="DELIVERED",
    )
    task = asyncio.ensure_future(processor.on_receipt(receipt, 0))
    # Asked again after a refusal: the receipt is still waiting, not decided on a guess.
    await asyncio.wait_for(history.asked_at_least(2), 1.0)
    assert not task.done() and len(history.asked) >= 2
    history.error = None
    moved = await asyncio.wait_for(task, 1.0)
    assert moved is not None and moved.status == "DELIVERED"


async def test_an_outbox_jobs_outage_is_logged_once_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    history = History(error=HistoryUnavailable("connection refused"))
    late = _late(history)
    with caplog.at_level(logging.INFO, logger="streams.kernel.job_history"):
        for _ in range(5):
            assert await late.check(_intent(OLD), NOW) is LateVerdict.LATER
        history.error, history.status = None, S.ACCEPTED
        assert await late.check(_intent(OLD), NOW) is LateVerdict.DUPLICATE
    outage = [r for r in caplog.records if "outbox_jobs (for late redeliveries)" in r.getMessage()]
    assert [r.levelname for r in outage] == ["WARNING", "INFO"], [r.getMessage() for r in outage]
    assert "connection refused" in outage[0].getMessage()
    assert "after" in outage[1].getMessage() and "5 failed attempts" in outage[1].getMessage()


class _ScheduledHistory(History):
    """outbox_jobs says SCHEDULED at version 0: inserted due later, never released."""

    async def state_of(self, job_id: int) -> HistoricState | None:
        self._ask(job_id)
        return HistoricState(S.SCHEDULED, 0, 0, None, 0)


async def test_a_scheduled_job_cancelled_settles_without_the_gateway_and_drops_its_release() -> (
    None
):
    processor, gw = _recalling(_ScheduledHistory(S.SCHEDULED))
    command = CommandRequested(
        command_id=3,
        job_id=7,
        idempotency_key="k",
        instance_id="i",
        conversation_key="c",
        command="cancel",
        reason="the visit was moved",
        actor="clinic",
    )
    assert processor.cancels_without_gateway(command)
    state = await processor.on_cancel(command, 0)
    # Never an intent here, yet CANCELLED, as the first state the sink writes.
    assert state is not None and state.status == "CANCELLED" and state.version == 1
    assert state.outcome == "cancelled" and gw.cancelled == []
    # A release that raced the cancel is a redelivery of a settled job: nothing is sent.
    assert await processor.on_intent(_intent(None), 0) == Done(None)
    assert gw.sent == []
