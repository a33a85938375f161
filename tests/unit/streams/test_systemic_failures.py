"""JobProcessor: a wrong configuration pauses the instance instead of failing the queue.

A 404 on the send route (:class:`GatewayMisconfigured`) and the same permanent error for
N sends in a row to different recipients both hold the job (RETRY_WAIT, its attempt given
back) and pause the instance; nothing is FAILED from the N-th on. No I/O.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Awaitable, Sequence

import pytest

from streams.instance_pauses import InstancePauses
from streams.job_processor import Done, JobProcessor, Park, RetryPolicy
from streams.kernel.contract import (
    AttemptFinished,
    IntentCaptured,
    JobDead,
    JobStatus,
    StatusChanged,
)
from streams.kernel.errors import GatewayMisconfigured, PermanentGatewayError
from streams.kernel.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
OK = SendAccepted("g-1", "queued", JobStatus.ACCEPTED)


class Gateway:
    name = "scripted"
    url_setting = "ZAP_API_URL"

    def __init__(self, *outcomes: SendAccepted | Exception) -> None:
        self.outcomes = list(outcomes)
        self.sent: list[TextMessage] = []

    async def send_text(self, message: TextMessage) -> SendAccepted:
        self.sent.append(message)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def list_for_reconciliation(
        self, instance_id: str, *, references: Sequence[str] = (), **_: object
    ) -> list[ListedJob] | None:
        return []

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        return CancelOutcome.UNSUPPORTED

    async def probe_configuration(self, instance_id: str) -> str:
        return "fine"

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Store:
    def __init__(self) -> None:
        self.states: dict[int, StatusChanged] = {}

    def get(self, job_id: int) -> StatusChanged | None:
        return self.states.get(job_id)

    async def put(self, state: StatusChanged, partition: int) -> None:
        self.states[state.job_id] = state


class Publisher:
    def __init__(self) -> None:
        self.attempts: list[AttemptFinished] = []

    async def attempt_finished(self, record: AttemptFinished, key: bytes) -> Awaitable[object]:
        async def acknowledged() -> None:
            self.attempts.append(record)

        return acknowledged()

    async def job_dead(self, record: JobDead) -> None: ...


def intent(job_id: int) -> IntentCaptured:
    return IntentCaptured(
        job_id=job_id,
        instance_id="i",
        conversation_key=f"c{job_id}",
        idempotency_key=f"k{job_id}",
        message_type="text",
        to=f"55119876{job_id:05d}",
        text="hi",
        max_attempts=3,
    )


def processor(gateway: Gateway, pauses: InstancePauses) -> tuple[JobProcessor, Store]:
    store = Store()
    p = JobProcessor(
        gateway,  # type: ignore[arg-type]
        store,
        Publisher(),
        RetryPolicy(schedule_s=(60,), jitter=0.0),
        now=lambda: NOW,
        rng=random.Random(1),
        pauses=pauses,
        systemic_failures=3,
    )
    return p, store


def schema_error() -> PermanentGatewayError:
    return PermanentGatewayError("zapapi: HTTP 422: unsupported field 'type'", status_code=422)


async def test_the_nth_same_permanent_error_pauses_the_instance_and_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pauses = InstancePauses(probe_interval_s=30)
    gateway = Gateway(schema_error(), schema_error(), schema_error(), schema_error(), OK)
    p, store = processor(gateway, pauses)
    outcomes = [await p.on_intent(intent(n), 0) for n in (1, 2, 3)]
    statuses = [store.states[n].status for n in (1, 2, 3)]
    print(f"statuses {statuses}")
    assert statuses == ["FAILED", "FAILED", "RETRY_WAIT"]
    assert isinstance(outcomes[0], Done) and isinstance(outcomes[2], Park)
    assert store.states[3].attempts == 0, "the held attempt is given back"
    assert pauses.paused("i")
    (line,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "ZAP_API_URL" in line.getMessage() and "3 sends in a row" in line.getMessage()
    # Held without calling the gateway while paused.
    held = await p.on_intent(intent(4), 0)
    assert isinstance(held, Park) and len(gateway.sent) == 3
    # A probe meeting the same error keeps it paused and the job waiting.
    probed = await p.on_intent(intent(3), 0, probe=True)
    assert isinstance(probed, Park) and store.states[3].status == "RETRY_WAIT"
    assert pauses.paused("i")
    # The configuration is fixed: the next probe goes through and the instance resumes.
    fixed = await p.on_intent(intent(3), 0, probe=True)
    assert isinstance(fixed, Done) and store.states[3].status == "ACCEPTED"
    assert not pauses.paused("i")


async def test_a_wrong_route_never_fails_a_job() -> None:
    wrong = GatewayMisconfigured("zapapi: HTTP 404", setting="ZAP_API_URL", status_code=404)
    pauses = InstancePauses(probe_interval_s=30)
    p, store = processor(Gateway(wrong, wrong, OK), pauses)
    first = await p.on_intent(intent(1), 0)
    assert isinstance(first, Park) and store.states[1].status == "RETRY_WAIT"
    assert store.states[1].attempts == 0 and pauses.paused("i")
    assert first.due == NOW.timestamp() + 30
    assert pauses.claim_probe("i", first.due)  # as the dispatcher does when it is due
    probe = await p.on_intent(intent(1), 0, probe=True)
    assert isinstance(probe, Park) and store.states[1].status == "RETRY_WAIT"
    # Backoff: after a failed probe the next one is twice as far out.
    assert probe.due == first.due + 60
    done = await p.on_intent(intent(1), 0, probe=True)
    assert isinstance(done, Done) and store.states[1].status == "ACCEPTED"
