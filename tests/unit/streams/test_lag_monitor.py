"""Consumer lag arithmetic, the end-offset source by broker, the monitor as a service, and
timers that never crash."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaConnectionError

from streams.kernel.runtime.periodic import Periodic
from streams.kernel.settings import BrokerFlavor, EndOffsetSource, KafkaSettings
from streams.lag_monitor import GroupLag, partition_lag

NOW = 1_000_000.0


def test_lag_is_latest_minus_committed_and_its_age_is_the_first_unconsumed_record() -> None:
    p = partition_lag(
        "zapstream.intents",
        3,
        committed=40,
        earliest=0,
        latest=100,
        first_unconsumed_ms=int((NOW - 12.5) * 1000),
        now_s=NOW,
    )
    assert (p.lag, p.lag_seconds, p.committed, p.latest) == (60, 12.5, 40, 100)


def test_caught_up_is_zero_records_and_zero_seconds_whatever_the_record() -> None:
    p = partition_lag(
        "t", 0, committed=100, earliest=0, latest=100, first_unconsumed_ms=None, now_s=NOW
    )
    assert (p.lag, p.lag_seconds) == (0, 0.0)


def test_a_committed_offset_past_a_stale_latest_offset_is_no_lag() -> None:
    # Tansu's ListOffsets answers the last batch's base offset + 1.
    p = partition_lag(
        "t", 0, committed=120, earliest=0, latest=101, first_unconsumed_ms=1, now_s=NOW
    )
    assert (p.lag, p.lag_seconds) == (0, 0.0)


def test_a_partition_never_committed_counts_from_its_earliest_offset() -> None:
    p = partition_lag(
        "t", 0, committed=None, earliest=30, latest=50, first_unconsumed_ms=None, now_s=NOW
    )
    assert (p.lag, p.committed, p.lag_seconds) == (20, None, None)


def test_a_record_from_the_future_is_zero_seconds_old() -> None:
    p = partition_lag(
        "t",
        0,
        committed=1,
        earliest=0,
        latest=2,
        first_unconsumed_ms=int(NOW * 1000) + 5000,
        now_s=NOW,
    )
    assert p.lag_seconds == 0.0


def test_a_record_without_timestamp_leaves_the_age_unknown() -> None:
    p = partition_lag("t", 0, committed=1, earliest=0, latest=2, first_unconsumed_ms=-1, now_s=NOW)
    assert p.lag == 1 and p.lag_seconds is None


def test_group_totals_are_max_and_sum_over_partitions() -> None:
    parts = (
        partition_lag(
            "a",
            0,
            committed=5,
            earliest=0,
            latest=9,
            first_unconsumed_ms=int((NOW - 3) * 1000),
            now_s=NOW,
        ),
        partition_lag(
            "a",
            1,
            committed=0,
            earliest=0,
            latest=7,
            first_unconsumed_ms=int((NOW - 8) * 1000),
            now_s=NOW,
        ),
        partition_lag(
            "b", 0, committed=4, earliest=0, latest=4, first_unconsumed_ms=None, now_s=NOW
        ),
    )
    group = GroupLag("zapstream-worker", parts)
    assert (group.max_lag, group.sum_lag, group.max_lag_seconds) == (7, 11, 8.0)


def test_group_age_is_unknown_only_when_nothing_known_is_older() -> None:
    unknown = partition_lag(
        "a", 0, committed=0, earliest=0, latest=3, first_unconsumed_ms=None, now_s=NOW
    )
    idle = partition_lag(
        "a", 1, committed=3, earliest=0, latest=3, first_unconsumed_ms=None, now_s=NOW
    )
    old = partition_lag(
        "a",
        2,
        committed=0,
        earliest=0,
        latest=1,
        first_unconsumed_ms=int((NOW - 60) * 1000),
        now_s=NOW,
    )
    assert GroupLag("g", (unknown, idle)).max_lag_seconds is None
    assert GroupLag("g", (unknown, old)).max_lag_seconds == 60.0
    assert GroupLag("g", ()).max_lag_seconds == 0.0 and GroupLag("g", ()).max_lag == 0


@pytest.mark.parametrize(
    ("flavor", "setting", "expected"),
    [
        (BrokerFlavor.KAFKA, None, EndOffsetSource.LIST_OFFSETS),
        (BrokerFlavor.TANSU, None, EndOffsetSource.HIGH_WATERMARK),
        (BrokerFlavor.KAFKA, EndOffsetSource.HIGH_WATERMARK, EndOffsetSource.HIGH_WATERMARK),
        (BrokerFlavor.TANSU, EndOffsetSource.LIST_OFFSETS, EndOffsetSource.LIST_OFFSETS),
    ],
)
def test_end_offsets_follow_the_broker_unless_set(
    flavor: BrokerFlavor, setting: EndOffsetSource | None, expected: EndOffsetSource
) -> None:
    assert KafkaSettings(flavor=flavor, end_offsets=setting).end_offset_source is expected


async def test_periodic_keeps_running_through_any_error_and_stops_when_asked() -> None:
    calls: list[int] = []
    six = asyncio.Event()
    failures = [KafkaConnectionError("away"), RuntimeError("a bug"), ValueError("bad")]

    async def job() -> None:
        calls.append(len(calls))
        if len(calls) >= 6:
            six.set()
        if failures:
            raise failures.pop(0)

    every = Periodic("test job", 0.0, job, retry_s=0.001)
    async with every:
        await asyncio.wait_for(six.wait(), 5)
    seen = len(calls)
    # An interval of 0 runs the job at every turn of the event loop: a timer still
    # running would have run it again within these turns (no wall-clock wait).
    for _ in range(20):
        await asyncio.sleep(0)
    assert seen >= 6 and len(calls) == seen  # kept going after three errors; stopped after


async def test_a_tick_tells_errors_but_not_cancellation() -> None:
    async def broken() -> None:
        raise KeyError("bug")

    assert not await Periodic("broken job", 1.0, broken).tick()  # told, not raised

    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await Periodic("cancelled job", 1.0, cancelled).tick()


def test_failed_runs_back_off_exponentially_up_to_the_cap_never_under_the_interval() -> None:
    async def job() -> None:
        return None

    every = Periodic("backoff", 10.0, job, retry_s=1.0, max_retry_s=60.0)
    assert [every.backoff.next_delay_s() for _ in range(5)] == [10, 20, 40, 60, 60]
    fast = Periodic("controls", 0.0, job, retry_s=1.0, max_retry_s=5.0)
    assert [fast.backoff.next_delay_s() for _ in range(4)] == [1, 2, 4, 5]
    slow = Periodic("slow", 120.0, job, retry_s=1.0, max_retry_s=30.0)
    assert [slow.backoff.next_delay_s() for _ in range(5)][-1] == 120
