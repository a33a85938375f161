"""The dedup horizon: which jobs leave the table, where their tombstones go, and how little
each tick looks at to find them (no I/O)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from aiokafka.partitioner import DefaultPartitioner

from streams.dedup_horizon import FORGETTABLE, DedupHorizon, default_partition
from streams.kernel.contract import JobStatus, StatusChanged, conversation_partition_key
from streams.kernel.state_machine import SETTLED
from streams.stores import FaustJobStore

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
S = JobStatus
PARTITIONS = 8


class FakeStore(dict[bytes, bytes]):
    """Like Faust's memory store: a mapping, plus the partitions of recovered keys; counts
    the states read (``get``) and the sweeps begun (``keys``)."""

    def __init__(self) -> None:
        super().__init__()
        self._key_partition: dict[bytes, int] = {}
        self.reads = 0
        self.sweeps = 0

    def get(self, key: bytes, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)

    def keys(self) -> Any:
        self.sweeps += 1
        return super().keys()


class FakeTable:
    def __init__(self) -> None:
        self.data = FakeStore()


class FakeChangelog:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes | None, int]] = []

    async def send(self, *, key: bytes, value: bytes | None, partition: int) -> asyncio.Future[Any]:
        self.sent.append((key, value, partition))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class FakeWriter:
    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int | None = None
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def _state(job_id: int, status: S, age_s: float, conversation: str = "c") -> StatusChanged:
    return StatusChanged(
        job_id=job_id,
        idempotency_key=f"k{job_id}",
        instance_id="inst",
        conversation_key=conversation,
        status=status,
        previous=S.ATTEMPTING,
        version=2,
        at=(NOW - dt.timedelta(seconds=age_s)).isoformat(),
    )


def _horizon(table: FakeTable, changelog: FakeChangelog, **kw: Any) -> DedupHorizon:
    options: dict[str, Any] = {"horizon_s": 100.0, "partitions": PARTITIONS, "now": lambda: NOW}
    options.update(kw)
    return DedupHorizon(table, changelog, **options)


def _put(table: FakeTable, state: StatusChanged) -> None:
    """Into the store directly, as recovery does: never noted."""
    table.data[str(state.job_id).encode()] = state.dumps()


def _job_store(table: FakeTable, horizon: DedupHorizon) -> FaustJobStore:
    """The worker's job store, its writes noted by ``horizon``."""
    return FaustJobStore(table, FakeWriter(), on_stored=horizon.noted)  # type: ignore[arg-type]


def _settled(job_id: int, status: S, clock: Clock, conversation: str = "c") -> StatusChanged:
    """A state of ``job_id`` changed now (by ``clock``)."""
    return _state(job_id, status, (NOW - clock.now).total_seconds(), conversation)


async def _swept(horizon: DedupHorizon) -> None:
    """Let the sweep that follows the start go over the (empty) table."""
    assert await horizon.tick() == 0


def test_forgettable_statuses_are_settled_ones_that_need_nobody() -> None:
    assert FORGETTABLE <= SETTLED
    assert {S.PENDING, S.ATTEMPTING, S.RETRY_WAIT, S.UNCERTAIN, S.REVIEW}.isdisjoint(FORGETTABLE)
    assert {S.ACCEPTED, S.DELIVERED, S.READ, S.FAILED, S.DEAD, S.CANCELLED} <= FORGETTABLE


async def test_only_settled_jobs_older_than_the_horizon_are_forgotten() -> None:
    table, changelog = FakeTable(), FakeChangelog()
    old, young = 101.0, 99.0
    for job_id, status, age in [
        (1, S.ACCEPTED, old),
        (2, S.ACCEPTED, young),
        (3, S.ATTEMPTING, old),
        (4, S.RETRY_WAIT, old),
        (5, S.PENDING, old),
        (6, S.DEAD, old),
        (7, S.UNCERTAIN, old),
        (8, S.REVIEW, old),
        (9, S.READ, old),
    ]:
        _put(table, _state(job_id, status, age))
    horizon = _horizon(table, changelog)
    assert await horizon.tick() == 3
    assert sorted(int(k) for k in table.data) == [2, 3, 4, 5, 7, 8]
    assert sorted(int(k) for k, _, _ in changelog.sent) == [1, 6, 9]
    assert all(value is None for _, value, _ in changelog.sent)


async def test_tombstone_goes_to_the_partition_of_the_state_record() -> None:
    table, changelog = FakeTable(), FakeChangelog()
    _put(table, _state(1, S.ACCEPTED, 500, conversation="alice"))
    _put(table, _state(2, S.ACCEPTED, 500, conversation="bob"))
    table.data._key_partition[b"2"] = 5  # recovered from partition 5 of the changelog
    await _horizon(table, changelog).tick()
    where = {key: partition for key, _, partition in changelog.sent}
    alice = conversation_partition_key("inst", "alice")
    assert where[b"1"] == DefaultPartitioner()(alice, list(range(PARTITIONS)), None)
    assert where[b"1"] == default_partition(alice, PARTITIONS)
    assert where[b"2"] == 5
    assert table.data._key_partition == {}


async def test_parked_and_in_flight_jobs_and_foreign_partitions_are_kept() -> None:
    table, changelog = FakeTable(), FakeChangelog()
    for job_id in (1, 2, 3):
        _put(table, _state(job_id, S.CANCELLED, 500, conversation=f"c{job_id}"))
    foreign = default_partition(conversation_partition_key("inst", "c3"), PARTITIONS)
    horizon = _horizon(
        table,
        changelog,
        referenced=lambda: {1},
        owns=lambda partition: partition != foreign,
    )
    assert await horizon.tick() == 1
    assert sorted(int(k) for k in table.data) == [1, 3]


async def test_nothing_is_forgotten_while_faust_rebalances() -> None:
    table, changelog = FakeTable(), FakeChangelog()
    _put(table, _state(1, S.ACCEPTED, 500))
    busy = True
    horizon = _horizon(table, changelog, busy=lambda: busy)
    assert await horizon.tick() == 0
    busy = False
    assert await horizon.tick() == 1


async def test_each_tick_scans_a_bounded_slice_round_robin() -> None:
    table, changelog = FakeTable(), FakeChangelog()
    for job_id in range(10):
        _put(table, _state(job_id, S.ACCEPTED, 500))
    horizon = _horizon(table, changelog, scan_keys=4)
    assert [await horizon.tick() for _ in range(3)] == [4, 4, 2]
    assert len(table.data) == 0
    # A key that appears in the store without being written through the job store (a
    # recovery) is seen by the sweep that follows the next rebalance.
    _put(table, _state(99, S.ACCEPTED, 500))
    assert await horizon.tick() == 0
    rebalances = 1
    horizon.rebalances = lambda: rebalances
    assert await horizon.tick() == 1


async def test_a_key_that_moved_on_since_the_snapshot_is_judged_by_its_current_state() -> None:
    table, changelog = FakeTable(), FakeChangelog()
    for job_id in range(4):
        _put(table, _state(job_id, S.ACCEPTED, 500))
    horizon = _horizon(table, changelog, scan_keys=2)
    assert await horizon.tick() == 2
    _put(table, _state(3, S.DELIVERED, 1))  # a receipt just moved it
    del table.data[b"2"]
    assert await horizon.tick() == 0
    assert list(table.data) == [b"3"]


async def test_only_jobs_the_state_sink_has_written_are_forgotten() -> None:
    table, changelog = FakeTable(), FakeChangelog()
    for job_id, age in [(1, 500), (2, 300), (3, 200)]:
        _put(table, _state(job_id, S.ACCEPTED, age, conversation="alice"))
    partition = default_partition(conversation_partition_key("inst", "alice"), PARTITIONS)
    written: dict[int, dt.datetime] = {}
    clock = Clock()
    horizon = _horizon(table, changelog, durable_until=written.get, now=clock, retry_s=1.0)

    # The sink has not committed on the partition: PostgreSQL may not know any of them.
    assert await horizon.tick() == 0
    # It wrote every state changed before 250 s ago: jobs 1 and 2, not 3 (judged again
    # ``retry_s`` later).
    written[partition] = NOW - dt.timedelta(seconds=250)
    clock.advance(1)
    assert await horizon.tick() == 2
    assert sorted(int(k) for k in table.data) == [3]
    written[partition] = clock.now
    clock.advance(1)
    assert await horizon.tick() == 1


# --- the index: what a tick looks at ------------------------------------------------


async def test_a_settled_job_written_through_the_store_is_forgotten_without_a_sweep() -> None:
    table, changelog, clock = FakeTable(), FakeChangelog(), Clock()
    horizon = _horizon(table, changelog, now=clock)
    await _swept(horizon)
    store = _job_store(table, horizon)
    await store.put(_settled(1, S.ACCEPTED, clock), partition=0)
    await store.put(_settled(2, S.ATTEMPTING, clock), partition=0)
    assert horizon.indexed == 1  # the settled one only
    sweeps, reads = table.data.sweeps, table.data.reads

    clock.advance(99)
    assert await horizon.tick() == 0
    assert table.data.reads == reads  # nothing due: nothing read
    clock.advance(2)
    assert await horizon.tick() == 1
    assert list(table.data) == [b"2"]
    assert [key for key, _, _ in changelog.sent] == [b"1"]
    assert table.data.sweeps == sweeps  # never walked the table
    assert table.data.reads == reads + 1  # read the due job's state, once
    assert horizon.indexed == 0


async def test_a_recovered_job_never_noted_is_still_forgotten() -> None:
    table, changelog, clock = FakeTable(), FakeChangelog(), Clock()
    _put(table, _state(1, S.DELIVERED, 50))  # recovered at start, 50 s old
    rebalances = 0
    horizon = _horizon(table, changelog, now=clock, rebalances=lambda: rebalances)
    assert await horizon.tick() == 0  # the sweep after the start indexes it
    assert horizon.indexed == 1
    clock.advance(51)
    assert await horizon.tick() == 1
    assert table.data.sweeps == 1
    # Recovered after a rebalance that began and ended between two ticks.
    _put(table, _state(2, S.FAILED, 10))
    rebalances += 1
    assert await horizon.tick() == 0
    clock.advance(91)
    assert await horizon.tick() == 1
    assert len(table.data) == 0
    assert table.data.sweeps == 2


async def test_a_rebalance_seen_in_progress_sweeps_again_once_it_is_over() -> None:
    table, changelog, clock = FakeTable(), FakeChangelog(), Clock()
    busy = False
    horizon = _horizon(table, changelog, now=clock, busy=lambda: busy)
    await _swept(horizon)
    busy = True
    assert await horizon.tick() == 0
    _put(table, _state(1, S.ACCEPTED, 500))  # recovered meanwhile
    busy = False
    assert await horizon.tick() == 1


async def test_a_job_whose_state_moved_on_is_not_forgotten_on_its_old_due_time() -> None:
    table, changelog, clock = FakeTable(), FakeChangelog(), Clock()
    horizon = _horizon(table, changelog, now=clock)
    await _swept(horizon)
    store = _job_store(table, horizon)
    await store.put(_settled(1, S.ACCEPTED, clock), partition=0)
    await store.put(_settled(2, S.ACCEPTED, clock), partition=0)
    clock.advance(60)
    await store.put(_settled(1, S.READ, clock), partition=0)  # a receipt: settled later
    await store.put(_settled(2, S.ATTEMPTING, clock), partition=0)  # reprocessed: moving
    assert horizon.indexed == 3

    clock.advance(41)  # the ACCEPTED states' due time
    assert await horizon.tick() == 0
    assert sorted(table.data) == [b"1", b"2"]
    assert horizon.indexed == 2  # job 1 under READ's due time (twice); job 2 left
    clock.advance(60)
    assert await horizon.tick() == 1
    assert list(table.data) == [b"2"]
    assert horizon.indexed == 0  # nothing left of the forgotten job
    # Settled again, it is indexed again.
    await store.put(_settled(2, S.CANCELLED, clock), partition=0)
    clock.advance(101)
    assert await horizon.tick() == 1


async def test_a_job_held_back_by_the_sink_or_a_reference_is_judged_again_later() -> None:
    table, changelog, clock = FakeTable(), FakeChangelog(), Clock()
    written: dict[int, dt.datetime] = {}
    held = {2}
    horizon = _horizon(
        table,
        changelog,
        now=clock,
        retry_s=5.0,
        durable_until=written.get,
        referenced=lambda: held,
    )
    await _swept(horizon)
    store = _job_store(table, horizon)
    for job_id in (1, 2):
        await store.put(_settled(job_id, S.ACCEPTED, clock, conversation="alice"), 0)
    partition = default_partition(conversation_partition_key("inst", "alice"), PARTITIONS)
    clock.advance(101)
    assert await horizon.tick() == 0  # the sink never committed here
    reads = table.data.reads
    written[partition] = clock.now
    clock.advance(4)
    assert await horizon.tick() == 0
    assert table.data.reads == reads  # not before retry_s
    clock.advance(1)
    assert await horizon.tick() == 1  # job 1; job 2 is still in a lane
    held.clear()
    clock.advance(5)
    assert await horizon.tick() == 1
    assert len(table.data) == 0
    assert horizon.indexed == 0


async def test_a_job_of_a_partition_not_owned_leaves_the_index() -> None:
    table, changelog, clock = FakeTable(), FakeChangelog(), Clock()
    horizon = _horizon(table, changelog, now=clock, owns=lambda partition: False)
    await _swept(horizon)
    await _job_store(table, horizon).put(_settled(1, S.ACCEPTED, clock), partition=0)
    clock.advance(101)
    assert await horizon.tick() == 0
    assert horizon.indexed == 0
    assert list(table.data) == [b"1"]


async def test_per_tick_work_is_bounded_by_scan_keys() -> None:
    table, changelog, clock = FakeTable(), FakeChangelog(), Clock()
    for job_id in range(100, 106):
        _put(table, _state(job_id, S.ACCEPTED, 50))  # recovered: the sweep indexes them
    horizon = _horizon(table, changelog, now=clock, scan_keys=4)
    store = _job_store(table, horizon)
    for job_id in range(20):
        await store.put(_settled(job_id, S.DELIVERED, clock), partition=0)
    clock.advance(101)
    counts, reads = [], []
    for _ in range(13):
        before = table.data.reads
        counts.append(await horizon.tick())
        reads.append(table.data.reads - before)
    # The sweep (its snapshot: all 26 keys, forgetting the due ones as it goes) takes the
    # budget first; the index's entries of the keys it forgot then leave 4 per tick.
    assert counts == [4, 4, 4, 4, 4, 4, 2] + [0] * 6
    assert reads == [4] * 11 + [2, 0]
    assert len(table.data) == 0
    assert horizon.indexed == 0
