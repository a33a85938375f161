"""The worker's Faust consumer takes its fetch wait from our settings (no broker needed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka

from streams.settings import BrokerFlavor, KafkaSettings
from streams.transport import _ConsumerThread


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
    from streams.transport import KafkaTransport
    from streams.worker_settings import WorkerSettings

    kafka = KafkaSettings(brokers="127.0.0.1:1", flavor=BrokerFlavor.TANSU)
    app = build_app(WorkerSettings(kafka=kafka, data_dir=str(tmp_path)))
    assert app.fetch_max_wait_ms == 10
    assert isinstance(app._new_transport(), KafkaTransport)


def test_an_agent_queue_pauses_at_its_mark_and_never_blocks_a_put() -> None:
    from mode.utils.queues import FlowControlEvent

    from streams.transport import AgentQueue

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
