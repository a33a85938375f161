"""The dedup horizon: the ``jobs`` table forgets settled jobs, so its memory stays bounded.

A job is forgotten once it is settled (sent, failed, dead, expired, cancelled, invalid:
:data:`FORGETTABLE`) and its last change (``StatusChanged.at``) is older than
``horizon_s``. Forgetting means: gone from the table's store *and* a tombstone (value
None) on the changelog, ``zapstream.state``, with the state record's key and partition,
so recovery and compaction forget it too (the state sink ignores tombstones).

Never forgotten: a job still moving (PENDING, ATTEMPTING, RETRY_WAIT), one that
waits for an operator's decision (UNCERTAIN, REVIEW), one a parked conversation
refers to or a lane is working on, a key of a partition this worker does not own,
a job whose last state the state sink has not yet written to PostgreSQL (the
table is the only record of it until then: :mod:`streams.sink_progress`), and
nothing at all while Faust rebalances or recovers tables.

Finding them is incremental, so a tick costs what is due, not what the table holds
(a scan decoding every state every sweep cost 3.6% of the worker's CPU on the bench
and grew with the table): :meth:`DedupHorizon.noted` indexes each settled state as
the job store writes it (``FaustJobStore(on_stored=...)``), by when it falls due (its
``at`` plus the horizon), and a timer (:meth:`DedupHorizon.tick`) takes what is due,
at most ``scan_keys`` per tick. Each is judged by the table's *current* state, the
only one decoded: gone or moving again, it leaves the index (a later settled state is
noted when written); settled later, it goes back under that state's due time; held
back by a reference or by the state sink, it is tried again ``retry_s`` later; of a
partition not owned, it leaves the index (its owner indexes it). States the table
holds without having been written here (recovered from the changelog at start or
after a rebalance) are indexed by one sweep over the table after each rebalance,
``scan_keys`` keys per tick, which also forgets those already due.

The index is a heap of ints, each a job's due time in milliseconds above its id
(``due_ms << 64 | job_id + 2**63``): 48 bytes per entry (a 40-byte int and the
list's pointer; measured with tracemalloc, 100,000 entries: 4.8 MB), one entry per
settled state written, so a job accepted, then delivered, then read holds three
until the first falls due. Every entry of a job falls due by the time the job does
(a job's ``at`` only grows), so once it is forgotten its entries leave the index in
the same tick, or the next ones when ``scan_keys`` cut the tick short.

A late redelivery of a forgotten job is recognised by :mod:`streams.kernel.job_history`.

The partition of a key is where the store says it recovered it from, else the
conversation's partition under Kafka's default (murmur2) partitioner, which is
how every producer of ``zapstream.intents`` places intents, hence where the
worker wrote the job's state (co-partitioning).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import logging
import math
from collections.abc import Callable, Collection
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2
from prometheus_client import Counter, Gauge

from streams.faust_adapter.hooks import key_partitions
from streams.kernel.contract import (
    JobStatus,
    StatusChanged,
    conversation_partition_key,
    job_state_key,
)
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

# An index entry: the due time (ms) in the high bits, the job id (a PostgreSQL bigint,
# shifted to be unsigned) in the low 64, so the heap orders entries by due time.
_ID_BITS = 64
_ID_OFFSET = 1 << 63
_ID_MASK = (1 << _ID_BITS) - 1


def default_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as aiokafka and Java) gives ``key``."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def settled_state(raw: bytes) -> tuple[str, str, dt.datetime] | None:
    """(instance id, conversation key, last change) of a stored state that is forgettable
    once old enough, else None."""
    data = orjson.loads(raw)
    if data.get("status") not in FORGETTABLE:
        return None
    at = data.get("at")
    if not at:
        return None
    return str(data["instance_id"]), str(data["conversation_key"]), dt.datetime.fromisoformat(at)


def _ms(moment: dt.datetime) -> int:
    return math.floor(moment.timestamp() * 1000)


class DedupHorizon:
    """Forgets settled jobs older than ``horizon_s``: what :meth:`noted` indexed and is due,
    at most ``scan_keys`` per :meth:`tick`."""

    def __init__(
        self,
        table: Any,
        changelog: Any,
        *,
        horizon_s: float,
        partitions: int,
        scan_keys: int = 10_000,
        retry_s: float = 1.0,
        owns: Callable[[int], bool] = lambda partition: True,
        busy: Callable[[], bool] = lambda: False,
        rebalances: Callable[[], int] = lambda: 0,
        referenced: Callable[[], Collection[int]] = frozenset,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        durable_until: Callable[[int], dt.datetime | None] | None = None,
    ) -> None:
        """``owns``: this worker owns the partition; ``busy``: Faust rebalances or recovers;
        ``rebalances``: how many rebalances Faust has begun (a new one means the table may
        hold states recovered since, to index by a sweep);
        ``referenced``: job ids parked conversations and lanes hold (never forgotten);
        ``retry_s``: how long a due job held back by a reference or the state sink waits
        before it is judged again (the timer's interval: sooner, no tick would see it);
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
        self.rebalances = rebalances
        self.referenced = referenced
        self.now = now
        self.durable_until = durable_until
        self._horizon_ms = math.ceil(horizon_s * 1000)
        self._retry_ms = max(1, math.ceil(retry_s * 1000))
        self._due: list[int] = []  # a heap of entries (see _ID_BITS)
        self._sweep: list[bytes] = []
        self._position = 0
        self._swept: int | None = None  # the rebalance the last sweep followed; None: sweep
        self.forgotten = 0
        # Read at scrape time: a value set by the sweep would go stale while the sweep
        # waits out a rebalance or a recovery.
        JOBS_TABLE_SIZE.set_function(lambda: len(self.store))

    @property
    def store(self) -> Any:
        """The table's store (a mapping of key -> encoded state)."""
        return self.table.data

    @property
    def indexed(self) -> int:
        """Entries in the index (a job may have several: one per settled state written)."""
        return len(self._due)

    def noted(self, key: bytes, state: StatusChanged) -> None:
        """Index ``state``, just written to the table under ``key`` (the job store's
        ``on_stored``): a settled one falls due ``horizon_s`` after its ``at``."""
        if state.status in FORGETTABLE and state.at:
            due_ms = _ms(dt.datetime.fromisoformat(state.at)) + self._horizon_ms + 1
            heapq.heappush(self._due, due_ms << _ID_BITS | state.job_id + _ID_OFFSET)

    async def tick(self) -> int:
        """Judge the next keys of a sweep, then what is due; forget what may go.
        Returns how many were forgotten."""
        if self.busy():
            # Keys and ownership change: sweep (index) the table again once it is over.
            self._sweep, self._position, self._swept = [], 0, None
            return 0
        now_ms = _ms(self.now())
        swept = self._swept_keys()
        # A key once: a job noted twice, or noted and swept, is judged (and retried) once.
        keys = dict.fromkeys([*swept, *self._due_keys(now_ms, self.scan_keys - len(swept))])
        if not keys:
            return 0
        keep = self.referenced()
        due: list[tuple[bytes, int]] = []
        for key in keys:
            partition = self._judge(key, now_ms, keep)
            if partition is not None:
                due.append((key, partition))
        if due:
            await self._forget(due)
        return len(due)

    def _swept_keys(self) -> list[bytes]:
        """The next ``scan_keys`` keys of the sweep that follows each rebalance (and the
        start), which indexes what the table holds without having been noted."""
        rebalances = self.rebalances()
        if self._swept != rebalances:
            # A snapshot of the keys (references only, no copies of values).
            self._sweep, self._position, self._swept = list(self.store.keys()), 0, rebalances
        end = min(self._position + self.scan_keys, len(self._sweep))
        keys, self._position = self._sweep[self._position : end], end
        if self._position >= len(self._sweep):
            self._sweep, self._position = [], 0
        return keys

    def _due_keys(self, now_ms: int, budget: int) -> list[bytes]:
        """Up to ``budget`` keys whose entries are due, taken out of the index."""
        keys: list[bytes] = []
        heap = self._due
        while heap and len(keys) < budget and heap[0] >> _ID_BITS <= now_ms:
            keys.append(job_state_key((heapq.heappop(heap) & _ID_MASK) - _ID_OFFSET))
        return keys

    def _later(self, due_ms: int, key: bytes) -> None:
        heapq.heappush(self._due, due_ms << _ID_BITS | int(key) + _ID_OFFSET)

    def _judge(self, key: bytes, now_ms: int, keep: Collection[int]) -> int | None:
        """The partition of ``key`` if its job goes now; else None, the key back in the
        index if its current state may go later."""
        raw = self.store.get(key)
        if raw is None:
            return None  # forgotten, or its partition left this worker
        where = settled_state(raw)
        if where is None:
            return None  # moving again: its next settled state is noted when written
        due_ms = _ms(where[2]) + self._horizon_ms + 1
        if due_ms > now_ms:
            self._later(due_ms, key)  # a newer state than the entry's, or a swept one
            return None
        partition = self._partition_of(key, where)
        if not self.owns(partition):
            return None  # the partition's owner indexes it
        if int(key) in keep or not self._in_postgres(partition, where[2]):
            self._later(now_ms + self._retry_ms, key)
            return None
        return partition

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
