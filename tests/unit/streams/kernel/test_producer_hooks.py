"""aiokafka's private producer hook (:mod:`streams.kernel.producer_stop`) still has the shape
zapstream uses: fails first when an aiokafka upgrade moves it."""

from __future__ import annotations

import asyncio
import inspect

from aiokafka import AIOKafkaProducer
from aiokafka.producer.sender import Sender

from streams.kernel.producer_stop import _sender, abandon_sender


async def test_the_producer_has_a_sender_with_a_task_and_a_close() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")
    try:
        sender = _sender(producer)
        assert isinstance(sender, Sender)
        assert isinstance(inspect.getattr_static(Sender, "sender_task"), property)
        assert inspect.iscoroutinefunction(Sender.close)
        assert sender.sender_task is None  # set when the producer starts
    finally:
        await producer.stop()


async def test_abandoning_a_sender_ends_its_task() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")
    try:
        sender = _sender(producer)
        sender._sender_task = task = asyncio.ensure_future(_retrying_for_ever())
        await asyncio.sleep(0)  # the routine is running, as a started producer's is
        await abandon_sender(producer)
        assert task.done() and task.result() == "ended"
    finally:
        await producer.stop()


async def _retrying_for_ever() -> str:
    """Like aiokafka's sender routine: retries until cancelled, then ends quietly."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        return "ended"
    return "not reached"
