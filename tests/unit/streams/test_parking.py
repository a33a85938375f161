"""The parking lot's layout: one small record per message, order kept, recovery after any cut.

The table's store is Faust's own in-memory store and recovery replays the
changelog into it with Faust's own ``apply_changelog_batch`` and
``on_recovery_completed``; only the changelog producer is a list.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from faust.stores.memory import Store
from faust.types import TP

from streams.kernel.contract import PARKED, IntentCaptured, conversation_partition_key
from streams.parking import ParkedConversation, ParkingLot, message_key, split_message_key

NOW = 1_764_590_400.0
Sent = tuple[bytes, bytes | None, int]


class Changelog:
    """Records what the lot sends; every send is acknowledged at once."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    async def send(self, *, key: bytes, value: bytes | None, partition: int) -> asyncio.Future[Any]:
        self.sent.append((key, value, partition))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class Table:
    """What the lot uses of a Faust table: its store and its recover callbacks."""

    def __init__(self) -> None:
        self.data = Store("memory://", app=None, table=None, table_name="parked")
        self.callbacks: list[Callable[[], Awaitable[None]]] = []

    def on_recover(self, fun: Callable[[], Awaitable[None]]) -> None:
        self.callbacks.append(fun)

    async def recover(self, records: list[Sent], active_partitions: set[int]) -> None:
        """Faust's recovery: apply the changelog, drop revoked partitions, call back."""
        events = [
            types.SimpleNamespace(
                key=key, value=value, message=types.SimpleNamespace(value=value, partition=p)
            )
            for key, value, p in records
        ]
        self.data.apply_changelog_batch(events, to_key=lambda k: k, to_value=lambda v: v)
        await self.data.on_recovery_completed({TP(PARKED, p) for p in active_partitions}, set())
        for callback in self.callbacks:
            await callback()


def new_lot() -> tuple[ParkingLot, Table, Changelog]:
    table, changelog = Table(), Changelog()
    return ParkingLot(table, changelog, now=lambda: NOW), table, changelog


async def recovered(records: list[Sent], partitions: set[int] | None = None) -> ParkingLot:
    """A new worker's lot, recovered from ``records``."""
    lot, table, _ = new_lot()
    await table.recover(records, partitions if partitions is not None else {0, 1, 2, 3})
    return lot


def intent(job_id: int, conversation: str = "alice", instance: str = "shop") -> IntentCaptured:
    return IntentCaptured(
        job_id=job_id,
        instance_id=instance,
        conversation_key=conversation,
        idempotency_key=f"run:{instance}:{conversation}:{job_id}",
        message_type="text",
        to="5511900000400",
        text=f"message {job_id} " + "x" * 200,
    )


KEY = intent(0).partition_key


def queue(lot: ParkingLot, key: bytes = KEY) -> list[int]:
    """The conversation's parked job ids, head first, read from the store."""
    parked = lot.get(key)
    if parked is None:
        return []
    return [
        IntentCaptured.loads(lot.store[message_key(key, seq)]).job_id
        for seq in range(parked.first, parked.next)
    ]


# --- layout ----------------------------------------------------------------------------------


def test_message_keys_never_look_like_a_conversation_key() -> None:
    key = message_key(KEY, 2**40 + 7)
    assert split_message_key(key) == (KEY, 2**40 + 7)
    assert split_message_key(KEY) is None
    assert split_message_key(message_key(KEY, 0)) == (KEY, 0)
    # Whatever the text of a conversation (no NUL: PostgreSQL text), its key is not a message's.
    assert split_message_key(conversation_partition_key("shop", "a" * 9)) is None


async def test_each_append_writes_one_message_and_one_small_record_whatever_the_backlog() -> None:
    lot, _, changelog = new_lot()
    await lot.park(KEY, intent(0), partition=2, due=NOW + 60)
    written: list[list[Sent]] = []
    for job_id in range(1, 3_000):
        before = len(changelog.sent)
        await lot.append(KEY, intent(job_id))
        written.append(changelog.sent[before:])
    assert all(len(records) == 2 for records in written)
    for job_id, (message, conversation) in enumerate(written, start=1):
        assert message == (message_key(KEY, job_id), intent(job_id).dumps(), 2)
        assert conversation[0] == KEY and conversation[2] == 2
    sizes = [len(c[1] or b"") for _, c in written]
    # 100 bytes, plus the schema member the contract gives every record since issue 17.
    schema = len(b',"schema":""') + len(ParkedConversation.SCHEMA)
    assert max(sizes) <= 100 + schema and max(sizes) - min(sizes) <= 4  # digits of "next"
    largest = max(len(v or b"") for _, v, _ in changelog.sent)
    assert largest == max(len(intent(j).dumps()) for j in range(3_000))
    assert lot.get(KEY) == ParkedConversation(2, NOW + 60, "shop", 0, 3_000)
    assert queue(lot) == list(range(3_000))


async def test_heads_come_out_in_order_until_the_conversation_is_gone() -> None:
    lot, table, changelog = new_lot()
    await lot.park(KEY, intent(0), partition=1, due=NOW)
    for job_id in range(1, 10):
        await lot.append(KEY, intent(job_id))
    out = []
    while (head := lot.head(KEY)) is not None:
        out.append(head.job_id)
        before = len(changelog.sent)
        more = await lot.pop(KEY, head.job_id)
        # Taking a head writes its tombstone only (and the conversation's after the last).
        assert changelog.sent[before:][0] == (message_key(KEY, head.job_id), None, 1)
        assert len(changelog.sent) - before == (1 if more else 2)
        if not more:
            break
    assert out == list(range(10))
    assert lot.get(KEY) is None and len(lot) == 0 and not lot.job_ids()
    assert len(table.data) == 0
    assert len(await recovered(changelog.sent)) == 0


async def test_postpone_rewrites_the_conversation_record_only() -> None:
    lot, _, changelog = new_lot()
    await lot.park(KEY, intent(0), partition=1, due=NOW)
    for job_id in range(1, 200):
        await lot.append(KEY, intent(job_id))
    before = len(changelog.sent)
    await lot.postpone(KEY, NOW + 300)
    assert [(k, len(v or b"")) for k, v, _ in changelog.sent[before:]] == [
        (KEY, len(ParkedConversation(1, NOW + 300, "shop", 0, 200).dumps()))
    ]
    assert (await recovered(changelog.sent)).get(KEY) == lot.get(KEY)


# --- the index ---------------------------------------------------------------------------------


async def mixed_lot() -> tuple[ParkingLot, Changelog]:
    lot, _, changelog = new_lot()
    keys = {
        c: intent(0, c, i).partition_key
        for c, i in (("alice", "shop"), ("bob", "shop"), ("carol", "bank"))
    }
    await lot.park(keys["alice"], intent(1, "alice"), partition=0, due=NOW + 10)
    await lot.park(keys["bob"], intent(2, "bob"), partition=1, due=NOW + 20)
    await lot.park(keys["carol"], intent(3, "carol", "bank"), partition=3, due=NOW + 30)
    for job_id in range(10, 20):
        await lot.append(keys["alice"], intent(job_id, "alice"))
    await lot.append(keys["carol"], intent(20, "carol", "bank"))
    for job_id in (1, 10, 11):
        await lot.pop(keys["alice"], job_id)
    await lot.postpone(keys["alice"], NOW + 99)
    assert await lot.pop(keys["bob"], 2) is False
    return lot, changelog


async def test_the_index_is_rebuilt_from_the_changelog_as_it_was() -> None:
    lot, changelog = await mixed_lot()
    assert lot.waiting("shop") == 8 and lot.waiting("bank") == 2 and lot.waiting("none") == 0
    assert sorted(lot.job_ids()) == [3, *range(12, 20), 20]
    again = await recovered(changelog.sent)
    assert sorted(again.items()) == sorted(lot.items())
    assert sorted(again.job_ids()) == sorted(lot.job_ids())
    assert (again.waiting("shop"), again.waiting("bank")) == (8, 2)
    assert again.holds(12) and not again.holds(11) and not again.holds(2)


async def test_reading_the_index_decodes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    lot, _ = await mixed_lot()

    def refuse(*args: object) -> None:
        raise AssertionError("decoded")

    for cls, name in (
        (ParkedConversation, "loads"),
        (ParkedConversation, "from_dict"),
        (IntentCaptured, "loads"),
        (IntentCaptured, "from_dict"),
    ):
        monkeypatch.setattr(cls, name, refuse)
    for _ in range(3):  # timer ticks
        assert [p.due for _, p in lot.items()] and len(lot) == 2
        assert lot.waiting("shop") == 8 and lot.holds(20) and 20 in lot.job_ids()


async def test_revoked_partitions_leave_the_store_and_the_index() -> None:
    lot, table, _ = new_lot()
    await lot.park(KEY, intent(1), partition=0, due=NOW)
    await lot.append(KEY, intent(2))
    bob = intent(3, "bob").partition_key
    await lot.park(bob, intent(3, "bob"), partition=1, due=NOW)
    await table.recover([], active_partitions={1})  # partition 0 went to another worker
    assert [k for k, _ in lot.items()] == [bob]
    assert sorted(table.data.keys()) == sorted([bob, message_key(bob, 0)])
    assert sorted(lot.job_ids()) == [3] and lot.waiting("shop") == 1


# --- recovery after a crash between two writes -----------------------------------------------


async def test_recovery_after_a_cut_at_every_write() -> None:
    """Replay every prefix of the changelog: the conversation is as before or as after the cut
    operation, never with a message lost, repeated or out of order; nothing is left behind."""
    lot, _, changelog = new_lot()
    states: list[tuple[int, list[int]]] = [(0, [])]  # (records so far, queue after)

    async def step(op: Awaitable[object]) -> None:
        await op
        states.append((len(changelog.sent), queue(lot)))

    await step(lot.park(KEY, intent(0), partition=2, due=NOW + 5))
    for job_id in (1, 2, 3):
        await step(lot.append(KEY, intent(job_id)))
    await step(lot.pop(KEY, 0))
    await step(lot.postpone(KEY, NOW + 50))
    await step(lot.append(KEY, intent(4)))
    for job_id in (1, 2, 3, 4):
        await step(lot.pop(KEY, job_id))
    await step(lot.park(KEY, intent(5), partition=2, due=NOW + 7))
    await step(lot.append(KEY, intent(6)))
    assert states[-1][1] == [5, 6]

    for cut in range(len(changelog.sent) + 1):
        again = await recovered(changelog.sent[:cut])
        done = max(i for i, (n, _) in enumerate(states) if n <= cut)
        before = states[done][1]
        after = states[done + 1][1] if done + 1 < len(states) else before
        got = queue(again)
        # Cut inside an operation: an interrupted park or append is adopted (its intent
        # event was not acknowledged, comes again and is found held), and an interrupted
        # last pop leaves an empty conversation.
        inside = states[done][0] < cut
        assert got == (after if inside else before), (cut, got, before, after)
        # Everything in the store belongs to the conversation's range.
        parked = again.get(KEY)
        owned = {message_key(KEY, s) for s in range(parked.first, parked.next)} if parked else set()
        assert set(again.store.keys()) - {KEY} == owned
        assert sorted(again.job_ids()) == sorted(got)
        if parked is not None and not got:
            # An empty conversation (cut before the last tombstone): the timer unparks it.
            assert parked.messages == 0


async def test_an_interrupted_park_is_adopted_due_at_once_on_its_partition() -> None:
    lot, _, changelog = new_lot()
    await lot.park(KEY, intent(7), partition=3, due=NOW + 3_600)
    again = await recovered(changelog.sent[:1])  # the message, not the conversation record
    assert again.get(KEY) == ParkedConversation(3, NOW, "shop", 0, 1)
    assert again.holds(7)
    head = again.head(KEY)
    assert head is not None and head.job_id == 7


async def test_an_interrupted_append_is_adopted_and_held() -> None:
    lot, _, changelog = new_lot()
    await lot.park(KEY, intent(1), partition=0, due=NOW + 60)
    await lot.append(KEY, intent(2))
    again = await recovered(changelog.sent[:-1])  # the message, not the conversation record
    assert queue(again) == [1, 2] and again.holds(2)
    assert again.get(KEY) == ParkedConversation(0, NOW + 60, "shop", 0, 2)
    # The next append goes after it.
    await again.append(KEY, intent(3))
    assert queue(again) == [1, 2, 3]


async def test_a_stray_message_record_is_dropped_with_a_tombstone() -> None:
    lot, _, changelog = new_lot()
    await lot.park(KEY, intent(1), partition=0, due=NOW)
    stray = (message_key(KEY, 9), intent(9).dumps(), 0)
    new, table, new_changelog = new_lot()
    await table.recover([*changelog.sent, stray], {0})
    assert queue(new) == [1] and not new.holds(9)
    assert message_key(KEY, 9) not in table.data
    assert new_changelog.sent == [(message_key(KEY, 9), None, 0)]


def _old_layout(partition: int, due: float, intents: list[IntentCaptured]) -> bytes:
    """A conversation as the worker stored it before issue 8: one value, a growing list."""
    return orjson.dumps(
        {
            "partition": partition,
            "due": due,
            "head": intents[0].to_dict(),
            "waiting": [i.to_dict() for i in intents[1:]],
        }
    )


async def test_a_conversation_in_the_old_layout_is_rewritten_in_the_new_one() -> None:
    old = [(KEY, _old_layout(1, NOW + 30, [intent(n) for n in range(5)]), 1)]
    lot, table, changelog = new_lot()
    await table.recover(old, {1})
    assert lot.get(KEY) == ParkedConversation(1, NOW + 30, "shop", 0, 5)
    assert queue(lot) == [0, 1, 2, 3, 4] and lot.waiting("shop") == 5 and lot.holds(4)
    # Owed to the changelog: the messages, then the conversation record that replaces the value.
    assert [k for k, _, _ in changelog.sent] == [*(message_key(KEY, n) for n in range(5)), KEY]
    assert max(len(v or b"") for _, v, _ in changelog.sent) < len(old[0][1])
    assert (await recovered(old + changelog.sent)).items() == lot.items()
    # Cut short after three messages: the next recovery does it again from the old value.
    again, table, resent = new_lot()
    await table.recover(old + changelog.sent[:3], {1})
    assert queue(again) == [0, 1, 2, 3, 4] and [k for k, _, _ in resent.sent][-1] == KEY
