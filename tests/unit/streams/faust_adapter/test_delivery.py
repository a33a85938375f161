"""The fetch loop's delivery of a record: no tasks when it does not wait, mode's
``wait_first`` (abandoned when the flow is suspended) when it does.

Each test drives our consumer the way Faust's ``Consumer._drain_messages`` does:
``await consumer.wait_first(consumer.callback(record), consumer.suspend_flow.wait())``.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from faust.transport import consumer as faust_consumer

from streams.faust_adapter.delivery import Delivered, deliver_at_once, handed_over
from streams.faust_adapter.transport import _Consumer


async def _noop(*args: Any) -> None:
    return None


def _consumer(tmp_path: Path, callback: Callable[[Any], Awaitable[Any]]) -> _Consumer:
    from streams.app import build_app
    from streams.kernel.settings import KafkaSettings
    from streams.worker_settings import WorkerSettings

    app = build_app(WorkerSettings(kafka=KafkaSettings(), data_dir=str(tmp_path)))
    consumer = app.transport.create_consumer(
        callback=callback, on_partitions_revoked=_noop, on_partitions_assigned=_noop
    )
    consumer._thread.thread_loop.close()  # mode's ServiceThread loop: never started here
    assert isinstance(consumer, _Consumer)
    return consumer


async def _deliver(consumer: _Consumer, record: Any) -> Any:
    """What Faust's fetch loop does with each record (faust-streaming 0.15.3)."""
    return await consumer.wait_first(consumer.callback(record), consumer.suspend_flow.wait())


def test_faust_fetch_loop_still_delivers_through_callback_and_wait_first() -> None:
    """The shape the fast path relies on: the loop reads ``self.callback`` once and waits
    for each delivery with ``self.wait_first(callback(message), self.suspend_flow.wait())``."""
    source = inspect.getsource(faust_consumer.Consumer._drain_messages)
    assert "callback = self.callback" in source
    assert "await self.wait_first(" in source
    assert "callback(message), self.suspend_flow.wait()" in source


async def test_a_delivery_that_does_not_wait_creates_no_task(tmp_path: Path) -> None:
    delivered: list[str] = []

    async def deliver(record: str) -> str:
        delivered.append(record)
        return f"put {record}"

    consumer = _consumer(tmp_path, deliver)
    loop = asyncio.get_running_loop()
    created: list[Any] = []
    factory = loop.get_task_factory()

    def counting(loop_: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        created.append(coro)
        return asyncio.Task(coro, loop=loop_, **kwargs)

    loop.set_task_factory(counting)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a coroutine never awaited would warn
            results = [await _deliver(consumer, f"r{i}") for i in range(3)]
    finally:
        loop.set_task_factory(factory)
    assert delivered == ["r0", "r1", "r2"]
    assert [r.results for r in results] == [["put r0"], ["put r1"], ["put r2"]]
    assert created == []


async def test_a_delivery_that_waits_is_finished_by_mode_wait_first(tmp_path: Path) -> None:
    room = asyncio.Event()
    steps: list[str] = []

    async def deliver(record: str) -> str:
        steps.append(f"decoded {record}")
        await room.wait()  # the agent's queue is full
        steps.append(f"put {record}")
        return record

    consumer = _consumer(tmp_path, deliver)
    waiting = asyncio.ensure_future(_deliver(consumer, "r1"))
    await asyncio.sleep(0)
    assert steps == ["decoded r1"] and not waiting.done()
    room.set()
    result = await asyncio.wait_for(waiting, 5)
    assert steps == ["decoded r1", "put r1"]
    assert result.results == ["r1"] and not result.stopped


async def test_a_waiting_delivery_is_abandoned_when_the_flow_is_suspended(tmp_path: Path) -> None:
    abandoned = asyncio.Event()

    async def deliver(record: str) -> None:
        try:
            await asyncio.Event().wait()  # never room
        except asyncio.CancelledError:
            abandoned.set()
            raise

    consumer = _consumer(tmp_path, deliver)
    waiting = asyncio.ensure_future(_deliver(consumer, "r1"))
    await asyncio.sleep(0)
    consumer.suspend_flow.set()  # a rebalance
    result = await asyncio.wait_for(waiting, 5)
    assert abandoned.is_set()  # the cancellation reached the delivery's own coroutine
    assert result.results == [True]  # the suspension won (Event.wait: True), as mode alone


async def test_an_error_after_the_delivery_waited_reaches_the_fetch_loop(tmp_path: Path) -> None:
    async def deliver(record: str) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"cannot decode {record}")

    consumer = _consumer(tmp_path, deliver)
    try:
        await asyncio.wait_for(_deliver(consumer, "r1"), 5)
    except ValueError as exc:
        assert str(exc) == "cannot decode r1"
    else:
        raise AssertionError("the error was lost")


def test_handed_over_closes_the_coroutines_nobody_awaits() -> None:
    async def suspended() -> None:
        await asyncio.sleep(1)

    other = suspended()
    done = Delivered("x")
    assert handed_over((done, other)) is done
    assert inspect.getcoroutinestate(other) == inspect.CORO_CLOSED
    pending = suspended()
    assert handed_over((pending,)) is None  # not finished: mode's wait_first takes it
    pending.close()


async def test_deliver_at_once_runs_the_delivery_only_once() -> None:
    calls: list[int] = []

    async def deliver(record: int) -> int:
        calls.append(record)
        await asyncio.sleep(0)
        return record * 2

    start = deliver_at_once(deliver)
    assert await start(21) == 42
    assert calls == [21]
