"""Write job states from ``zapstream.state`` back into PostgreSQL.

The state sink is its own consumer group on the state topic. It reads batches,
applies them to ``outbox_jobs`` and ``outbox_job_events`` in one transaction,
and commits the Kafka offsets only after PostgreSQL committed, so a crash
replays a batch at worst. Replays are harmless:

- ``outbox_jobs`` is updated only when the record's version is higher than the
  row's ``state_version``: a job never moves backwards, whatever the order or
  number of deliveries;
- ``outbox_job_events`` is unique on ``(job_id, version)``.

A record that does not decode is not skipped silently: it goes to
``zapstream.dead`` with the reason, then the sink moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from streams.contract import DEAD, STATE, ContractError, JobDead, StatusChanged
from streams.settings import KafkaSettings

log = logging.getLogger(__name__)

GROUP_ID = "zapstream-state-sink"

_UPDATE_JOBS = """
WITH batch AS (
    SELECT DISTINCT ON (id) *
    FROM unnest(%s::bigint[], %s::text[], %s::int[], %s::int[], %s::text[], %s::text[],
                %s::timestamptz[])
         AS b(id, status, version, attempts, gateway_job_id, last_error, sent_at)
    ORDER BY id, version DESC
)
UPDATE outbox_jobs AS j
SET status = b.status,
    state_version = b.version,
    attempts = greatest(j.attempts, b.attempts),
    gateway_job_id = coalesce(b.gateway_job_id, j.gateway_job_id),
    last_error = coalesce(b.last_error, j.last_error),
    sent_at = coalesce(j.sent_at, b.sent_at),
    updated_at = now()
FROM batch AS b
WHERE j.id = b.id AND j.state_version < b.version
"""

_INSERT_EVENTS = """
INSERT INTO outbox_job_events (job_id, from_status, to_status, version, actor, reason, at)
SELECT b.job_id, b.from_status, b.to_status, b.version, b.actor, b.reason, b.at
FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::int[], %s::text[], %s::text[],
            %s::timestamptz[])
     AS b(job_id, from_status, to_status, version, actor, reason, at)
WHERE EXISTS (SELECT 1 FROM outbox_jobs AS j WHERE j.id = b.job_id)
ON CONFLICT (job_id, version) DO NOTHING
"""


def _at(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


async def apply_states(conn: psycopg.AsyncConnection[Any], states: Sequence[StatusChanged]) -> int:
    """Apply state records in one transaction; return how many job rows moved forward."""
    if not states:
        return 0
    async with conn.transaction(), conn.cursor() as cur:
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
            ),
        )
    return moved


class StateSink:
    """Consumes ``zapstream.state`` and writes it into ``outbox_jobs``/``outbox_job_events``."""

    def __init__(
        self,
        kafka: KafkaSettings,
        dsn: str,
        *,
        batch_max: int = 500,
        poll_timeout_s: float = 0.2,
    ) -> None:
        self._kafka = kafka
        self._dsn = dsn
        self._batch_max = batch_max
        self._poll_timeout_ms = int(poll_timeout_s * 1000)
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self.applied = 0
        self.poisoned = 0
        self.on_failure: Callable[[BaseException], object] | None = None
        """Called when the sink cannot go on (PostgreSQL or Kafka failed); the worker crashes."""

    async def __aenter__(self) -> StateSink:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._task is not None:
            return
        self._conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self._kafka.bootstrap_servers, acks="all"
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            STATE,
            bootstrap_servers=self._kafka.bootstrap_servers,
            group_id=GROUP_ID,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(self._kafka.session_timeout_s * 1000),
            heartbeat_interval_ms=int(self._kafka.heartbeat_interval_s * 1000),
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._run(), name="state-sink")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _run(self) -> None:
        try:
            await self._consume()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("state sink failed")
            if self.on_failure is not None:
                self.on_failure(exc)
            raise

    async def _consume(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            batches = await consumer.getmany(
                timeout_ms=self._poll_timeout_ms, max_records=self._batch_max
            )
            records = [r for rs in batches.values() for r in rs]
            if not records:
                continue
            await self._handle(records)
            await consumer.commit()

    async def _handle(self, records: list[ConsumerRecord[Any, Any]]) -> None:
        states: list[StatusChanged] = []
        for record in records:
            try:
                states.append(StatusChanged.loads(record.value))
            except ContractError as exc:
                await self._poison(record, str(exc))
        assert self._conn is not None
        await apply_states(self._conn, states)
        self.applied += len(states)

    async def _poison(self, record: ConsumerRecord[Any, Any], reason: str) -> None:
        self.poisoned += 1
        log.error(
            "state record %s[%d]@%d does not decode: %s",
            record.topic,
            record.partition,
            record.offset,
            reason,
        )
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
        await (await self._producer.send(DEAD, dead.dumps()))
