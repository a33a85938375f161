"""Write job states from ``zapstream.state`` back into PostgreSQL.

``zapstream sink`` runs one :class:`StateSink`: its own process, its own
consumer group on the state topic, so a PostgreSQL problem never touches the
workers that send. It reads batches,
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
import datetime as dt
import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from connectors.sink.settings import SinkSettings
from streams.contract import DEAD, STATE, ContractError, JobDead, StatusChanged

log = logging.getLogger(__name__)

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
    """Consumes ``zapstream.state`` and writes it into ``outbox_jobs``/``outbox_job_events``.

    :meth:`run` works until :meth:`request_stop`; the batch in hand is written and
    its offsets committed before it returns, so a SIGTERM loses and replays nothing.
    """

    def __init__(self, settings: SinkSettings) -> None:
        self._settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._stopping = asyncio.Event()
        self._started = False
        self._started_at = time.monotonic()
        self.applied = 0
        self.poisoned = 0

    async def __aenter__(self) -> StateSink:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        kafka = self._settings.kafka
        self._conn = await psycopg.AsyncConnection.connect(
            self._settings.postgres.dsn, autocommit=True
        )
        self._producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            STATE,
            bootstrap_servers=kafka.bootstrap_servers,
            group_id=self._settings.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(kafka.session_timeout_s * 1000),
            heartbeat_interval_ms=int(kafka.heartbeat_interval_s * 1000),
        )
        await self._consumer.start()
        log.info("state sink consuming %s as group %s", STATE, self._settings.group_id)

    def request_stop(self) -> None:
        """Ask :meth:`run` to finish the batch in hand and return (signal handlers call this)."""
        self._stopping.set()

    async def stop(self) -> None:
        self._stopping.set()
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def run(self) -> None:
        """Write batches until :meth:`request_stop`; then log one summary line."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        poll_ms = int(self._settings.within_s * 1000)
        while not self._stopping.is_set():
            batches = await consumer.getmany(timeout_ms=poll_ms, max_records=self._settings.batch)
            records = [r for rs in batches.values() for r in rs]
            if not records:
                continue
            # A stop request arriving now waits for this batch: written, then committed.
            await self._handle(records)
            await consumer.commit()
        log.info(
            "state sink stopped: %d states applied, %d poison records, %.1fs",
            self.applied,
            self.poisoned,
            time.monotonic() - self._started_at,
        )

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
