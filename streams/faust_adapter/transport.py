"""Faust's aiokafka transport, with the consumer's fetch wait taken from our settings
and flow control per topic.

Faust builds its worker consumer with ``fetch_max_wait_ms=1500`` and no setting
to change it (``faust/transport/drivers/aiokafka.py``). On Apache Kafka that
costs nothing while data flows: a fetch is answered as soon as data arrives. On
Tansu a waiting fetch is not answered early, so every consuming hop waited up to
1.5 s. :class:`KafkaTransport` is Faust's transport with a consumer thread that
sets the wait from :attr:`streams.kernel.settings.KafkaSettings.consumer_fetch_max_wait_ms`
before the consumer starts (aiokafka reads it when it builds its fetcher, in
``start()``). :class:`~streams.app.WorkerApp` hands it to Faust.

Flow control: an agent reads one queue per topic, fed by every partition of the
topic. Faust stops fetching a partition when a record of *that partition* finds
the queue 80% full (``Consumer.on_buffer_full``); the other partitions go on
until one of their own records finds it so, each adding what was fetched for it,
and when the queue was full Faust's conductor waited for room with every other
topic's records behind it: operational intents stalled for up to a minute behind
a bulk campaign (measured, tests/integration/test_flow_control.py). Here
:class:`_Consumer` stops and restarts fetching every partition of the topic
together, and :class:`AgentQueue` never makes the conductor wait: what was
already fetched goes in. A bounded poll (``broker_max_poll_records``) would bound
that overshoot too, but restarted workers stalled with it (worker-kill tests, under
load), and Tansu ignores fetch size limits, so it is not used. The overshoot is
one poll, at most one fetch: the worker's consumer asks for :data:`FETCH_MAX_BYTES`
per fetch (Tansu ignores the per-partition bound but honours this one).

Seeking to committed offsets (Faust's way back over records it fetched and dropped
during a rebalance) also rewinds a stream partition that has no committed offset, to
where the reset policy starts it: aiokafka leaves such a partition where the fetcher
is, past the dropped records (:meth:`_ConsumerThread._seek_to_committed`).

Committing never passes a record still being handled (:meth:`_Consumer._committable_offset`).
Faust's own choice (``Consumer._new_offset``, faust-streaming 0.15.3) commits past one:
with committed offset ``C`` (record ``C`` next) and ``C+1, C+2`` acknowledged it
commits ``C+3`` while ``C`` is still in its lane, and with no commit yet (``C`` None
or 0) it commits the first acknowledged run whatever lies before it (faust-streaming
issue #606, fix proposed in PR #707, not released). The lanes acknowledge in the
order conversations finish, so under load every commit could skip one more, and a
SIGKILL then lost the skipped records (the likely cause of 1 lost in 2,000 in
``test_kafka_compaction``, the last message of a conversation). Nor does a record
Faust's stream dropped unhandled count as acknowledged (:meth:`_Consumer.ack`), nor does
Faust empty the agents' queues when the flow resumes after a rebalance
(:meth:`AgentQueue.clear`). Commits that wait a minute on records never acknowledged are
said once and counted (:meth:`_Consumer._note_held`): a stall is visible, never silent.

The private hooks, every one checked against faust-streaming 0.15.3, mode-streaming
0.7.1 and aiokafka 0.14.0 (:data:`streams.faust_adapter.hooks.CHECKED_AGAINST`) and
asserted by ``tests/unit/streams/faust_adapter/test_hooks.py``:

- aiokafka ``AIOKafkaConsumer._fetch_max_bytes``, ``._fetch_max_wait_ms``,
  ``._isolation_level``: set by the constructor, read by ``start()``;
- Faust ``AIOKafkaConsumerThread._create_worker_consumer(transport)``,
  ``._ensure_consumer()``; ``Consumer._new_consumer_thread()``,
  ``._is_changelog_tp(tp)``, ``._filter_committable_offsets(tps)``,
  ``._should_commit(tp, offset)``, ``._get_active_partitions()`` and the bookkeeping
  ``_acked``, ``_acked_index``, ``_gap``, ``_committed_offset``, ``_unacked_messages``,
  ``_buffered_partitions``, ``_paused_partitions``; ``Consumer.callback``, read once by
  ``_drain_messages``, which delivers each record through ``self.wait_first(callback(record),
  self.suspend_flow.wait())`` (:mod:`streams.faust_adapter.delivery`);
- mode ``Service.wait_first(*coros, timeout)``, ``WaitResults``;
- mode ``ThrowableQueue.clear()``, ``pressure_high_ratio``, ``pressure_drop_ratio``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Mapping
from time import monotonic
from typing import Any

import aiokafka
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.utils.functional import consecutive_numbers
from mode.services import WaitResults
from mode.utils.queues import ThrowableQueue

from streams import metrics
from streams.faust_adapter.delivery import deliver_at_once, handed_over

log = logging.getLogger(__name__)

FETCH_MAX_BYTES = 1024 * 1024
"""A fetch request's size bound (aiokafka's default is 50 MiB): about 1,500 intents. Tansu
ignores the per-partition bound (``max_partition_fetch_bytes``) but honours this one."""
COMMIT_HELD_WARN_S = 60.0
"""How long a partition's commits may wait on records between its committed offset and its
first acknowledged run before the worker says so (once per held offset)."""


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        # Private hook (faust-streaming 0.15.3): builds the worker's AIOKafkaConsumer, not
        # started yet. The three attributes below are aiokafka 0.14.0's constructor
        # arguments as stored, read by AIOKafkaConsumer.start(): set here, they take effect.
        consumer = super()._create_worker_consumer(transport)
        # One poll hands Faust at most what one fetch brought: bounded, so a backlogged
        # topic's records never hold the loop (and the other topics) for seconds.
        consumer._fetch_max_bytes = FETCH_MAX_BYTES
        wait_ms = getattr(self.app, "fetch_max_wait_ms", None)
        if wait_ms is not None:
            # The constructor's argument, stored as is; start() passes it to the fetcher.
            consumer._fetch_max_wait_ms = int(wait_ms)
        isolation = getattr(self.app, "isolation_level", None)
        if isolation is not None:
            # Likewise: read_committed without Faust's exactly-once processing (which would
            # make the worker's own producer transactional), so no intent of an aborted
            # relay transaction is ever handled (ZAPSTREAM_RELAY_EXACTLY_ONCE).
            consumer._isolation_level = isolation
        return consumer

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """Seek every partition to its committed offset, and a stream partition that has
        none back to the beginning (see :meth:`_seek_to_committed`)."""
        result: Mapping[TP, int] = await self.call_thread(self._seek_to_committed)
        return result

    async def _seek_to_committed(self) -> Mapping[TP, int]:
        """aiokafka's ``seek_to_committed`` leaves a partition with no committed offset (or
        0) where the fetcher is. Faust seeks to committed offsets to go back over records it
        fetched and dropped: after a rebalance, while recovery has the flow stopped, and
        before streams resume. A partition the group never committed on (new, or whose only
        owner died before its first commit) stayed past those records, which were never
        handled: 110 of 200 intents, SIGKILLing one of two workers right after it joined
        (tests/integration/test_kafka_guarantees.py). Its committed position is where the
        reset policy starts a new partition (``consumer_auto_offset_reset``, earliest for the
        worker): go there. Changelogs are left alone: recovery positions them itself."""
        # _ensure_consumer and Consumer._is_changelog_tp: private (faust-streaming 0.15.3).
        consumer = self._ensure_consumer()
        committed: Mapping[TP, int] = await consumer.seek_to_committed()
        if self.app.conf.consumer_auto_offset_reset != "earliest":
            return committed
        rewind = [
            tp
            for tp, offset in committed.items()
            if not offset and not self.consumer._is_changelog_tp(tp)
        ]
        # Offset 0, at once: past what retention deleted, the fetch is out of range and
        # aiokafka resets to the log start, as the policy says. No request here: the seek
        # happens now, not after a ListOffsets round trip (or, with seek_to_beginning, after
        # the fetcher's routine, behind a fetch that may wait 1.5 s on the broker).
        for tp in rewind:
            consumer.seek(tp, 0)
        return committed


class AgentQueue(ThrowableQueue):  # type: ignore[type-arg]
    """An agent's queue that never blocks a put; fetching pauses at 80% of ``pause_at``.

    Faust derives both its pause marks and its blocking bound from one ``maxsize``;
    here the marks come from ``pause_at`` and the queue itself is unbounded.
    """

    def __init__(self, *, pause_at: int, **kwargs: Any) -> None:
        super().__init__(maxsize=0, **kwargs)
        self.pause_at = pause_at

    def clear(self) -> None:  # mode-streaming 0.7.1: called by FlowControlEvent.resume()
        """Keep what was fetched: Faust empties every queue when the flow resumes, and a
        record dropped there is never read again.

        After a rebalance Faust resumes stream partitions, seeks them to their committed
        offsets, then resumes the flow, which clears the queues (``Recovery._resume_streams``).
        Its fetcher runs meanwhile (the flow was resumed for the changelogs), so records
        fetched after the seek sat in the queue and went with the clear, while its read
        offset had moved past them: the same records fetched again were dropped as already
        read. 57 intents of one partition were never sent (worker SIGTERM and successor,
        tests/integration/test_worker_crash.py: 4 of about 15 runs under load). Kept, a record of an
        older generation, or one taken while the flow is stopped, is skipped by the stream
        (and not acknowledged: :meth:`_Consumer.ack`); any other is handled, at worst twice,
        which the jobs table absorbs.
        """

    # mode-streaming 0.7.1 derives both marks from maxsize with these two ratios.
    @property
    def pressure_high_size(self) -> int:
        return math.floor(self.pause_at / self.pressure_high_ratio)

    @property
    def pressure_drop_size(self) -> int:
        return math.floor(self.pause_at * self.pressure_drop_ratio)


class _HeldCommit:
    """A partition whose commits wait at ``offset`` since ``since`` (monotonic)."""

    __slots__ = ("offset", "since", "warned")

    def __init__(self, offset: int, since: float) -> None:
        self.offset = offset
        self.since = since
        self.warned = False


class _Consumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer with our commit rule and flow control per topic.

    Overrides private methods and reads private bookkeeping of faust-streaming 0.15.3
    (``faust/transport/consumer.py``): listed in this module's docstring.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Read once by the fetch loop (Consumer._drain_messages, faust-streaming 0.15.3).
        self.callback = deliver_at_once(self.callback)
        self._rewinds: dict[TP, int] = {}
        self._rewind_generation: int | None = None
        self._rewind_task: asyncio.Future[None] | None = None
        self._held: dict[TP, _HeldCommit] = {}

    async def wait_first(
        self,
        *coros: Any,
        timeout: Any = None,  # noqa: ASYNC109 (mode's signature)
    ) -> WaitResults:
        """mode's, except for a record delivered without waiting: nothing to wait for
        (:mod:`streams.faust_adapter.delivery`)."""
        delivered = handed_over(coros)
        if delivered is not None:
            return WaitResults([delivered], [delivered.result], False)
        return await super().wait_first(*coros, timeout=timeout)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        # Private factory (faust-streaming 0.15.3), called once when the consumer starts.
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def ack(self, message: Any) -> bool:
        """Faust's, except for a record its stream skipped without handing it over.

        While the flow is stopped (a rebalance, shutdown) or for a record of an older
        generation, Faust's stream drops the record it took and acknowledges it "so that
        the lag does not grow" (``Stream._py_aiter``): its offset became committable
        although nothing handled it. Such a record was never tracked; it is read again
        from the committed offset (after the rebalance, or by the next owner), so it is
        not acknowledged here.
        """
        app = self.app
        if not message.tracked and (
            not app.flow_control.is_active() or message.generation_id != app.consumer_generation_id
        ):
            if message.generation_id == app.consumer_generation_id:
                self._rewind_when_resumed(message.tp, message.offset, message.generation_id)
            return False
        acked: bool = super().ack(message)
        return acked

    def _rewind_when_resumed(self, tp: TP, offset: int, generation: int | None) -> None:
        """Read ``tp`` again from ``offset`` once the flow resumes.

        A record of the current generation that a stream took while the flow was stopped
        was fetched after Faust's seek to committed offsets (``Recovery._resume_streams``
        seeks, then resumes the flow), so nothing reads it again: every record of the dead
        worker's partitions fetched in that window was never sent (110 of 200, SIGKILLing
        one of two workers, tests/integration/test_kafka_guarantees.py). A record of an older
        generation needs nothing: the newer generation's seek comes after it. Records already
        handled past ``offset`` are handled again, which the jobs table absorbs.
        """
        if generation != self._rewind_generation:
            self._rewinds = {}
            self._rewind_generation = generation
        start = not self._rewinds
        if offset < self._rewinds.get(tp, offset + 1):
            self._rewinds[tp] = offset
        if start:
            self._rewind_task = asyncio.ensure_future(self._rewind_after_resume(generation))

    async def _rewind_after_resume(self, generation: int | None) -> None:
        await self.app.flow_control.acquire()
        rewinds, self._rewinds = self._rewinds, {}
        if generation != self.app.consumer_generation_id:
            return  # rebalanced again: that rebalance's seek to committed offsets reads them
        assigned = self.assignment()
        for tp, offset in sorted(rewinds.items()):
            if tp in assigned:
                await self.seek(tp, offset)

    def _filter_committable_offsets(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Faust's, with :meth:`_committable_offset` for its ``_new_offset``.

        Private hook (faust-streaming 0.15.3): ``Consumer.commit`` calls it for the offsets
        it sends; ``_should_commit`` is Faust's own filter, kept."""
        floors = self._in_flight_floors()
        if self._held:
            assigned = self.assignment()
            for gone in [tp for tp in self._held if tp not in assigned]:
                self._release_held(gone, "is no longer assigned to this worker")
        offsets: dict[TP, int] = {}
        for tp in tps:
            offset = self._committable_offset(tp, floors.get(tp))
            if offset is not None and self._should_commit(tp, offset):
                offsets[tp] = offset
        return offsets

    def _in_flight_floors(self) -> dict[TP, int]:
        """The lowest offset handed to a stream and not acknowledged yet, per partition.

        Faust tracks every record a stream takes, until acknowledged, in
        ``_unacked_messages`` (what ``wait_empty`` waits for at a rebalance and at stop);
        a lane holds its event, so a record being handled is always there. One pass over
        what is in flight (at most ``max_in_flight`` plus the agents' current events).
        """
        floors: dict[TP, int] = {}
        # _unacked_messages: Faust's private WeakSet (faust-streaming 0.15.3).
        for message in list(self._unacked_messages):
            if message.acked:
                continue
            tp, offset = message.tp, message.offset
            if offset < floors.get(tp, offset + 1):
                floors[tp] = offset
        return floors

    def _committable_offset(self, tp: TP, in_flight: int | None) -> int | None:
        """The offset to commit for ``tp``: the end of the acknowledged run at its head,
        never past ``in_flight`` (the lowest record still being handled); None: nothing new.

        A run starting more than one offset after the committed offset waits: the records
        before it were not all handled (one record is let go as Faust does: a transaction
        marker sits there after a commit). Gaps Faust noted while fetching count as
        acknowledged, as in Faust (the interval Faust notes also holds the record after the
        gap, acknowledged or not: the floor keeps the commit from passing it).
        """
        # Faust's private bookkeeping (faust-streaming 0.15.3): _acked (sorted list per tp),
        # _gap (IntervalTree), _committed_offset, _acked_index (set per tp).
        acked = self._acked[tp]
        if not acked:
            return None
        gaps = self._gap[tp]
        if gaps:
            highest = max(acked)
            noted = sorted(gaps.overlap(0, highest), key=lambda interval: interval.begin)
            if noted:
                filled = [o for interval in noted for o in range(interval.begin, interval.end)]
                acked.extend(filled)
                gaps.chop(0, max(filled[-1], highest + 1))
        done = sorted(set(acked))
        acked[:] = done
        if in_flight is not None and in_flight <= done[0]:
            return None  # the head is still being handled
        committed = self._committed_offset[tp]
        if committed is not None and done[0] - committed > 1:
            # Records between the committed offset and the first acknowledged one were not
            # all handled: wait (Faust's rule, which lets one offset go: a transaction marker
            # at the committed offset, never in flight here since the floor is above it).
            self._note_held(tp, committed, done[0])
            return None
        self._release_held(tp)
        run = next(consecutive_numbers(done))
        end = run[-1] + 1
        if in_flight is not None:
            end = min(end, in_flight)
        acked[:] = [o for o in done if o >= end]
        self._acked_index[tp].difference_update(o for o in run if o < end)
        return end

    def _note_held(self, tp: TP, committed: int, first_done: int) -> None:
        """Commits of ``tp`` wait on offsets ``committed .. first_done - 1``: normally for a
        moment (their records are on their way to a stream). Held for
        :data:`COMMIT_HELD_WARN_S`, a record there may have been dropped unread, and the
        partition's lag would not fall until a rebalance or restart reads it again: say so
        once, and count the partition in ``zapstream_worker_commits_held_partitions``."""
        now = monotonic()
        held = self._held.get(tp)
        if held is None or held.offset != committed:
            if held is not None and held.warned:
                metrics.COMMITS_HELD.dec()
            self._held[tp] = _HeldCommit(committed, now)
            return
        if not held.warned and now - held.since >= COMMIT_HELD_WARN_S:
            held.warned = True
            metrics.COMMITS_HELD.inc()
            log.warning(
                "partition %s-%d: commits held at offset %d for %.0fs: offsets %d..%d were "
                "never acknowledged while later ones were; its consumer lag will not fall "
                "until a rebalance or a restart of this worker reads them again",
                tp.topic,
                tp.partition,
                committed,
                now - held.since,
                committed,
                first_done - 1,
            )

    def _release_held(self, tp: TP, why: str = "commits past it again") -> None:
        held = self._held.pop(tp, None)
        if held is not None and held.warned:
            metrics.COMMITS_HELD.dec()
            log.info(
                "partition %s-%d, held at offset %d for %.0fs: %s",
                tp.topic,
                tp.partition,
                held.offset,
                monotonic() - held.since,
                why,
            )

    def on_buffer_full(self, tp: TP) -> None:
        """The queue ``tp`` feeds is 80% full: stop fetching every partition of its topic."""
        if self.app.in_recovery:  # as Faust: recovery reads changelogs through here
            return
        # _get_active_partitions, _buffered_partitions, _paused_partitions: private
        # (faust-streaming 0.15.3), the sets Faust's fetcher reads.
        active = self._get_active_partitions()
        for same in self.assignment():
            if same.topic == tp.topic:
                active.discard(same)
                self._buffered_partitions.add(same)

    def on_buffer_drop(self, tp: TP) -> None:
        """The queue drained: fetch every partition of the topic again (unless paused)."""
        buffered = [same for same in self._buffered_partitions if same.topic == tp.topic]
        if not buffered:
            return
        active = self._get_active_partitions()
        for same in buffered:
            self._buffered_partitions.discard(same)
            if same not in self._paused_partitions:
                active.add(same)


class KafkaTransport(faust_aiokafka.Transport):
    """Faust's aiokafka transport whose worker consumer waits ``fetch_max_wait_ms`` at most."""

    Consumer = _Consumer
