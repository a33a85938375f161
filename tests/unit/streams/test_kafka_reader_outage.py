"""A timer reading Kafka logs one line per outage, whatever faces the outage shows."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaError, RequestTimedOutError

from streams.kernel.runtime.periodic import guarded

LOGGER = "zapstream.test.kafka_reader"


async def test_a_hung_then_unreachable_kafka_is_one_outage_and_one_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What a blackholed broker looks like from a timer: the request times out, then the
    # metadata cannot be read, then the bootstrap is refused; then it answers again.
    faces: list[BaseException | None] = [
        RequestTimedOutError(),
        KafkaError("Unable to get cluster metadata over all known brokers"),
        KafkaConnectionError("Unable to bootstrap"),
        RequestTimedOutError(),
        None,
        None,
    ]

    async def read() -> None:
        face = faces.pop(0)
        if face is not None:
            raise face

    run = guarded("lag monitor", read, logging.getLogger(LOGGER), clock=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(6):
            await run()
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 2, lines
    assert lines[0].startswith("lag monitor unavailable, retrying at the next tick: "), lines
    assert lines[1] == "lag monitor available again after 0.0s and 4 failed attempts", lines


async def test_a_bug_after_a_kafka_outage_still_gets_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faces: list[BaseException] = [RequestTimedOutError(), KeyError("bug")]

    async def read() -> None:
        raise faces.pop(0)

    run = guarded("lag monitor", read, logging.getLogger(LOGGER))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await run()
        await run()
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelname for r in records] == ["WARNING", "ERROR"], records
    assert records[1].exc_info is not None and records[1].exc_info[0] is KeyError
