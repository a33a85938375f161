"""Conversation lanes: serial per conversation, concurrent across conversations.

The dispatcher agent reads one partition stream in order and hands each event
to the lane of its conversation. A lane runs its events one after another, so a
conversation's messages reach the gateway in commit order; different lanes run
at the same time, bounded by ``max_in_flight`` events across all lanes. When
the bound is reached :meth:`ConversationLanes.submit` waits, which stops the
agent from reading further and lets Faust's flow control pause fetching.

Events are acknowledged by the handler when their outcome is recorded, in
whatever order lanes finish; the worker's consumer commits only the acknowledged
prefix of each partition, so the committed offset never passes an event whose
send is unfinished (Faust alone would: :mod:`streams.faust_adapter.transport`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class ConversationLanes(Generic[T]):
    """Runs ``handler(item)`` serially per key, concurrently across keys."""

    def __init__(
        self,
        handler: Callable[[T], Awaitable[None]],
        *,
        max_in_flight: int,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._handler = handler
        self._on_error = on_error
        self._slots = asyncio.Semaphore(max_in_flight)
        self._queues: dict[Hashable, collections.deque[T]] = {}
        self._in_flight = 0
        self._waiting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._failed: BaseException | None = None

    @property
    def in_flight(self) -> int:
        """Items submitted and not finished (queued or running), across all lanes."""
        return self._in_flight

    @property
    def lanes(self) -> int:
        return len(self._queues)

    @property
    def waiting(self) -> int:
        """Calls of :meth:`submit` waiting for room (the bound is reached)."""
        return self._waiting

    async def submit(self, key: Hashable, item: T) -> None:
        """Queue ``item`` behind earlier items of ``key``; wait while the bound is reached."""
        if self._failed is not None:
            raise RuntimeError("a lane failed; no new work is taken") from self._failed
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._in_flight += 1
        queue = self._queues.get(key)
        if queue is not None:
            queue.append(item)
            return
        self._queues[key] = collections.deque([item])
        # No key in the task's name or in logs: keys hold phone numbers.
        task = asyncio.create_task(self._run(key), name="conversation-lane")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: Hashable) -> None:
        queue = self._queues[key]
        try:
            while queue:
                await self._handler(queue[0])
                queue.popleft()
                self._in_flight -= 1
                self._slots.release()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # A handler error is a bug (gateway errors are classified and handled
            # inside it). Stop taking work and let the supervisor restart us.
            self._failed = exc
            log.exception("a conversation lane failed")
            self._on_error(exc)
        finally:
            if self._queues.get(key) is queue:
                del self._queues[key]
            # Cancelled or failed with items left: they are not in flight any more (their
            # slots stay taken: this object takes no more work).
            self._in_flight -= len(queue)
            queue.clear()

    async def join(self, timeout_s: float) -> bool:
        """Wait until every lane is idle or ``timeout_s`` passed; True if idle."""
        tasks = set(self._tasks)
        if not tasks:
            return True
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        return not pending

    async def cancel_all(self) -> None:
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
