"""Handing a fetched record to the agents without four asyncio tasks per record.

Faust's fetch loop (``Consumer._drain_messages``, faust-streaming 0.15.3) delivers
each record with ``await self.wait_first(callback(record), self.suspend_flow.wait())``
so that a delivery blocked on a full agent queue is abandoned when a rebalance
suspends the flow. mode's ``Service.wait_first`` wraps the delivery, the suspension,
the service's ``stopped`` and its ``crashed`` in a task each, waits for the first and
cancels the rest: four tasks created and three cancelled for every record, about a
tenth of the worker's CPU per message (measured with cProfile on the worker bench).

A delivery almost never waits: the conductor decodes the record and puts it into the
agent's queue without blocking (:class:`streams.faust_adapter.transport.AgentQueue`
never makes it wait). :func:`deliver_at_once` runs the delivery up to its first
suspension in the fetch loop's own task: when it finishes there, the record is handed
over and :func:`handed_over` tells ``wait_first`` there is nothing to wait for; when it
suspends, the rest of it (:class:`_Rest`) goes through mode's ``wait_first`` as before,
so a blocked delivery is still abandoned when the flow is suspended.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

Delivery = Callable[[Any], Awaitable[Any]]


class Delivered:
    """A delivery that finished without waiting: awaiting it returns its result at once."""

    __slots__ = ("result",)

    def __init__(self, result: Any) -> None:
        self.result = result

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result
        yield  # a generator: awaiting it returns at once


class _Rest:
    """What is left of a delivery that suspended: awaiting it carries on the coroutine from
    where it stopped (``yield from`` by hand: each future it waits on goes to the task
    awaiting this, and what the task sends or throws goes back into the coroutine)."""

    __slots__ = ("coroutine", "waiting_on")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self.coroutine = coroutine
        self.waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, waiting_on = self.coroutine, self.waiting_on
        while True:
            try:
                sent = yield waiting_on
            except BaseException as exc:  # cancellation included: it reaches the coroutine
                try:
                    waiting_on = coroutine.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting_on = coroutine.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _finish(rest: _Rest) -> Any:
    return await rest


def deliver_at_once(deliver: Delivery) -> Callable[[Any], Awaitable[Any]]:
    """``deliver``, run up to its first suspension when called: a :class:`Delivered` if it
    finished there, else a coroutine finishing it (for mode's ``wait_first``)."""

    def start(record: Any) -> Awaitable[Any]:
        coroutine = deliver(record)
        if not isinstance(coroutine, Coroutine):
            return coroutine
        try:
            waiting_on = coroutine.send(None)
        except StopIteration as stop:
            return Delivered(stop.value)
        return _finish(_Rest(coroutine, waiting_on))

    return start


def handed_over(awaitables: tuple[Any, ...]) -> Delivered | None:
    """The finished delivery among ``wait_first``'s arguments (the fetch loop passes it
    first), or None: wait as mode does. The other arguments, coroutines nobody will
    await now (the flow's ``suspend_flow.wait()``), are closed."""
    if not awaitables or not isinstance(awaitables[0], Delivered):
        return None
    for other in awaitables[1:]:
        if isinstance(other, Coroutine):
            other.close()
    return awaitables[0]
