"""What happens to one intent: the dispatcher's logic, free of Faust.

:func:`dispatch` takes an intent and the job's latest known state and returns
the attempt records and the new state. The agent around it reads the state
from the job table, writes the new one back (which publishes it to the state
topic) and acknowledges the event only after that.

Decisions, in order:

1. The job already reached a settled state (sent, failed, expired, ...): the
   intent is a redelivery (relay replay or worker restart). Nothing is sent.
2. ``expires_at`` has passed: EXPIRED, never sent.
3. Send. A transient error is retried in place with capped, jittered backoff
   (honouring ``Retry-After``) until ``max_attempts`` attempts were made, then
   FAILED. A permanent error is FAILED at once. An uncertain outcome is
   UNCERTAIN: the message may be at the gateway, so it is never resent blindly.
   An accepted send whose label we do not know is REVIEW, never success.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import random
from collections.abc import Awaitable, Callable

from streams.contract import (
    AttemptFinished,
    AttemptOutcome,
    IntentCaptured,
    JobStatus,
    StatusChanged,
)
from streams.gateway import (
    Gateway,
    GatewayError,
    PermanentGatewayError,
    TextMessage,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.state_machine import SETTLED, JobRef, transition


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """In-place retry of transient errors: exponential backoff, capped, full jitter."""

    base_s: float = 0.2
    cap_s: float = 5.0

    def delay_s(self, retry: int, retry_after_s: float | None, rng: random.Random) -> float:
        backoff = min(self.cap_s, self.base_s * (2**retry))
        jittered = rng.uniform(backoff / 2, backoff)
        return max(jittered, retry_after_s or 0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """The attempts made for an intent and the job's new state (None: unchanged)."""

    attempts: tuple[AttemptFinished, ...]
    state: StatusChanged | None
    duplicate: bool = False


def job_ref(intent: IntentCaptured) -> JobRef:
    return JobRef(
        intent.job_id, intent.idempotency_key, intent.instance_id, intent.conversation_key
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def dispatch(
    intent: IntentCaptured,
    current: StatusChanged | None,
    gateway: Gateway,
    policy: RetryPolicy,
    *,
    now: Callable[[], dt.datetime] = _now,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> Decision:
    """Decide and carry out what happens to ``intent``; see the module docstring."""
    rng = rng or random.Random()
    ref = job_ref(intent)
    if current is not None and JobStatus(current.status) in SETTLED:
        return Decision(attempts=(), state=None, duplicate=True)

    def finished(
        attempt: int, outcome: AttemptOutcome, started: dt.datetime, **kw: object
    ) -> AttemptFinished:
        return AttemptFinished(
            job_id=intent.job_id,
            idempotency_key=intent.idempotency_key,
            instance_id=intent.instance_id,
            conversation_key=intent.conversation_key,
            attempt=attempt,
            attempt_id=f"{intent.job_id}-{attempt}",
            outcome=outcome,
            gateway=gateway.name,
            started_at=started.isoformat(),
            finished_at=now().isoformat(),
            committed_at=intent.committed_at,
            **kw,  # type: ignore[arg-type]
        )

    if intent.expires_at is not None and dt.datetime.fromisoformat(intent.expires_at) <= now():
        started = now()
        record = finished(0, AttemptOutcome.EXPIRED, started, error="expired before sending")
        state = transition(
            ref, current, JobStatus.EXPIRED, reason=f"expired at {intent.expires_at}"
        )
        return Decision(attempts=(record,), state=state)

    attempts: list[AttemptFinished] = []
    made = current.attempts if current else 0
    retry = 0
    while True:
        made += 1
        started = now()
        message = TextMessage(
            instance_id=intent.instance_id,
            to=intent.to,
            text=intent.text,
            reference=f"{intent.job_id}-{made}",
        )
        try:
            accepted = await gateway.send_text(message)
        except TransientGatewayError as exc:
            attempts.append(finished(made, AttemptOutcome.TRANSIENT, started, error=str(exc)))
            if made >= intent.max_attempts:
                reason = f"gave up after {made} attempts: {exc}"
                state = transition(ref, current, JobStatus.FAILED, reason=reason, attempts=made)
                return Decision(attempts=tuple(attempts), state=state)
            await sleep(policy.delay_s(retry, exc.retry_after_s, rng))
            retry += 1
            continue
        except PermanentGatewayError as exc:
            attempts.append(finished(made, AttemptOutcome.PERMANENT, started, error=str(exc)))
            state = transition(ref, current, JobStatus.FAILED, reason=str(exc), attempts=made)
            return Decision(attempts=tuple(attempts), state=state)
        except UncertainGatewayError as exc:
            attempts.append(finished(made, AttemptOutcome.UNCERTAIN, started, error=str(exc)))
            reason = f"outcome unknown, not resent: {exc}"
            state = transition(ref, current, JobStatus.UNCERTAIN, reason=reason, attempts=made)
            return Decision(attempts=tuple(attempts), state=state)
        except GatewayError as exc:  # an unclassified subclass is a gateway client bug
            raise TypeError(f"unclassified gateway error {type(exc).__name__}") from exc
        outcome = (
            AttemptOutcome.REVIEW
            if accepted.status is JobStatus.REVIEW
            else AttemptOutcome.ACCEPTED
        )
        attempts.append(
            finished(
                made,
                outcome,
                started,
                gateway_job_id=accepted.gateway_job_id,
                gateway_status=accepted.gateway_status,
            )
        )
        review_reason = (
            f"gateway label {accepted.gateway_status!r} is not configured"
            if accepted.status is JobStatus.REVIEW
            else None
        )
        state = transition(
            ref,
            current,
            accepted.status,
            reason=review_reason,
            attempts=made,
            gateway_job_id=accepted.gateway_job_id,
        )
        return Decision(attempts=tuple(attempts), state=state)
