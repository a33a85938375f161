"""What the worker produces per message, with and without ``zapstream.results``.

Attempt records are off by default (``ZAPSTREAM_WORKER_PUBLISH_ATTEMPTS``, issue 17:
nothing reads the topic): a message accepted at the first attempt costs two records
(ATTEMPTING, then ACCEPTED, both on ``zapstream.state``) instead of three. The counts
are taken from the worker's own stores over a writer that records every send.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import random
from types import SimpleNamespace
from typing import Any

import pytest

from streams.job_processor import Done, JobProcessor, RetryPolicy
from streams.kernel.contract import DEFAULT_NAMES, IntentCaptured, JobStatus
from streams.kernel.errors import TransientGatewayError
from streams.kernel.ports import SendAccepted, TextMessage
from streams.reconcile import InstanceListings
from streams.stores import FaustJobStore, FaustPublisher

NOW = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)
MESSAGES = 50


class RecordingWriter:
    """``KafkaWriter.send``, recorded: (topic, bytes) per record, acknowledged at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int | None = None
    ) -> Any:
        self.sent.append((topic, len(key) + len(value or b"")))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class Gateway:
    """Accepts every message, except the first send of each job in ``flaky``."""

    name = "fake"

    def __init__(self, flaky: bool = False) -> None:
        self.flaky = flaky
        self.calls: collections.Counter[str] = collections.Counter()

    async def send_text(self, message: TextMessage) -> SendAccepted:
        job = message.reference.rpartition("-")[0]
        self.calls[job] += 1
        if self.flaky and self.calls[job] == 1:
            raise TransientGatewayError("503")
        return SendAccepted(f"g-{message.reference}", "sent", JobStatus.ACCEPTED)


def _intent(job_id: int) -> IntentCaptured:
    return IntentCaptured(
        job_id=job_id,
        instance_id="shop",
        conversation_key=f"c{job_id}",
        idempotency_key=f"k{job_id}",
        message_type="text",
        to="5511987654321",
        text="hi",
    )


async def _produced(*, publish_attempts: bool, flaky: bool) -> collections.Counter[str]:
    writer = RecordingWriter()
    gateway = Gateway(flaky)
    store = FaustJobStore(SimpleNamespace(data={}), writer, DEFAULT_NAMES.state)  # type: ignore[arg-type]
    publisher = FaustPublisher(writer, publish_attempts=publish_attempts)  # type: ignore[arg-type]
    processor = JobProcessor(
        gateway,  # type: ignore[arg-type]
        store,
        publisher,
        RetryPolicy(schedule_s=(60,), jitter=0.0),
        now=lambda: NOW,
        rng=random.Random(1),
        listings=InstanceListings(gateway, gather_s=0),  # type: ignore[arg-type]
        pacing_wait_s={"operational": 0.0},
    )
    for job_id in range(1, MESSAGES + 1):
        for _ in range(2):  # a flaky first send parks; the retry is accepted
            outcome = await processor.on_intent(_intent(job_id), 0)
            if isinstance(outcome, Done):
                break
        assert isinstance(outcome, Done) and outcome.state is not None
        assert outcome.state.status == JobStatus.ACCEPTED
    return collections.Counter(topic for topic, _ in writer.sent)


@pytest.mark.parametrize(
    ("publish_attempts", "flaky", "state", "results"),
    [
        (True, False, 2, 1),  # before issue 17: ATTEMPTING, ACCEPTED, one attempt record
        (False, False, 2, 0),
        (True, True, 4, 2),  # ATTEMPTING, RETRY_WAIT, ATTEMPTING, ACCEPTED; two attempts
        (False, True, 4, 0),
    ],
)
async def test_records_produced_per_message(
    publish_attempts: bool, flaky: bool, state: int, results: int
) -> None:
    produced = await _produced(publish_attempts=publish_attempts, flaky=flaky)
    assert (
        produced
        == collections.Counter(
            {DEFAULT_NAMES.state: state * MESSAGES, DEFAULT_NAMES.results: results * MESSAGES}
        )
        - collections.Counter()
    )  # Counter arithmetic drops the zero counts
