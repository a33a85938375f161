"""The dedup horizon: the ``jobs`` table forgets settled jobs, so its memory stays bounded.

A timer (:meth:`DedupHorizon.tick`) walks the table round-robin, at most
``scan_keys`` keys per tick, and removes each job that is settled (sent, failed,
dead, expired, cancelled, invalid: :data:`FORGETTABLE`) and whose last change
(``StatusChanged.at``) is older than ``horizon_s``. Removing means: gone from the
table's store *and* a tombstone (value None) on the changelog, ``zapstream.state``,
with the state record's key and partition, so recovery and compaction forget it
too (the state sink ignores tombstones).

Never forgotten: a job still moving (PENDING, ATTEMPTING, RETRY_WAIT), one that
waits for an operator's decision (UNCERTAIN, REVIEW), one a parked conversation
refers to or a lane is working on, a key of a partition this worker does not own,
a job whose last state the state sink has not yet written to PostgreSQL (the
table is the only record of it until then: :mod:`streams.sink_progress`), and
nothing at all while Faust rebalances or recovers tables.

A late redelivery of a forgotten job is recognised by :mod:`streams.kernel.job_history`.

The partition of a key is where the store says it recovered it from, else the
conversation's partition under Kafka's default (murmur2) partitioner, which is
how every producer of ``zapstream.intents`` places intents, hence where the
worker wrote the job's state (co-partitioning).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Collection
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2
from prometheus_client import Counter, Gauge

from streams.faust_adapter.hooks import key_partitions
from streams.kernel.contract import JobStatus, conversation_partition_key
from streams.kernel.state_machine import SETTLED

log = logging.getLogger(__name__)
S = JobStatus

FORGETTABLE = SETTLED - {S.UNCERTAIN, S.REVIEW}
"""Settled and needing nobody: UNCERTAIN and REVIEW wait for an operator and stay."""

JOBS_TABLE_SIZE = Gauge("zapstream_jobs_table_size", "Jobs held in this worker's jobs table")
FORGOTTEN = Counter(
    "zapstream_jobs_forgotten_total",
    "Settled jobs removed from the jobs table after the dedup horizon (tombstoned)",
)


def default_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as aiokafka and Java) gives ``key``."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def forgettable(raw: bytes, cutoff: dt.datetime) -> tuple[str, str, dt.datetime] | None:
    """(instance id, conversation key, last change) of a stored state to forget, else None."""
    data = orjson.loads(raw)
    if data.get("status") not in FORGETTABLE:
        return None
    at = data.get("at")
    if not at:
        return None
    changed = dt.datetime.fromisoformat(at)
    if changed >= cutoff:
        return None
    return str(data["instance_id"]), str(data["conversation_key"]), changed


class DedupHorizon:
    """Forgets settled jobs older than ``horizon_s``, ``scan_keys`` keys per :meth:`tick`."""

    def __init__(
        self,
        table: Any,
        changelog: Any,
        *,
        horizon_s: float,
        partitions: int,
        scan_keys: int = 10_000,
        owns: Callable[[int], bool] = lambda partition: True,
        busy: Callable[[], bool] = lambda: False,
        referenced: Callable[[], Collection[int]] = frozenset,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        durable_until: Callable[[int], dt.datetime | None] | None = None,
    ) -> None:
        """``owns``: this worker owns the partition; ``busy``: Faust rebalances or recovers;
        ``referenced``: job ids parked conversations and lanes hold (never forgotten);
        ``durable_until``: for a partition of ``zapstream.state``, the time before which
        every state is in PostgreSQL (:mod:`streams.sink_progress`); a job changed at or
        after it is kept, and None keeps the whole partition. Without it, jobs are
        forgotten whether or not the state sink wrote them."""
        self.table = table
        self.changelog = changelog
        self.horizon_s = horizon_s
        self.partitions = partitions
        self.scan_keys = scan_keys
        self.owns = owns
        self.busy = busy
        self.referenced = referenced
        self.now = now
        self.durable_until = durable_until
        self._sweep: list[bytes] = []
        self._position = 0
        self._keep: Collection[int] = frozenset()
        self.forgotten = 0
        # Read at scrape time: a value set by the sweep would go stale while the sweep
        # waits out a rebalance or a recovery.
        JOBS_TABLE_SIZE.set_function(lambda: len(self.store))

    @property
    def store(self) -> Any:
        """The table's store (a mapping of key -> encoded state)."""
        return self.table.data

    async def tick(self) -> int:
        """Scan the next keys of the sweep; forget what is due. Returns how many were forgotten."""
        if self.busy():
            self._sweep, self._position = [], 0  # keys and ownership change: start again
            return 0
        if self._position >= len(self._sweep):
            # A new sweep: a snapshot of the keys (references only, no copies of values).
            self._sweep, self._position = list(self.store.keys()), 0
            self._keep = self.referenced()
        end = min(self._position + self.scan_keys, len(self._sweep))
        keys, self._position = self._sweep[self._position : end], end
        if self._position >= len(self._sweep):
            self._sweep = []
        cutoff = self.now() - dt.timedelta(seconds=self.horizon_s)
        due: list[tuple[bytes, int]] = []
        for key in keys:
            raw = self.store.get(key)
            if raw is None:
                continue
            where = forgettable(raw, cutoff)
            if where is None or int(key) in self._keep:
                continue
            partition = self._partition_of(key, where)
            if not self.owns(partition) or not self._in_postgres(partition, where[2]):
                continue
            due.append((key, partition))
        if due:
            await self._forget(due)
        return len(due)

    def _partition_of(self, key: bytes, where: tuple[str, str, dt.datetime]) -> int:
        recovered = key_partitions(self.store)
        if recovered is not None and key in recovered:
            return recovered[key]
        return default_partition(conversation_partition_key(where[0], where[1]), self.partitions)

    def _in_postgres(self, partition: int, changed: dt.datetime) -> bool:
        """Whether the state sink already wrote this job's last state (see ``durable_until``)."""
        if self.durable_until is None:
            return True
        until = self.durable_until(partition)
        return until is not None and changed < until

    async def _forget(self, due: list[tuple[bytes, int]]) -> None:
        recovered = key_partitions(self.store)
        for key, _ in due:
            self.store.pop(key, None)
            if recovered is not None:
                recovered.pop(key, None)
        try:
            acks = [
                await self.changelog.send(key=key, value=None, partition=partition)
                for key, partition in due
            ]
            await asyncio.gather(*acks)
        except KafkaError as exc:
            # Forgotten here already; the changelog keeps the states until a later
            # restart brings them back and a later sweep forgets them again.
            log.warning(
                "dedup horizon: %d tombstones not acknowledged by Kafka (%s); the states "
                "come back at the next recovery and are forgotten again",
                len(due),
                exc,
            )
            return
        self.forgotten += len(due)
        FORGOTTEN.inc(len(due))
        log.info(
            "dedup horizon: forgot %d settled jobs older than %.0fs (%d in the table)",
            len(due),
            self.horizon_s,
            len(self.store),
        )
