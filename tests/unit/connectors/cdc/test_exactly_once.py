"""The relay's exactly-once option (``ZAPSTREAM_RELAY_EXACTLY_ONCE``): settings and logic.

The settings refuse Tansu and a non-idempotent producer with one line naming the
variable; the stored Kafka position round-trips and is used only for its own slot and
database; and the relay loop, against the fakes of ``test_relay_loop.py`` and a fake
transactional producer, produces inside Kafka transactions, commits them at
PostgreSQL transaction boundaries with the position, confirms an LSN only after its
commit, never commits after a failed send, and skips what Kafka already holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError
from pydantic import ValidationError

from connectors.cdc.lsn import Lsn
from connectors.cdc.relay import OutboxRelay
from connectors.cdc.settings import RelaySettings
from connectors.cdc.transactions import (
    KafkaPosition,
    already_in_kafka,
    resume_point,
    transactional_id,
)
from connectors.startup import render_validation_error
from streams.kernel.settings import BrokerFlavor, KafkaSettings
from tests.unit.connectors.cdc.test_relay_loop import (
    DEADLINE_S,
    SLOT_CONFIRMED,
    Event,
    FakeProducer,
    FakeSource,
    Txn,
    relation_message,
    settle,
    until,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("ZAPSTREAM_"):
            monkeypatch.delenv(name)


# --- settings -------------------------------------------------------------------------


def refusal(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as info:
        RelaySettings()
    return render_validation_error(info.value)


def test_off_by_default_and_allowed_on_apache_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RelaySettings().exactly_once is False
    monkeypatch.setenv("ZAPSTREAM_RELAY_EXACTLY_ONCE", "true")
    assert RelaySettings().exactly_once is True


def test_refused_on_tansu_with_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = refusal(
        monkeypatch, ZAPSTREAM_RELAY_EXACTLY_ONCE="true", ZAPSTREAM_KAFKA_FLAVOR="tansu"
    )
    assert len(lines) == 1
    assert "ZAPSTREAM_RELAY_EXACTLY_ONCE" in lines[0] and "Tansu" in lines[0]
    # Tansu without the option is fine.
    monkeypatch.delenv("ZAPSTREAM_RELAY_EXACTLY_ONCE")
    assert RelaySettings().kafka.flavor == "tansu"


def test_refused_without_the_idempotent_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    (line,) = refusal(
        monkeypatch,
        ZAPSTREAM_RELAY_EXACTLY_ONCE="true",
        ZAPSTREAM_KAFKA_IDEMPOTENT_PRODUCER="false",
    )
    assert "ZAPSTREAM_KAFKA_IDEMPOTENT_PRODUCER" in line


def test_interval_must_be_shorter_than_the_transaction_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (line,) = refusal(
        monkeypatch,
        ZAPSTREAM_RELAY_EXACTLY_ONCE="true",
        ZAPSTREAM_RELAY_TRANSACTION_INTERVAL_S="30",
        ZAPSTREAM_RELAY_TRANSACTION_TIMEOUT_S="10",
    )
    assert "ZAPSTREAM_RELAY_TRANSACTION_INTERVAL_S" in line


def test_consumers_read_committed_on_apache_kafka_only() -> None:
    assert KafkaSettings().consumer_isolation_level == "read_committed"
    assert KafkaSettings(flavor=BrokerFlavor.TANSU).consumer_isolation_level == "read_uncommitted"


def test_transactional_id_is_stable_per_slot_and_prefixed() -> None:
    assert transactional_id(RelaySettings()) == "zapstream-relay.zapstream_outbox"
    assert transactional_id(RelaySettings(slot="b")) == "zapstream-relay.b"
    prefixed = RelaySettings(kafka=KafkaSettings(topic_prefix="staging-"))
    assert transactional_id(prefixed) == "staging-zapstream-relay.zapstream_outbox"


# --- the stored position ---------------------------------------------------------------


def test_position_round_trips_through_offset_metadata() -> None:
    position = KafkaPosition(Lsn.parse("0/16B3748"), "zapstream_outbox", "7312345678901234567")
    assert KafkaPosition.parse(position.metadata()) == position
    assert len(position.metadata()) < 4096  # Kafka's offset.metadata.max.bytes default
    for text in (None, "", "not json", "[1]", '{"v": 2, "lsn": "0/1", "slot": "s"}', '{"v": 1}'):
        assert KafkaPosition.parse(text) is None


def test_resume_point_only_for_the_same_slot_and_database() -> None:
    lsn = Lsn.parse("0/2000")
    stored = KafkaPosition(lsn, "s", "sys-1")
    assert resume_point(None, slot="s", system_id="sys-1") is None
    assert resume_point(stored, slot="s", system_id="sys-1") == lsn
    assert resume_point(stored, slot="s", system_id=None) == lsn
    assert resume_point(stored, slot="other", system_id="sys-1") is None
    assert resume_point(stored, slot="s", system_id="sys-2") is None


def test_resume_point_not_across_a_promotion() -> None:
    """A promoted standby keeps the system id but starts a timeline whose WAL may reuse
    positions past where it stopped receiving: Kafka's position from before is not used."""
    lsn = Lsn.parse("0/2000")
    on_1 = KafkaPosition(lsn, "s", "sys-1", timeline=1)
    assert KafkaPosition.parse(on_1.metadata()) == on_1
    assert resume_point(on_1, slot="s", system_id="sys-1", timeline=1) == lsn
    assert resume_point(on_1, slot="s", system_id="sys-1", timeline=2) is None
    # A position written before the timeline was kept still counts (as before).
    unknown = KafkaPosition(lsn, "s", "sys-1")
    assert resume_point(unknown, slot="s", system_id="sys-1", timeline=2) == lsn


def test_a_transaction_is_in_kafka_when_its_commit_starts_before_the_position() -> None:
    resume = Lsn.parse("0/2030")  # the end of the last committed transaction
    assert already_in_kafka(Lsn.parse("0/2000"), resume)
    assert not already_in_kafka(resume, resume)  # the next commit record starts here
    assert not already_in_kafka(Lsn.parse("0/3000"), resume)


# --- the relay loop with a transactional producer ----------------------------------------


class FakeTransactionalProducer(FakeProducer):
    """aiokafka's transactional calls, recorded as events; sends acknowledged at once."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__(events)
        self.in_transaction = False
        self.offsets: list[str] = []
        self.starts = 0
        self.fail_sends: set[int] = set()

    async def start(self) -> None:
        self.starts += 1
        self.started, self.stopped, self.in_transaction = True, False, False
        self.events.append(("init", self.starts))

    async def begin_transaction(self) -> None:
        assert not self.in_transaction
        self.in_transaction = True
        self.events.append(("begin", None))

    async def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[None]:
        assert self.in_transaction, "a send outside a Kafka transaction"
        future = await super().send(topic, value, key, headers)
        job = self.sent[-1].job_id
        self.events.append(("send", job))
        if job in self.fail_sends:
            future.set_exception(KafkaTimeoutError())
        elif job not in self.held:
            future.set_result(None)
        return future

    async def send_offsets_to_transaction(self, offsets: dict[Any, Any], group_id: str) -> None:
        assert self.in_transaction
        ((_, (_, metadata)),) = offsets.items()
        self.offsets.append(metadata)

    async def commit_transaction(self) -> None:
        assert self.in_transaction
        assert all(s.future.done() for s in self.sent), "commit before every send was answered"
        self.in_transaction = False
        position = KafkaPosition.parse(self.offsets[-1])
        assert position is not None
        self.events.append(("commit", position.lsn))


class EosHarness:
    def __init__(self, *, stored: KafkaPosition | None = None, sources: int = 1) -> None:
        self.events: list[Event] = []
        self.producer = FakeTransactionalProducer(self.events)
        self.sources = [FakeSource(self.events) for _ in range(sources)]
        self._handed = 0
        self.stored = stored

        async def provision() -> Lsn:
            return SLOT_CONFIRMED

        async def position() -> KafkaPosition | None:
            return self.stored

        def next_source() -> FakeSource:
            source = self.sources[self._handed]
            self._handed += 1
            return source

        self.relay = OutboxRelay(
            RelaySettings(
                exactly_once=True,
                status_interval_s=0.01,
                standby_retry_s=0.01,
                reconnect_initial_s=0.01,
                drain_timeout_s=DEADLINE_S,
                transaction_interval_s=10,  # commits come from WAL running dry
            ),
            self.producer,
            source_factory=next_source,
            provision=provision,
            position_reader=position,
        )

    @property
    def source(self) -> FakeSource:
        return self.sources[0]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[None]]:
        async with self.relay:
            task = asyncio.create_task(self.relay.run())
            try:
                yield task
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


async def test_records_are_committed_in_a_transaction_before_their_lsn_is_confirmed() -> None:
    h = EosHarness()
    t1, t2 = Txn(1, rows=2), Txn(2)
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages(), *t2.messages())
        await until(lambda: ("status", t2.end_lsn) in h.events, "t2 confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    # The producer starts only once the relay holds the slot, then: begin, sends, commit
    # with the end LSN as the position, and only then the confirmation of that LSN.
    assert h.events[0] == ("init", 1)
    commit = h.events.index(("commit", t2.end_lsn))
    assert h.kinds()[1] == "begin"
    assert all(kind != "status" for kind in h.kinds()[:commit])
    assert h.events[commit + 1] == ("status", t2.end_lsn)
    assert {job for kind, job in h.events if kind == "send"} == {*t1.job_ids, *t2.job_ids}
    assert not h.producer.in_transaction


async def test_no_confirmation_past_the_last_commit_while_a_transaction_is_open() -> None:
    h = EosHarness()
    t1, t2 = Txn(1), Txn(2)
    h.producer.held = set(t2.job_ids)  # t2's record is never acknowledged
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: ("status", t1.end_lsn) in h.events, "t1 committed and confirmed")
        h.source.push(*t2.messages())
        await until(lambda: ("send", t2.job_ids[0]) in h.events, "t2 sent")
        # The commit waits for t2's acknowledgement; nothing past t1 is confirmed meanwhile.
        await settle()
        assert h.source.flushes[-1] == t1.end_lsn
        assert ("commit", t2.end_lsn) not in h.events
        h.producer.ack(*t2.job_ids)
        await until(lambda: ("status", t2.end_lsn) in h.events, "t2 committed and confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert h.events.index(("commit", t2.end_lsn)) < h.events.index(("status", t2.end_lsn))


async def test_a_failed_send_commits_nothing_and_a_new_producer_resumes() -> None:
    h = EosHarness(sources=2)
    t1, t2 = Txn(1), Txn(2)
    h.producer.fail_sends = set(t2.job_ids)  # retriable: the relay reconnects
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages())
        await until(lambda: ("status", t1.end_lsn) in h.events, "t1 committed")
        h.source.push(*t2.messages())
        await until(lambda: ("init", 2) in h.events, "a second session")
        # The second session: the slot replays t2 (from t1's end), it goes through now.
        h.producer.fail_sends = set()
        h.sources[1].push(relation_message(), *t2.messages())
        await until(lambda: ("status", t2.end_lsn) in h.events, "t2 committed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    first_session = h.events[: h.events.index(("init", 2))]
    assert ("commit", t2.end_lsn) not in first_session
    assert ("status", t2.end_lsn) not in first_session


async def test_replayed_transactions_already_in_kafka_are_skipped() -> None:
    t1, t2, t3 = Txn(1), Txn(2), Txn(3)
    # The last relay committed t1 and t2 to Kafka and died before confirming them.
    h = EosHarness(stored=KafkaPosition(t2.end_lsn, "zapstream_outbox", None))
    async with h.running() as task:
        h.source.push(relation_message(), *t1.messages(), *t2.messages(), *t3.messages())
        await until(lambda: ("status", t3.end_lsn) in h.events, "t3 committed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert [job for kind, job in h.events if kind == "send"] == t3.job_ids
    # The stored position is confirmed at once, before anything is produced.
    assert h.source.flushes[0] == t2.end_lsn
    assert h.relay.stats.skipped == 2
