"""The dispatcher agent: thin. It reads intents and hands them to conversation lanes.

Per event, in its conversation's lane: read the job's state from the ``jobs``
table, call :func:`streams.dispatcher.dispatch`, publish every attempt to
``zapstream.results``, write the new state to the table and its changelog
``zapstream.state``, wait until Kafka acknowledged those records, and only then
acknowledge the event. Faust commits the contiguous acknowledged prefix, so a
committed offset never passes an outcome that is not durable in Kafka.

A record on the intents topic that does not decode is a poison record: it goes
to ``zapstream.dead`` with the reason and is acknowledged; it never stops the
partition and never disappears.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

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
        """After Faust stopped the flow and waited for acks: cancel any lane still busy, loudly.

        Never run while events still flow: new lanes would keep appearing, and a
        cancelled lane's send is repeated by the partition's next owner.
        """
        if not await self.lanes.join(self.drain_timeout_s):
            log.warning(
                "dispatcher: %d intents still in lanes after %.0fs; the partitions' next "
                "owner sends them again",
                self.lanes.in_flight,
                self.drain_timeout_s,
            )
        await self.lanes.cancel_all()

    async def _handle(self, item: tuple[Any, IntentCaptured]) -> None:
        event, intent = item
        key = job_state_key(intent.job_id)
        raw = self.jobs.get(key)
        current = StatusChanged.loads(raw) if raw is not None else None
        decision = await dispatch(intent, current, self.gateway, self.policy)
        pending = [
            await self.topics.results.send(key=intent.partition_key, value=attempt.dumps())
            for attempt in decision.attempts
        ]
        for attempt in decision.attempts:
            metrics.ATTEMPTS.labels(self.gateway.name, attempt.outcome).inc()
        if decision.state is not None:
            pending.append(await self.record_state(event, key, decision.state))
            metrics.INTENTS.labels(decision.state.status).inc()
            self._observe_latency(intent, decision.state)
        else:
            metrics.INTENTS.labels("duplicate").inc()
        # The outcome is durable in Kafka before the intent is acknowledged.
        await asyncio.gather(*pending)
        event.ack()
        metrics.IN_FLIGHT.set(self.lanes.in_flight)

    async def record_state(self, event: Any, key: bytes, state: StatusChanged) -> Any:
        """Write ``state`` to the job table and its changelog (the state topic).

        Faust's own ``table[key] = value`` goes through its producer buffer, whose
        flush before each offset commit never finishes while lanes keep writing; we
        send the changelog record ourselves, to the partition of the intent being
        processed (co-partitioning), update the table's local store, and return the
        delivery future so the caller can wait for Kafka before acknowledging.
        """
        value = state.dumps()
        future = await self.topics.state.send(
            key=key, value=value, partition=event.message.partition
        )
        self.jobs.data[key] = value
        return future

    @staticmethod
    def _observe_latency(intent: IntentCaptured, state: StatusChanged) -> None:
        if state.sent_at and intent.committed_at:
            sent = dt.datetime.fromisoformat(state.sent_at)
            committed = dt.datetime.fromisoformat(intent.committed_at)
            metrics.COMMIT_TO_GATEWAY.observe((sent - committed).total_seconds())

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
