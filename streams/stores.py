"""The worker's Faust-backed stores: job states and published outcomes.

Each implements a port of :mod:`streams.job_processor` (``JobStore``, ``Publisher``)
and makes every write durable in Kafka before it returns. The parked
conversations' store is :class:`streams.parking.ParkingLot`.
"""

from __future__ import annotations

from typing import Any

from streams import metrics
from streams.contract import AttemptFinished, JobDead, StatusChanged, job_state_key
from streams.topics import Topics


def compact(raw: bytes) -> bytes:
    """``raw`` in an allocation of its own size.

    orjson returns small ``bytes`` inside allocations of several KB that are never
    shrunk (measured with orjson 3.13: a 500-byte state held 4,120 bytes, its copy
    538), and these tables hold one value per job or conversation.
    """
    return bytes(memoryview(raw))


class FaustJobStore:
    """Job states in the ``jobs`` table; ``put`` waits for Kafka to acknowledge the changelog.

    Faust's own ``table[key] = value`` goes through its producer buffer, whose flush
    before each offset commit never finishes while lanes keep writing; we send the
    changelog record ourselves to the partition of the conversation (co-partitioning)
    and update the table's local store first, so a lane reading the job in the
    meantime already sees the new state.
    """

    def __init__(self, table: Any, changelog: Any) -> None:
        self.table = table
        self.changelog = changelog

    def get(self, job_id: int) -> StatusChanged | None:
        raw = self.table.data.get(job_state_key(job_id))
        return StatusChanged.loads(raw) if raw is not None else None

    async def put(self, state: StatusChanged, partition: int) -> None:
        key, value = job_state_key(state.job_id), compact(state.dumps())
        self.table.data[key] = value
        await (await self.changelog.send(key=key, value=value, partition=partition))
        metrics.STATES.labels(state.status).inc()


class FaustPublisher:
    """Attempt outcomes to ``zapstream.results``, dead jobs to ``zapstream.dead``."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics

    async def attempt_finished(self, record: AttemptFinished, key: bytes) -> None:
        await (await self.topics.results.send(key=key, value=record.dumps()))
        metrics.ATTEMPTS.labels(record.gateway, record.outcome).inc()

    async def job_dead(self, record: JobDead) -> None:
        await (await self.topics.dead.send(key=str(record.job_id).encode(), value=record.dumps()))
        metrics.DEAD.inc()
