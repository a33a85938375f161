"""The dispatcher agent: thin. It routes records to conversation lanes and acknowledges them.

``zapstream.intents`` carries three kinds of record, all keyed by conversation:
intents, commands (cancel, reprocess) and receipts. The agent hands each to its
conversation's lane (:mod:`streams.lanes`), where :class:`~streams.job_processor.
JobProcessor` decides what happens; an event is acknowledged only after every
state it caused is durable in Kafka, and Faust commits the contiguous
acknowledged prefix of each partition.

Two things do not wait in the lane:

- a cancel of a job not yet handed to the gateway is applied at once, so it
  overtakes the job's intent if that is still queued in the lane;
- a record that does not decode is a poison record: it goes to
  ``zapstream.dead`` with the reason and is acknowledged.

A transient failure parks the conversation (:mod:`streams.parking`); a timer
re-submits due heads to their lanes, reading the parking lot's in-memory index
(nothing is decoded per tick). While an instance is paused (the gateway refused
its credentials, :mod:`streams.instance_pauses`) its conversations stay parked
whatever their due time, except one *probe* per interval; when the instance
resumes, the conversations parked for the pause are released at once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from typing import Any

from faust.types import TP

from streams import metrics
from streams.faust_adapter.hooks import crash
from streams.job_processor import Done, JobProcessor, Outcome, Park
from streams.kernel.contract import (
    Command,
    CommandRequested,
    ContractError,
    IntentCaptured,
    JobDead,
    Priority,
    ReceiptReceived,
    decode_topic_record,
    intents_topic,
)
from streams.lanes import ConversationLanes
from streams.parking import BULK_SUFFIX, ParkingLot, parking_key
from streams.topics import Topics
from streams.worker_service import WorkerTally

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _EventItem:
    event: Any
    record: IntentCaptured | CommandRequested | ReceiptReceived

    @property
    def partition(self) -> int:
        return int(self.event.message.partition)


@dataclasses.dataclass(frozen=True, slots=True)
class _RetryDue:
    key: bytes
    partition: int
    probe: bool = False
    """Send the head although its instance is paused: the instance's probe."""
    release: bool = False
    """Run before the due time: its instance resumed."""


class Dispatcher:
    """Holds what the dispatcher agent needs; :meth:`consume` is the agent body."""

    def __init__(
        self,
        app: Any,
        topics: Topics,
        processor: JobProcessor,
        parking: ParkingLot,
        *,
        max_in_flight: int,
        drain_timeout_s: float = 10.0,
        priority: str = Priority.OPERATIONAL,
        active_jobs: set[int] | None = None,
        queued_jobs: set[int] | None = None,
        tally: WorkerTally | None = None,
    ) -> None:
        self.app = app
        self.topics = topics
        self.processor = processor
        self.parking = parking
        self.drain_timeout_s = drain_timeout_s
        self.priority = priority
        """Which intents this dispatcher runs: ``operational`` (``zapstream.intents``, with
        commands and receipts) or ``bulk`` (``zapstream.intents.bulk``)."""
        # The topic's name under the app's prefix (tests without topics: the logical name).
        self.topic = topics.names.intents_for(priority) if topics else intents_topic(priority)
        self.active_jobs: set[int] = active_jobs if active_jobs is not None else set()
        """Jobs being sent, shared by the dispatchers of every priority."""
        self.queued_jobs: set[int] = queued_jobs if queued_jobs is not None else set()
        """Jobs whose intent waits in a lane (read, not yet run), shared likewise."""
        self.tally = tally or WorkerTally()
        """What was handled, for the worker's closing line (shared by both dispatchers)."""
        self._retries_queued: set[bytes] = set()
        self.lanes: ConversationLanes[_EventItem | _RetryDue] = ConversationLanes(
            self._handle, max_in_flight=max_in_flight, on_error=self._crash
        )
        # Read when scraped: no bookkeeping per event, and 0 when idle.
        metrics.IN_FLIGHT.labels(priority).set_function(lambda: self.lanes.in_flight)
        metrics.PARKED.set_function(lambda: len(self.parking))

    def _crash(self, exc: BaseException) -> None:
        crash(self.app, exc)

    # --- the agent --------------------------------------------------------------------

    async def consume(self, stream: Any) -> None:
        async for event in stream.noack().events():
            try:
                record = decode_topic_record(event.value)
            except ContractError as exc:
                await self._poison(event, str(exc))
                continue
            if not isinstance(record, IntentCaptured | CommandRequested | ReceiptReceived):
                await self._poison(event, f"unexpected record {record.SCHEMA} on {self.topic}")
                continue
            item = _EventItem(event, record)
            if (
                isinstance(record, CommandRequested)
                and record.command == Command.CANCEL
                and record.job_id not in self.active_jobs
                and self.processor.cancels_without_gateway(record)
                and self._not_forgotten(record.job_id)
            ):
                # Overtakes the job's intent if it is still queued in the lane.
                self.tally.commands += 1
                await self.processor.on_cancel(record, item.partition)
                event.ack()
                continue
            if isinstance(record, IntentCaptured):
                self.queued_jobs.add(record.job_id)
            await self.lanes.submit(record.partition_key, item)

    def _not_forgotten(self, job_id: int) -> bool:
        """The table's view of the job is the whole truth: it holds the job, or the job is
        waiting here (queued in a lane, parked), or the table never forgets. Otherwise the
        job may be one the dedup horizon forgot, and its cancel goes through its lane, where
        ``outbox_jobs`` is asked (:meth:`JobProcessor.recall`)."""
        return (
            self.processor.late is None
            or self.processor.store.get(job_id) is not None
            or job_id in self.queued_jobs
            or self.parking.holds(job_id)
        )

    async def fire_due_retries(self) -> None:
        """Timer: submit every due parked conversation of our partitions to its lane.

        Reads the parking lot's index of conversations: nothing is decoded. Does
        nothing while Faust rebalances or recovers tables: the parked conversations
        and the job states they are checked against are not whole yet.
        """
        if self.app.rebalancing or self.app.in_recovery:
            return
        now = time.time()
        assigned = self.app.consumer.assignment()
        pauses = self.processor.pauses
        probed: set[str] = set()
        bulk = self.priority == Priority.BULK
        for key, parked in self.parking.items():
            if key in self._retries_queued or key.endswith(BULK_SUFFIX) is not bulk:
                continue
            if TP(self.topic, parked.partition) not in assigned:
                continue
            instance = parked.instance
            probe = release = False
            if pauses.paused(instance):
                # Held whatever its due time; one conversation per interval probes.
                if instance in probed or not pauses.claim_probe(instance, now):
                    continue
                probed.add(instance)
                probe = True
            elif parked.due > now:
                if not (
                    pauses.released(instance, parked.due, now)
                    or self.processor.controls.released(parked.due, now)
                ):
                    continue
                release = True
            self._retries_queued.add(key)
            await self.lanes.submit(
                key, _RetryDue(key, parked.partition, probe=probe, release=release)
            )

    async def drain(self) -> None:
        """After Faust stopped the flow and waited for acks: cancel any lane still busy, loudly.

        Never run while events still flow: new lanes would keep appearing, and a
        cancelled lane's send is repeated by the partition's next owner.
        """
        if not await self.lanes.join(self.drain_timeout_s):
            log.warning(
                "dispatcher: %d items still in lanes after %.0fs; the partitions' next "
                "owner takes them over",
                self.lanes.in_flight,
                self.drain_timeout_s,
            )
        await self.lanes.cancel_all()

    # --- in a conversation lane ---------------------------------------------------------

    async def _handle(self, item: _EventItem | _RetryDue) -> None:
        if isinstance(item, _RetryDue):
            self._retries_queued.discard(item.key)
            await self._retry(item)
            return
        record, partition = item.record, item.partition
        if isinstance(record, IntentCaptured):
            self.queued_jobs.discard(record.job_id)
            await self._intent(record, partition)
        elif isinstance(record, ReceiptReceived):
            self.tally.receipts += 1
            await self.processor.on_receipt(record, partition)
        elif record.command == Command.CANCEL:
            self.tally.commands += 1
            await self.processor.on_cancel(record, partition)
        elif record.command == Command.REPROCESS and record.intent is not None:
            self.tally.commands += 1
            intent = IntentCaptured.from_dict(record.intent)
            outcome = await self._run(intent, partition, reprocess=record)
            if isinstance(outcome, Park):
                await self._park(intent, partition, outcome.due)
        else:
            log.error("command %r for job %d not understood", record.command, record.job_id)
        item.event.ack()

    async def _intent(self, intent: IntentCaptured, partition: int) -> None:
        key = parking_key(intent.partition_key, self.priority)
        if self.parking.get(key) is not None:
            current = self.processor.store.get(intent.job_id)
            if not self.parking.holds(intent.job_id) and (
                current is None or current.status == "PENDING"
            ):
                # Behind the parked head, in order, durably; the event can be acknowledged.
                await self.parking.append(key, intent)
                metrics.INTENTS_BY("parked").inc()
                self.tally.intents["parked"] += 1
            return
        outcome = await self._run(intent, partition)
        if isinstance(outcome, Park):
            await self._park(intent, partition, outcome.due)

    async def _park(self, intent: IntentCaptured, partition: int, due: float) -> None:
        key = parking_key(intent.partition_key, self.priority)
        if self.parking.get(key) is None:
            await self.parking.park(key, intent, partition=partition, due=due)
        else:
            await self.parking.append(key, intent)

    async def _retry(self, due: _RetryDue) -> None:
        """Run the head, then the messages behind it in order, until one parks or none is left."""
        parked = self.parking.get(due.key)
        if parked is None:
            return
        if parked.due > time.time() and not (due.probe or due.release):
            return
        probe = due.probe
        while (intent := self.parking.head(due.key)) is not None:
            first = self.parking.get(due.key)
            outcome = await self._run(intent, parked.partition, probe=probe)
            probe = False
            if self.parking.get(due.key) != first:
                # The partition was revoked meanwhile (Faust dropped its keys): its new
                # owner runs the conversation.
                return
            if isinstance(outcome, Park):
                await self.parking.postpone(due.key, outcome.due)
                return
            if not await self.parking.pop(due.key, intent.job_id):
                return
        if self.parking.get(due.key) is not None:
            # Nothing left but the conversation record: what a crash during the last
            # pop leaves behind.
            await self.parking.unpark(due.key)

    async def _run(
        self,
        intent: IntentCaptured,
        partition: int,
        *,
        reprocess: CommandRequested | None = None,
        probe: bool = False,
    ) -> Outcome:
        self.active_jobs.add(intent.job_id)
        try:
            outcome = await self.processor.on_intent(
                intent, partition, reprocess=reprocess, probe=probe
            )
        finally:
            self.active_jobs.discard(intent.job_id)
        if isinstance(outcome, Done):
            decision = outcome.state.status if outcome.state else "duplicate"
            metrics.INTENTS_BY(decision).inc()
            self.tally.intents[decision] += 1
            if outcome.state is not None and outcome.state.sent_at and intent.committed_at:
                sent = dt.datetime.fromisoformat(outcome.state.sent_at)
                committed = dt.datetime.fromisoformat(intent.committed_at)
                metrics.COMMIT_TO_GATEWAY_BY(intent.instance_id, intent.priority).observe(
                    (sent - committed).total_seconds()
                )
        return outcome

    async def _poison(self, event: Any, reason: str) -> None:
        message = event.message
        log.error(
            "poison record %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason
        )
        dead = JobDead(
            job_id=None,
            idempotency_key=None,
            reason=reason,
            record={
                "topic": message.topic,
                "partition": message.partition,
                "offset": message.offset,
                "value": bytes(event.value or b"").decode("utf-8", "replace"),
            },
        )
        await self.processor.publisher.job_dead(dead)
        metrics.POISON.labels(message.topic).inc()
        self.tally.poison += 1
        event.ack()
