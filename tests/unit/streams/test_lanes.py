"""Conversation lanes keep each key in order, run keys concurrently, and bound in-flight work."""

import asyncio
from collections.abc import Callable

import pytest

from streams.lanes import ConversationLanes


async def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 3.0) -> None:
    """Poll with a deadline (never a fixed sleep)."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                if predicate():
                    return
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_order_per_key_and_concurrency_across_keys() -> None:
    done: list[tuple[str, int]] = []
    running = 0
    peak = 0
    release = asyncio.Event()

    async def handler(item: tuple[str, int]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        done.append(item)

    lanes: ConversationLanes[tuple[str, int]] = ConversationLanes(
        handler, max_in_flight=100, on_error=lambda exc: None
    )
    for seq in range(5):
        for key in ("a", "b", "c"):
            await lanes.submit(key, (key, seq))
    await asyncio.sleep(0)
    assert peak == 3  # one per key at a time
    release.set()
    assert await lanes.join(5)
    for key in "abc":
        assert [s for k, s in done if k == key] == list(range(5))


async def test_submit_waits_when_bound_reached() -> None:
    gate = asyncio.Event()

    async def handler(item: int) -> None:
        await gate.wait()

    lanes: ConversationLanes[int] = ConversationLanes(
        handler, max_in_flight=2, on_error=lambda e: None
    )
    await lanes.submit("a", 1)
    await lanes.submit("b", 2)
    third = asyncio.ensure_future(lanes.submit("c", 3))
    await _until(lambda: lanes.waiting == 1 or third.done(), "the third submit to wait or return")
    assert not third.done()
    assert lanes.waiting == 1 and lanes.in_flight == 2
    gate.set()
    await asyncio.wait_for(third, 1)
    assert lanes.waiting == 0
    assert await lanes.join(1)


async def test_handler_error_is_reported_and_stops_intake() -> None:
    errors: list[BaseException] = []

    async def handler(item: int) -> None:
        raise RuntimeError("bug")

    lanes: ConversationLanes[int] = ConversationLanes(
        handler, max_in_flight=4, on_error=errors.append
    )
    await lanes.submit("a", 1)
    await lanes.join(1)
    assert len(errors) == 1
    with pytest.raises(RuntimeError, match="lane failed"):
        await lanes.submit("b", 2)


async def test_in_flight_counts_queued_and_running_items_and_drops_to_zero() -> None:
    gate = asyncio.Event()
    seen: list[int] = []

    async def handler(item: int) -> None:
        await gate.wait()
        seen.append(lanes.in_flight)

    lanes: ConversationLanes[int] = ConversationLanes(
        handler, max_in_flight=100, on_error=lambda e: None
    )
    for n in range(6):
        await lanes.submit(n % 2, n)
    assert lanes.in_flight == 6 and lanes.lanes == 2
    gate.set()
    assert await lanes.join(1)
    # Each handler still counts itself while it runs; nothing is left once idle.
    assert sorted(seen, reverse=True) == seen and seen[-1] >= 1
    assert lanes.in_flight == 0 and lanes.lanes == 0


async def test_in_flight_forgets_the_items_of_cancelled_or_failed_lanes() -> None:
    never = asyncio.Event()

    async def handler(item: int) -> None:
        if item < 0:
            raise RuntimeError("bug")
        await never.wait()

    lanes: ConversationLanes[int] = ConversationLanes(
        handler, max_in_flight=100, on_error=lambda e: None
    )
    for n in range(4):
        await lanes.submit("a", n)
    await lanes.submit("b", -1)
    await lanes.submit("b", 5)
    await asyncio.sleep(0)
    assert lanes.in_flight == 4  # lane b failed with its two items
    await lanes.cancel_all()
    assert lanes.in_flight == 0
