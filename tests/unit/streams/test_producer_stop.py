"""stop_producer: a flush that never ends (an idempotent producer, Kafka down) is cut short.

The producer is a stand-in with aiokafka's shape (the real one needs a broker: the webhook
intake's ``test_kafka_down_answers_503`` stops one with its Apache Kafka killed).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaProducer

from streams.kernel.producer_stop import stop_producer


class _Accumulator:
    """aiokafka's RecordAccumulator as stop() meets it: records waiting for their ack."""

    def __init__(self, pending: int) -> None:
        loop = asyncio.get_running_loop()
        self.pending = [loop.create_future() for _ in range(pending)]

    async def flush(self) -> None:
        await asyncio.gather(*self.pending, return_exceptions=True)


class _Sender:
    """aiokafka's Sender: a task retrying unacknowledged batches until cancelled."""

    def __init__(self) -> None:
        self.sender_task = asyncio.ensure_future(asyncio.Event().wait())


class _Producer:
    """stop() as AIOKafkaProducer.stop(): wait for the flush or the sender's end, whichever
    comes first, then close."""

    def __init__(self, pending: int) -> None:
        self._message_accumulator = _Accumulator(pending)
        self._sender = _Sender()
        self.closed = False

    async def stop(self) -> None:
        flush = asyncio.ensure_future(self._message_accumulator.flush())
        await asyncio.wait([flush, self._sender.sender_task], return_when=asyncio.FIRST_COMPLETED)
        self._sender.sender_task.cancel()
        self.closed = True


def _as_producer(fake: _Producer) -> AIOKafkaProducer:
    return cast(AIOKafkaProducer, cast(Any, fake))


async def test_a_flushed_producer_stops_without_a_word(caplog: pytest.LogCaptureFixture) -> None:
    fake = _Producer(pending=0)
    with caplog.at_level(logging.WARNING):
        assert await stop_producer(_as_producer(fake), 5, what="the intake") is True
    assert fake.closed
    assert not caplog.records


async def test_records_never_acknowledged_end_the_sender_and_the_producer_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = _Producer(pending=3)
    with caplog.at_level(logging.WARNING):
        assert await stop_producer(_as_producer(fake), 0.05, what="the intake") is False
    # Closed: only the sender's end lets the stand-in's stop() past its flush.
    assert fake.closed and fake._sender.sender_task.cancelled()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("the intake: Kafka did not acknowledge its last records")


async def test_records_acknowledged_in_time_are_not_failed() -> None:
    fake = _Producer(pending=1)
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, fake._message_accumulator.pending[0].set_result, None)
    assert await stop_producer(_as_producer(fake), 5, what="the intake") is True
    assert fake.closed
