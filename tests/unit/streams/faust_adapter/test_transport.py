"""The worker's Faust consumer takes its fetch wait from our settings (no broker needed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka

from streams.faust_adapter.transport import _ConsumerThread
from streams.kernel.settings import BrokerFlavor, KafkaSettings


@pytest.mark.parametrize(
    ("flavor", "configured", "expected_ms"),
    [
        (BrokerFlavor.TANSU, None, 10),
        (BrokerFlavor.KAFKA, None, 1500),
        (BrokerFlavor.KAFKA, 200, 200),
        (BrokerFlavor.TANSU, 50, 50),
    ],
)
def test_fetch_wait_follows_the_broker_flavor_unless_set(
    flavor: BrokerFlavor, configured: int | None, expected_ms: int
) -> None:
    kafka = KafkaSettings(flavor=flavor, fetch_max_wait_ms=configured)
    assert kafka.consumer_fetch_max_wait_ms == expected_ms


@pytest.mark.parametrize(("app_wait_ms", "expected_ms"), [(10, 10), (None, 1500)])
def test_worker_consumer_gets_the_apps_fetch_wait(
    monkeypatch: pytest.MonkeyPatch, app_wait_ms: int | None, expected_ms: int
) -> None:
    """Faust builds the consumer with 1500; our thread sets the app's wait before start()."""
    built = SimpleNamespace(_fetch_max_wait_ms=1500)

    def faust_builds(self: Any, transport: Any) -> Any:
        return built

    monkeypatch.setattr(
        faust_aiokafka.AIOKafkaConsumerThread, "_create_worker_consumer", faust_builds
    )
    thread = _ConsumerThread.__new__(_ConsumerThread)  # no service machinery: just the method
    thread.app = SimpleNamespace(fetch_max_wait_ms=app_wait_ms)  # type: ignore[assignment]
    consumer = thread._create_worker_consumer(transport=None)
    assert consumer is built and built._fetch_max_wait_ms == expected_ms


def test_worker_app_hands_faust_our_transport_with_the_settings_wait(tmp_path: Any) -> None:
    from streams.app import build_app
    from streams.faust_adapter.transport import KafkaTransport
    from streams.worker_settings import WorkerSettings

    kafka = KafkaSettings(brokers="127.0.0.1:1", flavor=BrokerFlavor.TANSU)
    app = build_app(WorkerSettings(kafka=kafka, data_dir=str(tmp_path)))
    assert app.fetch_max_wait_ms == 10
    assert isinstance(app._new_transport(), KafkaTransport)


def test_an_agent_queue_pauses_at_its_mark_and_never_blocks_a_put() -> None:
    from mode.utils.queues import FlowControlEvent

    from streams.faust_adapter.transport import AgentQueue

    queue = AgentQueue(pause_at=100, flow_control=FlowControlEvent())
    high: list[int] = []
    drops: list[int] = []

    def on_drop() -> None:  # one partition's callback: the same object at every put
        drops.append(1)

    for i in range(300):  # three times the size: a whole poll fetched past the mark
        queue.put_nowait_enhanced(
            i, on_pressure_high=lambda i=i: high.append(i), on_pressure_drop=on_drop
        )
    assert not queue.full() and queue.qsize() == 300
    assert high == [80]  # once, at 80% of 100 (one callback per partition: one here)
    while queue.qsize():
        queue.get_nowait()
    assert drops == [1]  # fetching resumes once it drained to 40%


class _SeekingConsumer:
    """aiokafka's seek_to_committed and seek, recorded."""

    def __init__(self, committed: dict[Any, int | None]) -> None:
        self.committed = committed
        self.rewound: list[Any] = []

    async def seek_to_committed(self) -> dict[Any, int | None]:
        return dict(self.committed)

    def seek(self, tp: Any, offset: int) -> None:
        assert offset == 0  # past a deleted log start: out of range, reset to the start
        self.rewound.append(tp)


@pytest.mark.parametrize(
    ("reset", "expected"), [("earliest", ["intents-1", "intents-2"]), ("latest", [])]
)
async def test_seek_to_committed_rewinds_stream_partitions_with_no_commit(
    reset: str, expected: list[str]
) -> None:
    """A partition the group never committed on goes back to where the reset policy starts
    it (records fetched and dropped during a rebalance are read again); committed ones and
    changelogs are aiokafka's."""
    from aiokafka import TopicPartition

    tps = {
        "intents-0": TopicPartition("intents", 0),
        "intents-1": TopicPartition("intents", 1),
        "intents-2": TopicPartition("intents", 2),
        "state-0": TopicPartition("state", 0),
    }
    committed = {tps["intents-0"]: 42, tps["intents-1"]: None, tps["intents-2"]: 0}
    committed[tps["state-0"]] = None
    consumer = _SeekingConsumer(committed)
    thread = _ConsumerThread.__new__(_ConsumerThread)  # no service machinery: just the method
    conf = SimpleNamespace(consumer_auto_offset_reset=reset)
    thread.app = SimpleNamespace(conf=conf)  # type: ignore[assignment]
    changelogs = SimpleNamespace(_is_changelog_tp=lambda tp: tp.topic == "state")
    thread.consumer = changelogs  # type: ignore[assignment]
    thread._ensure_consumer = lambda: consumer  # type: ignore[method-assign]
    assert await thread._seek_to_committed() == committed
    assert consumer.rewound == [tps[name] for name in expected]


# --- commits never pass a record still being handled (faust-streaming #606) -------------


class _Commits:
    """Faust's ack bookkeeping (its own ``Consumer.ack``) around our consumer's choice of
    offsets to commit; no broker, no service machinery."""

    TOPIC = "zapstream.intents"

    def __init__(self, committed: int | None = None) -> None:
        from collections import defaultdict
        from weakref import WeakSet

        from faust.types import TP
        from intervaltree import IntervalTree
        from mode.utils.queues import FlowControlEvent

        from streams.faust_adapter.transport import _Consumer

        self.tp = TP(self.TOPIC, 0)
        consumer = _Consumer.__new__(_Consumer)
        self.flow = FlowControlEvent(initially_suspended=False)
        consumer.app = SimpleNamespace(  # type: ignore[assignment]
            topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
            flow_control=self.flow,
            consumer_generation_id=1,
        )
        consumer._acked = defaultdict(list)
        consumer._acked_index = defaultdict(set)
        consumer._gap = defaultdict(IntervalTree)
        consumer._committed_offset = defaultdict(lambda: None)
        consumer._unacked_messages = WeakSet()
        consumer._n_acked = 0
        consumer._waiting_for_ack = None
        consumer._rewinds = {}
        consumer._rewind_generation = None
        consumer._rewind_task = None
        consumer._held = {}
        self.seeks: list[tuple[int, int]] = []

        async def seek(tp: Any, offset: int) -> None:
            self.seeks.append((tp.partition, offset))

        consumer.assignment = lambda: {self.tp}  # type: ignore[method-assign]
        consumer.seek = seek  # type: ignore[method-assign,assignment]
        if committed is not None:
            consumer._committed_offset[self.tp] = committed
        self.consumer = consumer
        self.messages: dict[int, Any] = {}

    def fetch(self, offset: int, generation: int = 1) -> Any:
        from faust.types.tuples import ConsumerMessage

        message = ConsumerMessage(
            self.TOPIC,
            0,
            offset,
            0.0,
            0,
            None,
            None,
            b"",
            None,
            tp=self.tp,
            generation_id=generation,
        )
        self.messages[offset] = message
        return message

    def take(self, *offsets: int) -> None:
        """A stream takes these records (Faust tracks them until acknowledged)."""
        for offset in offsets:
            message = self.fetch(offset)
            message.tracked = True
            self.consumer._unacked_messages.add(message)

    def ack(self, *offsets: int) -> bool:
        """Acknowledge as a stream does (``Event.ack``); True if every one counted."""
        return all([self.messages[offset].ack(self.consumer) for offset in offsets])

    def commit(self) -> int | None:
        """What a commit now sends for the partition (and records it as Faust does)."""
        offsets = self.consumer._filter_committable_offsets([self.tp])
        self.consumer._committed_offset.update(offsets)
        return offsets.get(self.tp)


@pytest.mark.parametrize("committed", [None, 0, 10])
def test_a_commit_never_passes_the_record_at_its_head_while_it_is_handled(
    committed: int | None,
) -> None:
    """Faust 0.15.3 commits C+3 here (C still in its lane), and with no commit yet the first
    acknowledged run whatever is before it: a crash then loses C."""
    head = committed or 0
    commits = _Commits(committed)
    commits.take(head, head + 1, head + 2, head + 3)
    assert commits.ack(head + 1, head + 2)
    assert commits.commit() is None
    commits.ack(head)
    assert commits.commit() == head + 3  # head + 3 is still in flight
    commits.ack(head + 3)
    assert commits.commit() == head + 4


def test_a_commit_stops_at_the_lowest_record_in_flight_inside_the_acknowledged_run() -> None:
    commits = _Commits(committed=100)
    commits.take(*range(100, 110))
    commits.ack(100, 101, 102, 104, 105, 106, 107, 108, 109)
    assert commits.commit() == 103  # 103 is in a lane
    assert commits.commit() is None
    commits.ack(103)
    assert commits.commit() == 110


def test_one_offset_never_delivered_at_the_head_is_let_go_a_longer_gap_waits() -> None:
    """A transaction marker (ZAPSTREAM_RELAY_EXACTLY_ONCE) can sit at the committed offset: the
    first record is C+1, and the commit goes on. Records missing further on were not all
    handled (a queue cleared under them, once): the commit waits for them."""
    marker = _Commits(committed=10)
    marker.take(11, 12)
    marker.ack(11, 12)
    assert marker.commit() == 13
    dropped = _Commits(committed=10)
    dropped.take(13, 14)  # 10, 11 and 12 fetched and never handed over
    dropped.ack(13, 14)
    assert dropped.commit() is None
    dropped.take(10, 11, 12)  # read again
    dropped.ack(10, 11, 12)
    assert dropped.commit() == 15


def test_commits_held_a_minute_on_records_never_acknowledged_are_said_once_and_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A partition whose commits wait on records dropped unread would only show as lag that
    does not fall: after COMMIT_HELD_WARN_S the worker names it once, and counts it."""
    from streams import metrics
    from streams.faust_adapter import transport

    clock = [1000.0]
    monkeypatch.setattr(transport, "monotonic", lambda: clock[0])
    gauge = metrics.COMMITS_HELD._value
    before = gauge.get()
    commits = _Commits(committed=10)
    commits.take(13, 14)  # 10, 11 and 12 fetched and never handed over
    commits.ack(13, 14)
    caplog.set_level("INFO", logger="streams.faust_adapter.transport")
    assert commits.commit() is None
    clock[0] += transport.COMMIT_HELD_WARN_S - 1
    assert commits.commit() is None
    assert not caplog.records and gauge.get() == before  # a moment's wait is normal
    clock[0] += 1
    for _ in range(3):
        assert commits.commit() is None
    held = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(held) == 1, held
    assert "zapstream.intents-0" in held[0] and "offset 10" in held[0] and "10..12" in held[0]
    assert gauge.get() == before + 1
    commits.take(10, 11, 12)  # read again (a rebalance, a restart)
    commits.ack(10, 11, 12)
    assert commits.commit() == 15
    assert gauge.get() == before
    assert "commits past it again" in caplog.records[-1].getMessage()


def test_an_agent_queue_keeps_its_records_when_faust_clears_the_queues() -> None:
    """Faust clears every queue when the flow resumes after a rebalance, with its read offset
    already past the records: dropped there, they were never read again."""
    from mode.utils.queues import FlowControlEvent

    from streams.faust_adapter.transport import AgentQueue

    flow = FlowControlEvent(initially_suspended=False)
    queue = AgentQueue(pause_at=100, flow_control=flow, clear_on_resume=True)
    for i in range(5):
        queue.put_nowait_enhanced(i, on_pressure_high=lambda: None, on_pressure_drop=lambda: None)
    flow.suspend()
    flow.resume()  # what Recovery._resume_streams does once it sought to committed offsets
    flow.clear()
    assert [queue.get_nowait() for _ in range(queue.qsize())] == [0, 1, 2, 3, 4]


def test_a_gap_faust_noted_counts_but_never_carries_the_commit_past_a_record_in_flight() -> None:
    """Faust notes a gap after a marker as [r+1, offset] inclusive: the record after the
    marker (12 here) counts as acknowledged in its arithmetic, acknowledged or not."""
    commits = _Commits(committed=11)
    commits.consumer._gap[commits.tp].addi(11, 13)  # _add_gap(tp, 11, 12)
    commits.take(12, 13)
    commits.ack(13)
    assert commits.commit() == 12  # past the marker (11), not past 12, still being handled
    commits.ack(12)
    assert commits.commit() == 14


def test_records_taken_in_order_and_acknowledged_in_any_order_commit_only_finished_prefixes() -> (
    None
):
    """Lanes finish in any order: every commit equals the finished prefix, whatever the order."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        commits = _Commits(committed=None)
        offsets = list(range(50))
        commits.take(*offsets)
        order = offsets[:]
        rng.shuffle(order)
        finished: set[int] = set()
        last = 0
        for offset in order:
            commits.ack(offset)
            finished.add(offset)
            prefix = next(o for o in range(51) if o not in finished)
            got = commits.commit()
            if got is not None:
                last = got
            assert last == prefix, f"committed {last} with the prefix finished up to {prefix}"
        assert last == 50


@pytest.mark.parametrize("why", ["flow stopped", "older generation"])
async def test_a_record_faust_skipped_without_handing_it_over_is_not_acknowledged(why: str) -> None:
    """Faust's stream acknowledges the record it drops while the flow is stopped (rebalance,
    shutdown) or of an older generation: never handled, it must not become committable."""
    commits = _Commits(committed=20)
    commits.take(20)
    if why == "flow stopped":
        commits.flow.suspend()
        skipped = commits.fetch(21)
    else:
        skipped = commits.fetch(21, generation=0)
    assert commits.ack(20)
    assert not skipped.ack(commits.consumer)  # what Stream._py_aiter does with it
    assert commits.commit() == 21  # 20 handled; 21 is read again from here
    commits.flow.resume()
    commits.take(21)  # the same record, read again and handed over
    assert commits.ack(21)
    assert commits.commit() == 22


async def test_records_of_this_generation_skipped_while_the_flow_is_stopped_are_read_again() -> (
    None
):
    """Faust seeks to committed offsets, then resumes the flow: a record fetched between the
    two and skipped by the stream is read again once the flow resumes (from the lowest one),
    an older generation's is not (the newer rebalance's seek reads it)."""
    import asyncio

    commits = _Commits(committed=20)
    consumer = commits.consumer
    seeks = commits.seeks
    commits.flow.suspend()
    for offset in (22, 21, 23):
        assert not commits.fetch(offset).ack(consumer)
    assert not commits.fetch(19, generation=0).ack(consumer)
    await asyncio.sleep(0)
    assert seeks == []  # not while the flow is stopped
    commits.flow.resume()
    assert consumer._rewind_task is not None
    await asyncio.wait_for(consumer._rewind_task, 5)
    assert seeks == [(0, 21)]

    # Rebalanced again before the flow resumed: nothing of the old generation is sought.
    seeks.clear()
    commits.flow.suspend()
    assert not commits.fetch(24).ack(consumer)
    consumer.app.consumer_generation_id = 2
    commits.flow.resume()
    await asyncio.wait_for(consumer._rewind_task, 5)
    assert seeks == []
