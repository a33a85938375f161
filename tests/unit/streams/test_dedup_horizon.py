"""The dedup horizon: which jobs leave the table, and where their tombstones go (no I/O)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from aiokafka.partitioner import DefaultPartitioner

from streams.dedup_horizon import FORGETTABLE, DedupHorizon, default_partition
from streams.kernel.contract import JobStatus, StatusChanged, conversation_partition_key
from streams.kernel.state_machine import SETTLED

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
S = JobStatus
PARTITIONS = 8


class FakeStore(dict[bytes, bytes]):
    """Like Faust's memory store: a mapping, plus the partitions of recovered keys."""

    def __init__(self) -> None:
        super().__init__()
        self._key_partition: dict[bytes, int] = {}


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
    table.data[str(state.job_id).encode()] = state.dumps()


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
    # A key added mid-sweep is seen by the next sweep.
    _put(table, _state(99, S.ACCEPTED, 500))
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
    horizon = _horizon(table, changelog, durable_until=written.get)

    # The sink has not committed on the partition: PostgreSQL may not know any of them.
    assert await horizon.tick() == 0
    # It wrote every state changed before 250 s ago: jobs 1 and 2, not 3.
    written[partition] = NOW - dt.timedelta(seconds=250)
    assert await horizon.tick() == 2
    assert sorted(int(k) for k in table.data) == [3]
    written[partition] = NOW
    assert await horizon.tick() == 1
