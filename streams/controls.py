"""Operators' pauses of instances and campaigns, as every worker sees them.

An operator pauses an instance (``zapstream instances pause``) or a campaign (a
``purpose``: ``zapstream campaigns pause``); the row they write in
``outbox_controls`` reaches ``zapstream.controls`` (one partition, compacted,
keyed ``kind:target``) through the relay. Every worker reads the whole topic with
a consumer of its own, outside the consumer group (:class:`ControlsReader`), so
each knows every pause whatever partitions it owns.

While held, a job is not sent: its conversation parks (the job stays PENDING, the
partition's offsets keep moving) with a due time a day away. When any control is
resumed, the parked conversations held by a control are released at the next
timer tick; those still held park again. A resumed instance starts slowly
(:meth:`streams.pacing.Pacer.slow_start`).

Sans-IO apart from :class:`ControlsReader`; decisions take ``now`` (epoch seconds).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import Gauge

from streams.kafka_reader import group_less_consumer
from streams.kernel.contract import OptOutChanged
from streams.kernel.runtime.periodic import Periodic
from streams.kernel.runtime.service import Service
from streams.kernel.settings import KafkaSettings
from streams.optouts import OptOuts

log = logging.getLogger(__name__)

HOLD_S = 86_400.0
"""How far away a held conversation's due time is set; a resume releases it earlier."""

PAUSED = Gauge(
    "zapstream_control_paused",
    "1 while an operator's pause holds an instance's or a campaign's messages",
    ["kind", "target"],
)


class Control(Protocol):
    """What a ``zapstream.controls`` record says (``streams.kernel.contract.ControlChanged``)."""

    kind: str
    target: str
    action: str
    reason: str
    actor: str


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    kind: str
    target: str
    reason: str
    actor: str

    def describe(self) -> str:
        return f"{self.kind} {self.target} paused by {self.actor}: {self.reason}"


class Controls:
    """The latest pause or resume of every instance and campaign."""

    def __init__(
        self,
        *,
        release_window_s: float = 60.0,
        on_resume: Callable[[str, str], None] | None = None,
    ) -> None:
        self.release_window_s = release_window_s
        self._held: dict[tuple[str, str], Hold] = {}
        self._resumed_at: float | None = None
        self.on_resume: Callable[[str, str], None] = on_resume or (lambda kind, target: None)
        """Called when an instance or campaign is resumed (the pacer's slow start)."""

    def apply(self, control: Control, now: float) -> None:
        key = (control.kind, control.target)
        if control.action == "pause":
            if key not in self._held:
                log.warning(
                    "%s %s paused by %s: %s",
                    control.kind,
                    control.target,
                    control.actor,
                    control.reason,
                )
            self._held[key] = Hold(control.kind, control.target, control.reason, control.actor)
            PAUSED.labels(control.kind, control.target).set(1)
        elif control.action == "resume":
            if self._held.pop(key, None) is not None:
                log.warning(
                    "%s %s resumed by %s: %s",
                    control.kind,
                    control.target,
                    control.actor,
                    control.reason,
                )
                self._resumed_at = now
                self.on_resume(control.kind, control.target)
            PAUSED.labels(control.kind, control.target).set(0)
        else:
            log.error("control %r for %s %s not understood", control.action, *key)

    def held(self, instance: str, purpose: str | None) -> Hold | None:
        """The pause holding a message of ``instance`` and ``purpose``, if any."""
        if not self._held:
            return None
        hold = self._held.get(("instance", instance))
        if hold is None and purpose:
            hold = self._held.get(("campaign", purpose))
        return hold

    def paused(self) -> list[Hold]:
        return list(self._held.values())

    def released(self, due: float, now: float) -> bool:
        """A conversation parked by a hold (due a day later) runs now: something resumed since."""
        resumed = self._resumed_at
        if resumed is None or now - resumed > self.release_window_s:
            return False
        return due - HOLD_S <= resumed


class _Decode(Protocol):
    def __call__(self, raw: bytes) -> Any: ...


class ControlsReader(Service):
    """Reads ``zapstream.controls`` from its start, outside any consumer group, forever.

    Its opt-outs (:class:`~streams.kernel.contract.OptOutChanged`) go to ``optouts``
    (:mod:`streams.optouts`), the pauses and resumes to ``controls``.

    The reading loop is a :class:`~streams.kernel.runtime.periodic.Periodic` (a child,
    started once the consumer is positioned, stopped before it closes): while Kafka is
    away the controls we know stay in force (one log line per outage), and no error of a
    read ever reaches the worker.
    """

    name = "controls reader"

    def __init__(
        self,
        controls: Controls,
        kafka: KafkaSettings,
        topic: str,
        decode: _Decode,
        *,
        clock: Callable[[], float],
        client_id: str = "zapstream-worker-controls",
        optouts: OptOuts | None = None,
    ) -> None:
        super().__init__()
        self.controls = controls
        self.optouts = optouts
        """Where the topic's opt-outs go (:mod:`streams.optouts`); made ready once caught up."""
        self.kafka = kafka
        self.topic = topic
        self.decode = decode
        self.clock = clock
        self.client_id = client_id
        self._consumer: Any = None
        self._tp: Any = None
        self.add_child(
            Periodic(
                "controls reader", 0.0, self._read_once, retry_s=1.0, max_retry_s=5.0, logger=log
            )
        )
        self.caught_up = asyncio.Event()

    async def on_start(self) -> None:
        from aiokafka import TopicPartition

        consumer = group_less_consumer(self.kafka, self.client_id, auto_offset_reset="earliest")
        await consumer.start()
        tp = TopicPartition(self.topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        self._consumer, self._tp = consumer, tp

    async def _read_once(self) -> None:
        consumer, tp = self._consumer, self._tp
        batches = await consumer.getmany(tp, timeout_ms=1000)
        for records in batches.values():
            for record in records:
                if record.value is None:
                    continue
                try:
                    control = self.decode(record.value)
                except ValueError as exc:
                    log.error("control record %d does not decode: %s", record.offset, exc)
                    continue
                if isinstance(control, OptOutChanged):
                    if self.optouts is not None:
                        self.optouts.apply(control)
                    continue
                self.controls.apply(control, self.clock())
        highwater = consumer.highwater(tp)
        if highwater is not None and await consumer.position(tp) >= highwater:
            if self.optouts is not None and not self.optouts.ready:
                self.optouts.ready = True
                log.info("opt-out list read: %d opted-out recipients", len(self.optouts))
            self.caught_up.set()

    async def on_stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
