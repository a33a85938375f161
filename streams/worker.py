"""Wires the worker: app, topics, tables, agents and the resources given by the caller.

The composition root (``zapstream worker`` in :mod:`connectors.cli`) builds the
concrete gateway client and state sink and passes them here; ``streams`` never
imports ``connectors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from faust.types import TP

from streams.agents import Dispatcher
from streams.app import Resource, WorkerApp, build_app
from streams.controls import Controls, ControlsReader
from streams.dedup_horizon import DedupHorizon
from streams.failure_log import FailureLog
from streams.faust_adapter.monitor import setup_lean_prometheus
from streams.gateway_check import GatewayStartCheck
from streams.health import add_health_pages, readiness
from streams.instance_pauses import InstancePauses
from streams.job_processor import JobProcessor, RetryPolicy
from streams.kernel.attempt_reference import ReferenceKey
from streams.kernel.contract import (
    DEFAULT_NAMES,
    ContractError,
    ControlChanged,
    OptOutChanged,
    Priority,
    decode_topic_record,
)
from streams.kernel.job_history import JobHistory, LateRedeliveries
from streams.kernel.kafka_outage import KafkaOutageWatch
from streams.kernel.ports import Gateway
from streams.kernel.runtime.periodic import Periodic
from streams.lag_monitor import LagMonitor
from streams.optouts import OptOuts
from streams.pacing import Limit, Pacer
from streams.parking import ParkingLot
from streams.quiet_hours import QuietHours
from streams.reconcile import InstanceListings
from streams.sink_progress import SinkProgress
from streams.stores import FaustJobStore, FaustPublisher, KafkaWriter
from streams.table_digest import add_digest_page
from streams.tables import register_tables
from streams.template_pauses import TemplatePauses
from streams.topics import register_topics
from streams.worker_service import WorkerService, WorkerTally
from streams.worker_settings import WorkerSettings

RECIPIENT_INTERVAL_S: dict[str, float] = {"meta": 6.0}
"""Per-recipient pacing by gateway when ``ZAPSTREAM_WORKER_RECIPIENT_INTERVAL_S`` is unset:
Meta documents about one message per 6 s per business-number/user pair."""


class PartitionShare:
    """The share of ``zapstream.intents`` partitions this worker owns, read at most once a second.

    An instance's conversations hash over every partition, so this is also the share
    of each instance's traffic the worker sees, and of its rate it may use.
    """

    def __init__(
        self,
        assignment: Callable[[], Collection[Any]],
        partitions: int,
        ttl_s: float = 1.0,
        *,
        topic: str = DEFAULT_NAMES.intents,
    ) -> None:
        self.assignment = assignment
        self.partitions = partitions
        self.topic = topic
        self.ttl_s = ttl_s
        self._value = 1.0
        self._read_at = float("-inf")

    def __call__(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= self.ttl_s:
            self._read_at = now
            owned = sum(1 for tp in self.assignment() if tp.topic == self.topic)
            self._value = max(owned, 1) / self.partitions
        return self._value


def decode_control(raw: bytes) -> ControlChanged | OptOutChanged:
    record = decode_topic_record(raw)
    if not isinstance(record, ControlChanged | OptOutChanged):
        raise ContractError(f"unexpected record {record.SCHEMA} on the controls topic")
    return record


def build_pacer(settings: WorkerSettings, share: Callable[[], float]) -> Pacer:
    interval = settings.recipient_interval_s
    if interval is None:
        interval = RECIPIENT_INTERVAL_S.get(str(settings.gateway.kind), 0.0)
    return Pacer(
        Limit(settings.instance_rate_per_s, settings.instance_burst),
        {k: Limit(v.rate_per_s, v.burst) for k, v in settings.instance_rates.items()},
        share=share,
        min_block_s=settings.rate_limit_min_block_s,
        recipient_interval_s=interval,
        recipient_burst=settings.recipient_burst,
    )


def build_worker_app(
    settings: WorkerSettings,
    gateway: Gateway,
    resources: Sequence[Resource] = (),
    *,
    history: JobHistory | None = None,
    references: ReferenceKey | None = None,
) -> tuple[WorkerApp, Dispatcher]:
    """``history``: the long-term record of jobs; without it the jobs table never forgets.
    ``references``: the deployment's attempt reference key (``zapstream worker`` refuses to
    start without one; None, in tests only, sends legacy references)."""
    names = settings.kafka.names
    horizon_s = settings.dedup_horizon_s if history is not None else 0.0
    late = None
    progress = None
    if history is not None and horizon_s > 0:
        resources = [*resources, history]
        if settings.dedup_sink_group:
            progress = SinkProgress(
                settings.kafka,
                settings.sink_group_id,
                margin_s=settings.dedup_sink_margin_s,
                topic=names.state,
            )
            resources = [*resources, progress]
        late = LateRedeliveries(
            history,
            horizon_s=horizon_s,
            margin_s=settings.dedup_margin_s,
            retry_s=settings.dedup_lookup_retry_s,
        )
    partitions = settings.kafka.partitions
    # The app is built below with the resources this list ends with; what reads it (the
    # share of partitions, the parking lot's count) is called only once the app runs.
    app: WorkerApp
    parking_lot: ParkingLot
    share = PartitionShare(lambda: app.consumer.assignment(), partitions, topic=names.intents)
    pacer = build_pacer(settings, share)

    def on_resume(kind: str, target: str) -> None:
        if kind == "instance":
            pacer.slow_start(target, pacer.clock())

    controls = Controls(on_resume=on_resume)
    # Not ready until the reader has read the whole topic: a job the opt-out list decides
    # waits until then (streams/optouts.py).
    optouts = OptOuts(ready=False)
    reader = ControlsReader(
        controls,
        settings.kafka,
        names.controls,
        decode_control,
        clock=time.time,
        optouts=optouts,
    )
    resources = [*resources, reader]
    if settings.lag_monitor:
        # Every worker exports every partition of its group (aggregate with max).
        lag = LagMonitor(
            settings.kafka,
            {settings.group_id: [names.intents, names.bulk_intents]},
            interval_s=settings.lag.interval_s,
            read_timeout_s=settings.lag.read_timeout_s,
            client_id="zapstream-worker-lag-monitor",
        )
        resources = [*resources, lag]
    pauses = InstancePauses(
        settings.instance_probe_s,
        probe_max_s=settings.instance_probe_max_s,
        waiting=lambda instance: parking_lot.waiting(instance),
    )
    # First: the worker's lifecycle (started first, stopped last: its closing line comes
    # after everything else closed); then aiokafka's errors from the start on are one
    # outage line (kernel/kafka_outage.py).
    tally = WorkerTally()
    service = WorkerService(tally, streaming=lambda: readiness(app))
    first: list[Resource] = [service, KafkaOutageWatch("worker", settings.kafka), gateway]
    check: GatewayStartCheck | None = None
    if settings.start_probe:
        # Right after the gateway client starts, before any send: a wrong base URL, key or
        # listing is one line at start (streams/gateway_check.py), and the worker runs on;
        # an instance not configured is probed once when its first message is seen.
        g = settings.gateway
        check = GatewayStartCheck(
            gateway,
            pauses,
            settings.probe_instances or list(settings.instance_rates),
            timeout_s=g.pool_timeout_s + g.connect_timeout_s + g.read_timeout_s,
        )
        first.append(check)
    app = build_app(settings, resources=[*first, *resources])
    topics = register_topics(app, partitions, names)
    jobs, parked = register_tables(app, topics, partitions)
    parking_lot = ParkingLot(parked, topics.parked)
    writer = KafkaWriter(app)

    def owns(partition: int) -> bool:
        return TP(names.intents, partition) in app.consumer.assignment()

    dispatcher: Dispatcher
    horizon: DedupHorizon | None = None
    if late is not None:

        def referenced() -> set[int]:
            # Called once the app runs: the dispatcher is built below, from the processor
            # whose job store feeds the horizon.
            return set(dispatcher.active_jobs) | set(dispatcher.parking.job_ids())

        horizon = DedupHorizon(
            jobs,
            topics.state,
            horizon_s=horizon_s,
            partitions=partitions,
            scan_keys=settings.dedup_scan_keys,
            retry_s=settings.dedup_scan_interval_s,
            owns=owns,
            busy=lambda: bool(app.rebalancing or app.in_recovery),
            rebalances=lambda: app.rebalancing_count,
            referenced=referenced,
            durable_until=progress.durable_until if progress is not None else None,
        )
    processor = JobProcessor(
        gateway,
        FaustJobStore(
            jobs, writer, names.state, on_stored=horizon.noted if horizon is not None else None
        ),
        FaustPublisher(writer, names, publish_attempts=settings.publish_attempts),
        RetryPolicy(schedule_s=tuple(settings.retry_schedule_s), jitter=settings.retry_jitter),
        listing_authoritative=settings.gateway.listing_authoritative,
        listings=InstanceListings(
            gateway, listings_per_minute=settings.reconcile_listings_per_minute
        ),
        reconcile_max_wait_s=settings.reconcile_max_wait_s,
        first_sight=check.first_sight if check is not None else None,
        references=references,
        quiet_hours=QuietHours.parse(settings.quiet_hours) if settings.quiet_hours else None,
        pauses=pauses,
        template_pauses=TemplatePauses(settings.template_recheck_s),
        failures=FailureLog(
            summary_interval_s=settings.failure_summary_interval_s,
            quiet_period_s=settings.failure_quiet_period_s,
        ),
        late=late,
        pacer=pacer,
        breaker_failures=settings.breaker_failures,
        systemic_failures=settings.systemic_failures,
        controls=controls,
        optouts=optouts,
        pacing_wait_s={
            Priority.OPERATIONAL: settings.pacing_wait_operational_s,
            Priority.BULK: settings.pacing_wait_bulk_s,
        },
    )
    dispatcher = Dispatcher(
        app,
        topics,
        processor,
        parking_lot,
        max_in_flight=settings.max_in_flight,
        tally=tally,
    )
    # Bulk intents on their own topic and lanes: a campaign's backlog waits there (its
    # lanes full, its topic's offsets behind) while operational intents flow.
    bulk = Dispatcher(
        app,
        topics,
        processor,
        parking_lot,
        max_in_flight=settings.max_in_flight_bulk,
        priority=Priority.BULK,
        active_jobs=dispatcher.active_jobs,
        queued_jobs=dispatcher.queued_jobs,
        tally=tally,
    )
    app.agent(topics.intents, name="dispatcher", concurrency=1)(dispatcher.consume)
    app.agent(topics.bulk_intents, name="bulk-dispatcher", concurrency=1)(bulk.consume)

    async def fire_due_retries() -> None:
        await dispatcher.fire_due_retries()
        await bulk.fire_due_retries()

    # A bug in the retry scan or the horizon stops the worker (Faust crashes the app when an
    # app task raises; the supervisor restarts it); Kafka being away is waited out.
    timers = [
        Periodic("retries", settings.retry_scan_interval_s, fire_due_retries, crash_on_bug=True)
    ]

    if horizon is not None:
        if progress is not None:
            sink = progress

            async def read_sink_progress() -> None:
                await sink.refresh(p for p in range(partitions) if owns(p))

            timers.append(
                Periodic("sink progress", settings.dedup_sink_check_s, read_sink_progress)
            )

        forgetting = horizon

        async def forget_settled_jobs() -> None:
            await forgetting.tick()

        timers.append(
            Periodic(
                "dedup horizon",
                settings.dedup_scan_interval_s,
                forget_settled_jobs,
                crash_on_bug=True,
            )
        )

    app.task(_running(timers))
    app.after_streams_stopped.append(dispatcher.drain)
    app.after_streams_stopped.append(bulk.drain)
    setup_lean_prometheus(app)
    add_health_pages(app, service.readiness)
    add_digest_page(app)
    return app, dispatcher


def _running(timers: list[Periodic]) -> Callable[[], Awaitable[None]]:
    """The worker's timers as one Faust app task: Faust starts it once table recovery is over
    (as it starts its own timers), cancels it at shutdown (the timers stop), and crashes the
    app when it raises (a ``crash_on_bug`` timer's bug)."""

    async def run_timers() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for timer in timers:
                await stack.enter_async_context(timer)
            await asyncio.gather(*(timer.run() for timer in timers))

    return run_timers
