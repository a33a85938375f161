"""Write job states (``zapstream.state``) and rejections (``zapstream.invalid``) to PostgreSQL.

``zapstream sink`` runs one :class:`StateSink`: its own process, its own
consumer group, so a PostgreSQL problem never touches the workers that send.
It reads batches, applies them to ``outbox_jobs`` and ``outbox_job_events`` in
one transaction, and commits the Kafka offsets only after PostgreSQL committed,
so a crash replays a batch at worst. Replays are harmless:

- ``outbox_jobs`` is updated only when the record's version is higher than the
  row's ``state_version``: a job never moves backwards, whatever the order or
  number of deliveries; an INVALID job never moves at all;
- ``outbox_job_events`` is unique on ``(job_id, version)``, and a batch's events
  are inserted in ``(job_id, version)`` order, so their ids follow the versions.

A record of ``zapstream.invalid`` (:class:`~streams.kernel.contract.IntentRejected`)
for an outbox row makes its job INVALID, with the reason in ``last_error`` and
an event by the actor ``relay``, only while the job is still PENDING: a settled
state is never overwritten. A rejected *command* row (a cancel or reprocess the
relay could not turn into a command) changes no job; neither does a rejection
without a job id. Both are logged and counted.

A record that does not decode is not skipped silently: it goes to
``zapstream.dead`` with the reason, then the sink moves on.

PostgreSQL and Kafka failures are classified once (:mod:`connectors.sink.failures`):
a transient one (the database or broker away) is waited out with capped,
jittered backoff, retrying the same batch and committing nothing; a permanent
one (credentials, missing database, missing schema) stops the sink with one
line naming the setting or command, exit status 2.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import KafkaError

from connectors.sink import metrics
from connectors.sink.failures import Rebalanced, SinkConfigError, classify, sink_outage
from connectors.sink.pipeline_metrics import PipelineGauges
from connectors.sink.settings import SinkSettings
from streams.kernel.contract import (
    ContractError,
    IntentRejected,
    JobDead,
    JobStatus,
    StatusChanged,
)
from streams.kernel.failures import MIGRATE
from streams.kernel.kafka_outage import KafkaOutageWatch
from streams.kernel.postgres import postgres_deadline
from streams.kernel.runtime.backoff import Backoff
from streams.kernel.runtime.health import HealthEndpoint
from streams.kernel.runtime.service import Service

log = logging.getLogger(__name__)
T = TypeVar("T")

_UPDATE_JOBS = """
WITH batch AS (
    SELECT DISTINCT ON (id) *
    FROM unnest(%s::bigint[], %s::text[], %s::int[], %s::int[], %s::text[], %s::text[],
                %s::timestamptz[], %s::timestamptz[])
         AS b(id, status, version, attempts, gateway_job_id, last_error, sent_at, due_at)
    ORDER BY id, version DESC
)
UPDATE outbox_jobs AS j
SET status = b.status,
    state_version = b.version,
    attempts = greatest(j.attempts, b.attempts),
    gateway_job_id = coalesce(b.gateway_job_id, j.gateway_job_id),
    last_error = coalesce(b.last_error, j.last_error),
    sent_at = coalesce(j.sent_at, b.sent_at),
    -- A job the worker held for quiet hours waits SCHEDULED until then (the release).
    next_retry_at = CASE WHEN b.status = 'SCHEDULED' THEN b.due_at ELSE j.next_retry_at END,
    updated_at = now()
FROM batch AS b
WHERE j.id = b.id AND j.state_version < b.version AND j.status <> 'INVALID'
"""

# ORDER BY: the events' ids follow (job, version), so a reader ordering by id sees
# a job's transitions in the order they happened, whatever order the batch had.
_INSERT_EVENTS = """
INSERT INTO outbox_job_events
    (job_id, from_status, to_status, version, actor, reason, at, outcome, command_id)
SELECT b.job_id, b.from_status, b.to_status, b.version, b.actor, b.reason, b.at,
       b.outcome, b.command_id
FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::int[], %s::text[], %s::text[],
            %s::timestamptz[], %s::text[], %s::bigint[])
     AS b(job_id, from_status, to_status, version, actor, reason, at, outcome, command_id)
WHERE EXISTS (SELECT 1 FROM outbox_jobs AS j WHERE j.id = b.job_id)
ORDER BY b.job_id, b.version
ON CONFLICT (job_id, version) DO NOTHING
"""

# Only a job still PENDING becomes INVALID: the relay's verdict never overwrites a
# state the worker settled, and a replayed rejection finds the job INVALID already.
_MARK_INVALID = """
WITH rejected AS (
    SELECT DISTINCT ON (id) id, reason
    FROM unnest(%s::bigint[], %s::text[]) AS r(id, reason)
    ORDER BY id
), moved AS (
    UPDATE outbox_jobs AS j
    SET status = 'INVALID',
        last_error = r.reason,
        state_version = j.state_version + 1,
        updated_at = now()
    FROM rejected AS r
    WHERE j.id = r.id AND j.status = 'PENDING'
    RETURNING j.id, j.state_version, r.reason
), events AS (
    INSERT INTO outbox_job_events (job_id, from_status, to_status, version, actor, reason)
    SELECT id, 'PENDING', 'INVALID', state_version, 'relay', reason FROM moved ORDER BY id
    ON CONFLICT (job_id, version) DO NOTHING
)
SELECT count(*) FROM moved
"""

_SCHEMA_COLUMNS = """
SELECT table_name || '.' || column_name
FROM information_schema.columns
WHERE table_schema = current_schema()
  AND table_name IN ('outbox_jobs', 'outbox_job_events')
"""
_REQUIRED_COLUMNS = frozenset(
    {
        "outbox_jobs.status",
        "outbox_jobs.state_version",
        "outbox_job_events.version",
        "outbox_job_events.outcome",
        "outbox_job_events.command_id",
    }
)


def _at(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


@dataclasses.dataclass(frozen=True, slots=True)
class Applied:
    """What one batch did in PostgreSQL."""

    moved: int
    """``outbox_jobs`` rows moved forward by state records."""
    invalid: int
    """Jobs set INVALID by rejections."""


async def apply_batch(
    conn: psycopg.AsyncConnection[Any],
    states: Sequence[StatusChanged],
    invalid: Sequence[tuple[int, str]] = (),
) -> Applied:
    """Apply state records and (job id, reason) rejections in one transaction."""
    if not states and not invalid:
        return Applied(0, 0)
    moved = marked = 0
    async with conn.transaction(), conn.cursor() as cur:
        if states:
            await cur.execute(
                _UPDATE_JOBS,
                (
                    [s.job_id for s in states],
                    [s.status for s in states],
                    [s.version for s in states],
                    [s.attempts for s in states],
                    [s.gateway_job_id for s in states],
                    [s.reason for s in states],
                    [_at(s.sent_at) for s in states],
                    [_at(s.next_retry_at) if s.status == "SCHEDULED" else None for s in states],
                ),
            )
            moved = cur.rowcount
            await cur.execute(
                _INSERT_EVENTS,
                (
                    [s.job_id for s in states],
                    [s.previous for s in states],
                    [s.status for s in states],
                    [s.version for s in states],
                    [s.actor for s in states],
                    [s.reason for s in states],
                    [_at(s.at) or dt.datetime.now(dt.UTC) for s in states],
                    [s.outcome for s in states],
                    [s.command_id for s in states],
                ),
            )
        if invalid:
            await cur.execute(
                _MARK_INVALID, ([job_id for job_id, _ in invalid], [r for _, r in invalid])
            )
            row = await cur.fetchone()
            marked = int(row[0]) if row else 0
    return Applied(moved, marked)


async def apply_states(conn: psycopg.AsyncConnection[Any], states: Sequence[StatusChanged]) -> int:
    """Apply state records in one transaction; return how many job rows moved forward."""
    return (await apply_batch(conn, states)).moved


def is_command_rejection(rejected: IntentRejected) -> bool:
    """Whether the rejected row is an ``outbox_commands`` row (it names a command), not a job's."""
    return "command" in rejected.row


class _Stopped(Exception):
    """A stop was requested while waiting out an outage."""


@dataclasses.dataclass(slots=True)
class _Decoded:
    states: list[StatusChanged] = dataclasses.field(default_factory=list)
    invalid: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    poison: list[tuple[ConsumerRecord[Any, Any], str]] = dataclasses.field(default_factory=list)


def _check_state(state: StatusChanged) -> StatusChanged:
    JobStatus(state.status)
    JobStatus(state.previous)
    _at(state.at)
    _at(state.sent_at)
    return state


class StateSink(Service):
    """Consumes ``zapstream.state`` and ``zapstream.invalid`` into ``outbox_jobs``/``_events``.

    A :class:`~streams.kernel.runtime.service.Service`: starting serves ``/metrics``,
    ``/healthz`` and ``/readyz`` (a :class:`~streams.kernel.runtime.health.HealthEndpoint`)
    and the pipeline gauges (children); :meth:`run` connects to PostgreSQL (schema
    checked) and Kafka, retrying while they are away, then works until
    :meth:`request_stop`. The batch in hand is written and its offsets committed before
    it returns, so a SIGTERM loses and replays nothing. During an outage a stop request
    ends the wait: the batch is not written, its offsets are not committed, and it is
    replayed on the next start.
    """

    name = "state sink"

    def __init__(self, settings: SinkSettings) -> None:
        super().__init__()
        self._settings = settings
        self._names = settings.kafka.names
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._outages = {
            "postgres": sink_outage("postgres", log),
            "kafka": sink_outage("kafka", log),
        }
        # aiokafka's own errors (a broker away, a leader moving): one kafka outage above.
        self._kafka_watch = KafkaOutageWatch("sink", settings.kafka, target=self._outages["kafka"])
        # Served from the start, so probes see "starting" while the dependencies are away.
        self._health = HealthEndpoint(
            settings.metrics_port,
            bind_local=settings.metrics_bind_local,
            readiness=self.readiness,
            name="state sink",
            logger=log,
            port_setting="ZAPSTREAM_SINK_METRICS_PORT",
        )
        self.add_child(self._health)
        if settings.metrics_port:
            # The pipeline gauges, on a timer and a connection of their own (only with metrics).
            self.add_child(
                PipelineGauges(
                    settings.postgres,
                    interval_s=settings.pipeline_metrics_interval_s,
                    connect_timeout_s=settings.connect_timeout_s,
                )
            )
        self.applied = 0
        self.poisoned = 0
        self.invalid = 0
        self.rejections_ignored = 0

    @property
    def outages(self) -> dict[str, int]:
        """How many outages each dependency had since the start."""
        return {name: o.outages for name, o in self._outages.items()}

    async def on_start(self) -> None:
        await self._kafka_watch.start()

    async def on_stop(self) -> None:
        await self._stop_kafka()
        await self._kafka_watch.stop()
        await self._drop_postgres()

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: consuming and writing, or why not."""
        if self.stop_requested:
            return False, "stopping"
        if self._consumer is None:
            return False, "starting"
        for dependency, outage in self._outages.items():
            if outage.ongoing:
                return False, f"{dependency} unavailable"
        return True, "consuming"

    def summary(self) -> str:
        return (
            f"{self.applied} states applied, {self.invalid} jobs INVALID, "
            f"{self.rejections_ignored} rejections ignored, {self.poisoned} poison records, "
            f"outages {self.outages}"
        )

    async def run(self) -> None:
        """Connect, then write batches until :meth:`request_stop`."""
        try:
            await self._retry(self._connect_postgres)
            await self._retry(self._start_kafka)
        except _Stopped:
            log.info("state sink stopped before it could start")
            return
        log.info(
            "state sink consuming %s, %s as group %s%s",
            self._names.state,
            self._names.invalid,
            self._settings.consumer_group,
            f"; metrics on {self._health.url}" if self._health.url else "",
        )
        assert self._consumer is not None
        await self._consume(self._consumer)

    async def _consume(self, consumer: AIOKafkaConsumer) -> None:
        poll_ms = int(self._settings.within_s * 1000)
        pending = 0
        try:
            while not self.stop_requested:
                try:
                    batches = await self._retry(
                        lambda: consumer.getmany(
                            timeout_ms=poll_ms, max_records=self._settings.batch
                        )
                    )
                except KafkaError as exc:
                    self._rebalanced(exc)
                    continue
                records = [r for rs in batches.values() for r in rs]
                if not records:
                    continue
                await self._gather(consumer, records)
                pending = len(records)
                # A stop request arriving now waits for this batch: written, then committed.
                await self._handle(records)
                await self._commit()
                pending = 0
        except _Stopped:
            log.warning(
                "state sink stopped during an outage: %d records not written and not "
                "committed; they are replayed on the next start",
                pending,
            )

    async def _gather(self, consumer: AIOKafkaConsumer, records: list[Any]) -> None:
        """Add to ``records`` what arrives within ``gather_s`` (up to ``batch``).

        Measured at 500 messages/s end to end (two states each): the sink wrote a
        transaction per fetch, and it and PostgreSQL took half a core between them on a
        2-core machine that the whole pipeline shared. A failure while gathering ends the
        gathering: what is at hand is written, and the next poll meets the failure again
        (:meth:`_retry`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.gather_s
        limit = self._settings.batch
        while len(records) < limit and not self.stop_requested:
            left_ms = int((deadline - loop.time()) * 1000)
            if left_ms <= 0:
                return
            try:
                more = await consumer.getmany(timeout_ms=left_ms, max_records=limit - len(records))
            except KafkaError:
                return
            for batch in more.values():
                records.extend(batch)

    # --- one batch ------------------------------------------------------------------------

    async def _handle(self, records: list[ConsumerRecord[Any, Any]]) -> None:
        decoded = self._decode(records)
        for record, reason in decoded.poison:
            self.poisoned += 1
            metrics.POISON.labels(record.topic).inc()
            log.error(
                "record %s[%d]@%d does not decode, sent to %s: %s",
                record.topic,
                record.partition,
                record.offset,
                self._names.dead,
                reason,
            )
            await self._retry(functools.partial(self._poison, record, reason))
        applied = await self._retry(lambda: self._write(decoded.states, decoded.invalid))
        self.applied += len(decoded.states)
        self.invalid += applied.invalid
        settled = len(decoded.invalid) - applied.invalid
        self.rejections_ignored += settled
        metrics.STATES.inc(len(decoded.states))
        metrics.JOBS_MOVED.inc(applied.moved)
        metrics.REJECTED.labels("invalid").inc(applied.invalid)
        metrics.REJECTED.labels("settled").inc(settled)
        metrics.BATCHES.inc()
        if settled:
            log.info(
                "%d rejected rows left alone: their jobs are no longer PENDING (or unknown)",
                settled,
            )

    def _decode(self, records: list[ConsumerRecord[Any, Any]]) -> _Decoded:
        decoded = _Decoded()
        for record in records:
            if record.value is None:
                continue  # a tombstone: the worker forgot a settled job (dedup horizon)
            try:
                if record.topic == self._names.invalid:
                    self._rejection(IntentRejected.loads(record.value), decoded)
                else:
                    decoded.states.append(_check_state(StatusChanged.loads(record.value)))
            except ContractError as exc:
                decoded.poison.append((record, str(exc)))
            except (ValueError, TypeError) as exc:
                decoded.poison.append((record, f"{record.topic}: {exc}"))
        return decoded

    def _rejection(self, rejected: IntentRejected, decoded: _Decoded) -> None:
        if rejected.job_id is None:
            self.rejections_ignored += 1
            metrics.REJECTED.labels("no_job_id").inc()
            log.warning(
                "rejected row without a job id (lsn %s), nothing to mark INVALID: %s",
                rejected.lsn,
                rejected.reason,
            )
        elif is_command_rejection(rejected):
            self.rejections_ignored += 1
            metrics.REJECTED.labels("command").inc()
            log.warning(
                "a %s command on job %d was rejected by the relay and not applied: %s",
                rejected.row.get("command"),
                rejected.job_id,
                rejected.reason,
            )
        else:
            decoded.invalid.append((rejected.job_id, rejected.reason))

    async def _write(
        self, states: Sequence[StatusChanged], invalid: Sequence[tuple[int, str]]
    ) -> Applied:
        if self._conn is None or self._conn.closed:
            await self._connect_postgres()
        assert self._conn is not None
        postgres = self._settings.postgres
        conn = self._conn
        async with postgres_deadline(postgres.query_timeout_s, "the sink's batch write", conn):
            return await apply_batch(conn, states, invalid)

    async def _commit(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        try:
            await self._retry(consumer.commit)
        except KafkaError as exc:
            # The batch is in PostgreSQL; whoever owns the partitions now replays it harmlessly.
            self._rebalanced(exc)

    def _rebalanced(self, exc: KafkaError) -> None:
        """Log a rebalance (the consumer rejoins by itself); re-raise anything else."""
        failure = classify(exc)
        if not isinstance(failure, Rebalanced):
            raise exc
        log.info(
            "the group rebalanced (%s): uncommitted records are replayed, harmlessly",
            failure.problem,
        )

    async def _poison(self, record: ConsumerRecord[Any, Any], reason: str) -> None:
        assert self._producer is not None
        dead = JobDead(
            job_id=None,
            idempotency_key=None,
            reason=f"state sink: {reason}",
            record={
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "value": (record.value or b"").decode("utf-8", "replace"),
            },
        )
        await (await self._producer.send(self._names.dead, dead.dumps()))

    # --- waiting out outages ---------------------------------------------------------------

    async def _retry(self, step: Callable[[], Awaitable[T]]) -> T:
        """Run ``step`` until it succeeds, waiting out transient failures with backoff.

        Permanent failures raise :class:`SinkConfigError` after one log line; a
        rebalance and anything unclassified (a bug) propagate as they are; a stop
        request during the wait raises :class:`_Stopped`.
        """
        backoff = Backoff(self._settings.retry_initial_s, self._settings.retry_max_s)
        failed: set[str] = set()
        while True:
            try:
                result = await step()
            except (psycopg.Error, KafkaError, OSError) as exc:
                failure = classify(exc)
                if failure is None or isinstance(failure, Rebalanced):
                    raise
                if not failure.retriable:
                    raise self._fatal(failure.problem) from exc
                delay = backoff.next_delay_s()
                self._outages[failure.dependency].failed(failure.problem, delay)
                failed.add(failure.dependency)
                if failure.dependency == "postgres":
                    await self._drop_postgres()
                try:
                    await asyncio.wait_for(self.wait_stop_requested(), delay)
                except TimeoutError:
                    continue
                raise _Stopped from exc
            for dependency in failed:
                self._outages[dependency].recovered()
            return result

    def _fatal(self, problem: str) -> SinkConfigError:
        # Not logged here: `zapstream sink` prints the one line naming the sink (exit 2).
        return SinkConfigError(problem)

    # --- connections ---------------------------------------------------------------------------

    async def _connect_postgres(self) -> None:
        await self._drop_postgres()
        postgres = self._settings.postgres
        conn = await psycopg.AsyncConnection.connect(
            postgres.service_dsn,
            autocommit=True,
            connect_timeout=self._settings.connect_timeout_s,
        )
        try:
            async with postgres_deadline(postgres.query_timeout_s, "the sink's schema check", conn):
                cur = await conn.execute(_SCHEMA_COLUMNS)
                present = {str(row[0]) for row in await cur.fetchall()}
        except BaseException:
            await conn.close()
            raise
        missing = sorted(_REQUIRED_COLUMNS - present)
        if missing:
            await conn.close()
            what = (
                "the outbox tables do not exist in this database"
                if not present
                else f"the outbox schema is out of date (missing {', '.join(missing)})"
            )
            raise self._fatal(f"{what}: {MIGRATE} (ZAPSTREAM_DATABASE_URL names the database)")
        self._conn = conn

    async def _drop_postgres(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                await conn.close()
            except psycopg.Error as exc:  # the connection is gone already
                log.debug("closing a broken PostgreSQL connection: %s", exc)

    async def _start_kafka(self) -> None:
        await self._stop_kafka()
        kafka = self._settings.kafka
        producer = AIOKafkaProducer(
            **kafka.client_options(), **kafka.deadline_options(), acks="all"
        )
        consumer = AIOKafkaConsumer(
            self._names.state,
            self._names.invalid,
            **kafka.client_options(),
            **kafka.deadline_options(),
            group_id=self._settings.consumer_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(kafka.session_timeout_s * 1000),
            heartbeat_interval_ms=int(kafka.heartbeat_interval_s * 1000),
            fetch_max_wait_ms=kafka.consumer_fetch_max_wait_ms,
            # zapstream.invalid comes from the relay: never an aborted transaction's records.
            isolation_level=kafka.consumer_isolation_level,
        )
        # Assigned before start(), so a failed start is stopped by the next attempt or stop().
        self._producer, self._consumer = producer, consumer
        await producer.start()
        await consumer.start()

    async def _stop_kafka(self) -> None:
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        if consumer is not None:
            await consumer.stop()
        if producer is not None:
            await producer.stop()
