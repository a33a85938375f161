"""aiokafka's flood of retry lines is one Kafka outage per process: one line in, one line out."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import pytest
from aiokafka.errors import KafkaConnectionError
from prometheus_client import REGISTRY

from streams.kernel import kafka_outage
from streams.kernel.kafka_outage import KafkaOutageWatch, is_unavailability
from streams.kernel.runtime.periodic import FLAP_WINDOW_S, Periodic

LOGGER = "zapstream.test.kafka_outage"
AIOKAFKA = logging.getLogger("aiokafka")
FETCHER = logging.getLogger("aiokafka.consumer.fetcher")


def _sample(name: str, component: str) -> float:
    return REGISTRY.get_sample_value(name, {"component": component}) or 0.0


def _ours(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _aiokafka(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("aiokafka")]


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def _flood(n: int = 50) -> None:
    """What one client logs while its only broker is down (aiokafka 0.14's own lines)."""
    for _ in range(n):
        AIOKAFKA.error(
            "Unable connect to node with id %s: %s", 1, "[Errno 111] Connect call failed"
        )
        AIOKAFKA.error("Unable to update metadata from %s", [1])
        FETCHER.error(
            "Failed fetch messages from %s: %s",
            1,
            "NodeNotReadyError: Attempt to send a request to node which is not ready (node id 1).",
        )


async def _answers() -> bool:
    return True


async def _refuses() -> bool:
    return False


async def test_a_flood_of_client_errors_is_one_line_when_it_starts_and_one_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors_before = _sample("zapstream_kafka_client_errors_total", "t-flood")
    watch = KafkaOutageWatch(
        "t-flood",
        None,
        logger=logging.getLogger(LOGGER),
        quiet_s=0.2,
        probe_interval_s=0.05,
        probe=_answers,
    )
    with caplog.at_level(logging.INFO):
        async with watch:
            assert _sample("zapstream_kafka_unavailable", "t-flood") == 0
            _flood()
            assert watch.ongoing
            assert _sample("zapstream_kafka_unavailable", "t-flood") == 1
            await _until(lambda: not watch.ongoing)
        # Removed at stop: aiokafka logs as it likes again.
        AIOKAFKA.error("Unable to update metadata from %s", [1])
    lines = _ours(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith("Kafka unavailable, its clients retrying: Unable to update metadata")
    assert lines[1].startswith("Kafka available again after "), lines
    # Every line but the first (a refused connection, before the outage) is the outage's.
    assert lines[1].endswith(" and 149 failed attempts"), lines
    assert _aiokafka(caplog) == ["Unable to update metadata from [1]"]
    assert _sample("zapstream_kafka_client_errors_total", "t-flood") - errors_before == 150
    assert _sample("zapstream_kafka_outages_total", "t-flood") == 1
    assert _sample("zapstream_kafka_outage_seconds_total", "t-flood") > 0
    assert _sample("zapstream_kafka_unavailable", "t-flood") == 0


async def test_the_outage_lasts_while_errors_keep_coming_or_kafka_does_not_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = [False]

    async def probe() -> bool:
        return answers[0]

    watch = KafkaOutageWatch(
        "t-quiet", None, logger=logging.getLogger(LOGGER), quiet_s=0.3, probe=probe
    )
    watch.probe_interval_s = 0.05
    with caplog.at_level(logging.INFO):
        async with watch:
            _flood(1)
            # Errors within the quiet period: the same outage, however long.
            for _ in range(6):
                await asyncio.sleep(0.1)
                _flood(1)
            assert watch.ongoing and not watch.recovered()
            # Quiet now, but the probe is refused: still down.
            await asyncio.sleep(0.5)
            assert watch.ongoing
            answers[0] = True
            await _until(lambda: not watch.ongoing)
    assert len(_ours(caplog)) == 2, _ours(caplog)
    assert watch.outages == 1


async def test_other_aiokafka_records_and_tracebacks_are_left_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with KafkaOutageWatch("t-other", None, logger=logging.getLogger(LOGGER)) as watch:
        with caplog.at_level(logging.INFO):
            AIOKAFKA.error("Topic %s is not authorized for this client", "zapstream.intents")
            try:
                raise KafkaConnectionError("Connection at 127.0.0.1:9092 closed")
            except KafkaConnectionError:
                FETCHER.exception("Unexpected error in fetcher routine")
            logging.getLogger("faust.transport").error("KafkaConnectionError somewhere else")
        assert not watch.ongoing
    assert len(caplog.records) == 3
    assert _ours(caplog) == []


def test_what_counts_as_kafka_unreachable() -> None:
    def record(name: str, level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, message, None, None)

    unavailable = [
        "Got error produce response: KafkaConnectionError: Connection at 127.0.0.1:1 closed",
        "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError",
        "Heartbeat session expired - marking coordinator dead",
        "Got error produce response on topic-partition TopicPartition(topic='zapstream.state', "
        "partition=1), retrying. Error: <class 'aiokafka.errors.NotLeaderForPartitionError'>",
        "Failed fetch messages from 2: RequestTimedOutError",
    ]
    for message in unavailable:
        assert is_unavailability(record("aiokafka.producer.sender", logging.WARNING, message))
    assert not is_unavailability(record("aiokafka", logging.INFO, unavailable[0]))
    assert not is_unavailability(record("streams.relay", logging.ERROR, unavailable[0]))
    assert not is_unavailability(
        record("aiokafka.cluster", logging.ERROR, "Topic zapstream.intents not found")
    )


async def test_with_a_target_the_component_writes_the_lines_and_its_readiness_follows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    class Target:
        ongoing = False

        def failed(self, reason: str, delay_s: float | None = None) -> None:
            calls.append(f"failed: {reason}")
            self.ongoing = True

        def recovered(self) -> None:
            calls.append("recovered")
            self.ongoing = False

    target = Target()
    watch = KafkaOutageWatch(
        "t-target", None, target=target, quiet_s=0.1, probe_interval_s=0.05, probe=_answers
    )
    with caplog.at_level(logging.INFO):
        async with watch:
            _flood(20)
            assert target.ongoing
            await _until(lambda: not watch.ongoing)
    assert len(calls) == 2, calls
    assert calls[0].startswith("failed: Unable to update metadata from [1] (aiokafka's retries")
    assert calls[1] == "recovered"
    assert _aiokafka(caplog) == [] and _ours(caplog) == []


async def test_one_broker_refusing_while_the_others_answer_is_one_line_not_an_outage(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_outage, "NODE_LINE_DELAY_S", 0.05)
    watch = KafkaOutageWatch(
        "t-node", None, logger=logging.getLogger(LOGGER), quiet_s=0.1, probe=_answers
    )
    with caplog.at_level(logging.INFO):
        async with watch:
            for _ in range(5):
                AIOKAFKA.error('Unable connect to "%s:%s": %s', "127.0.0.1", 9092, "refused")
                await asyncio.sleep(0.05)
            await _until(lambda: len(_ours(caplog)) == 1)
            assert not watch.ongoing
            # A real outage right behind a refused connection: its own line says it all.
            watch._node_logged = None
            AIOKAFKA.error("Unable connect to node with id %s: %s", 2, "refused")
            _flood(1)
            await asyncio.sleep(0.2)
    lines = _ours(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith("a connection to a Kafka broker failed, aiokafka tries the others:")
    assert lines[1].startswith("Kafka unavailable, its clients retrying:"), lines


async def test_records_from_another_thread_start_the_outage_and_the_probe_ends_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Faust's consumer runs in a thread with a loop of its own.
    watch = KafkaOutageWatch(
        "t-thread",
        None,
        logger=logging.getLogger(LOGGER),
        quiet_s=0.1,
        probe_interval_s=0.05,
        probe=_answers,
    )
    with caplog.at_level(logging.INFO):
        async with watch:
            thread = threading.Thread(target=_flood, args=(10,))
            thread.start()
            thread.join()
            assert watch.ongoing
            await _until(lambda: not watch.ongoing)
    assert len(_ours(caplog)) == 2


async def test_a_periodic_reader_says_nothing_more_inside_the_process_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes: list[BaseException | None] = [
        KafkaConnectionError("Unable to bootstrap"),
        KafkaConnectionError("Unable to bootstrap"),
        None,
        KafkaConnectionError("Unable to bootstrap"),
        None,
    ]

    async def read() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    run = Periodic(
        "lag monitor", 1.0, read, logger=logging.getLogger(LOGGER), clock=lambda: 0.0
    ).tick
    watch = KafkaOutageWatch("t-reader", None, logger=logging.getLogger(LOGGER), probe=_refuses)
    with caplog.at_level(logging.INFO):
        async with watch:
            _flood(1)
            await run()
            await run()
            await run()  # reads again: silently, as it failed silently
            lines = _ours(caplog)
            assert len(lines) == 1 and lines[0].startswith("Kafka unavailable"), lines
        # The process's outage is over (the watch stopped): the reader speaks for itself.
        await run()
        await run()
    lines = _ours(caplog)[1:]
    assert lines == [
        "lag monitor unavailable, retrying at the next tick: "
        "KafkaConnectionError: Unable to bootstrap",
        "lag monitor available again after 0.0s and 1 failed attempts",
    ], lines


async def test_a_reader_failing_again_right_after_reading_again_is_the_same_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One broker of three down: the reader's client picks it now and then, the others answer.
    outcomes: list[BaseException | None] = [
        KafkaConnectionError("node 2 not ready"),
        None,
        KafkaConnectionError("node 2 not ready"),
        None,
        KafkaConnectionError("node 2 not ready"),
    ]

    async def read() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    now = [0.0]
    run = Periodic(
        "sink progress", 1.0, read, logger=logging.getLogger(LOGGER), clock=lambda: now[0]
    ).tick
    with caplog.at_level(logging.INFO):
        for _ in range(4):
            await run()
        assert _ours(caplog) == [
            "sink progress unavailable, retrying at the next tick: "
            "KafkaConnectionError: node 2 not ready",
            "sink progress available again after 0.0s and 1 failed attempts",
        ]
        # Long after its last "available again": a new outage, a new line.
        now[0] += FLAP_WINDOW_S + 1
        await run()
    assert len(_ours(caplog)) == 3 and "sink progress unavailable" in _ours(caplog)[2]
