"""The dispatcher agent: thin. It reads intents and hands them to conversation lanes.

Per event, in its conversation's lane: read the job's state from the ``jobs``
table, call :func:`streams.dispatcher.dispatch`, publish every attempt to
``zapstream.results``, write the new state to the table (which publishes it to
``zapstream.state``), then acknowledge the event. Faust flushes the producer
before it commits offsets, so a committed offset never passes an outcome that
was not handed to Kafka.

A record on the intents topic that does not decode is a poison record: it goes
to ``zapstream.dead`` with the reason and is acknowledged; it never stops the
partition and never disappears.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import weakref
from collections.abc import Iterator
from typing import Any

from faust.streams import _current_event

from streams import metrics
from streams.contract import (
    ContractError,
    IntentCaptured,
    JobDead,
    StatusChanged,
    job_state_key,
)
from streams.dispatcher import RetryPolicy, dispatch
from streams.gateway import Gateway
from streams.lanes import ConversationLanes
from streams.topics import Topics

log = logging.getLogger(__name__)


@contextlib.contextmanager
def processing(event: Any) -> Iterator[None]:
    """Make ``event`` Faust's current event in this task, so table writes go to its partition."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


class Dispatcher:
    """Holds what the dispatcher agent needs; :meth:`consume` is the agent body."""

    def __init__(
        self,
        app: Any,
        topics: Topics,
        jobs: Any,
        gateway: Gateway,
        policy: RetryPolicy,
        *,
        max_in_flight: int,
        drain_timeout_s: float = 10.0,
    ) -> None:
        self.app = app
        self.topics = topics
        self.jobs = jobs
        self.gateway = gateway
        self.policy = policy
        self.drain_timeout_s = drain_timeout_s
        self.lanes: ConversationLanes[tuple[Any, IntentCaptured]] = ConversationLanes(
            self._handle, max_in_flight=max_in_flight, on_error=self._crash
        )

    def _crash(self, exc: BaseException) -> None:
        asyncio.ensure_future(self.app.crash(exc))

    async def consume(self, stream: Any) -> None:
        async for event in stream.noack().events():
            try:
                intent = IntentCaptured.loads(event.value)
            except ContractError as exc:
                await self._poison(event, str(exc))
                continue
            await self.lanes.submit(intent.partition_key, (event, intent))
            metrics.IN_FLIGHT.set(self.lanes.in_flight)

    async def drain(self) -> None:
        """On shutdown: let lanes finish within a bound, then cancel what is left unacked."""
        if not await self.lanes.join(self.drain_timeout_s):
            log.warning("dispatcher: lanes still busy after %.0fs; handing back", self.drain_timeout_s)
        await self.lanes.cancel_all()

    async def _handle(self, item: tuple[Any, IntentCaptured]) -> None:
        event, intent = item
        with processing(event):
            key = job_state_key(intent.job_id)
            raw = self.jobs.get(key)
            current = StatusChanged.loads(raw) if raw is not None else None
            decision = await dispatch(intent, current, self.gateway, self.policy)
            for attempt in decision.attempts:
                self.topics.results.send_soon(key=intent.partition_key, value=attempt.dumps())
                metrics.ATTEMPTS.labels(self.gateway.name, attempt.outcome).inc()
            if decision.state is not None:
                self.jobs[key] = decision.state.dumps()
                metrics.INTENTS.labels(decision.state.status).inc()
                if decision.state.sent_at and intent.committed_at:
                    latency = dt.datetime.fromisoformat(
                        decision.state.sent_at
                    ) - dt.datetime.fromisoformat(intent.committed_at)
                    metrics.COMMIT_TO_GATEWAY.observe(latency.total_seconds())
            else:
                metrics.INTENTS.labels("duplicate").inc()
        event.ack()
        metrics.IN_FLIGHT.set(self.lanes.in_flight)

    async def _poison(self, event: Any, reason: str) -> None:
        message = event.message
        log.error(
            "poison record %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason
        )
        dead = JobDead(
            job_id=None,
            idempotency_key=None,
            reason=f"undecodable intent: {reason}",
            record={
                "topic": message.topic,
                "partition": message.partition,
                "offset": message.offset,
                "value": bytes(event.value or b"").decode("utf-8", "replace"),
            },
        )
        await (await self.topics.dead.send(value=dead.dumps()))
        metrics.POISON.labels(message.topic).inc()
        event.ack()
