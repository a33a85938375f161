"""Parked conversations: durable waiting without head-of-line blocking.

When a conversation's head message fails transiently, the conversation is
*parked*: the head and every later message of that conversation wait in the
``parked`` table (changelogged, co-partitioned with intents) until the head is
due again. Their intent events are acknowledged, so the committed offset of
``zapstream.intents`` keeps moving and the other conversations of the
partition flow on. A timer re-submits due heads to their conversation lane;
when the head is settled the waiting messages go out in order, and the first
one that fails transiently becomes the new head.

After a crash or rebalance the table is rebuilt from its changelog, so parked
conversations survive, and the timer on the new owner picks them up.

Layout of the table (every record goes to its conversation's partition)
------------------------------------------------------------------------

A backlog is never one growing value: each message is a record of its own, so
an append writes two small records whatever the backlog's length, and no
record is larger than one intent plus a few bytes.

- key ``<conversation key>``: the *conversation record*
  (:class:`~streams.kernel.contract.ParkedConversation`), constant size::

      {"partition":3,"due":1764590400.5,"instance":"shop","first":0,"next":2,
       "schema":"zapstream.parked.v1"}

  its messages are the sequence numbers ``first`` to ``next - 1``, in order;
  the one at ``first`` is the head.
- key ``<conversation key> 0x00 <seq, 8 bytes big-endian>``: one *message
  record*, the intent's own JSON (:meth:`~streams.kernel.contract.IntentCaptured.dumps`).

Conversation keys are ``instance 0x1f conversation``, built from PostgreSQL
text, which cannot hold a NUL byte; so a key with a NUL 9 bytes from its end is
a message record, and no conversation key is one.

Writes, and what recovery makes of a crash between two of them
---------------------------------------------------------------

Every write waits for Kafka's acknowledgement before the next is sent, so the
changelog holds a prefix of each sequence below; the intent event that caused
a write is acknowledged only after its last write.

- *Park* (a new conversation): message ``0``, then the conversation record.
  Cut after the message: recovery finds messages without a conversation record
  and adopts them, due at once (the head's retry comes early, once).
- *Append*: message ``next``, then the conversation record with ``next + 1``.
  Cut after the message: recovery finds a message at ``next`` and adopts it.
  It is the newest message of the conversation (a lane appends one at a time),
  and its intent event was not acknowledged: redelivered, it is found held.
- *Take the head* after it was settled: a tombstone for its message only; the
  conversation record is rewritten only when a head parks again (its new
  ``due``, its ``first``). Recovery skips tombstoned messages at the front.
  Cut before the tombstone: the settled head runs again and the jobs table
  recognises it (a parked job is never forgotten by the dedup horizon).
- *Unpark*: the last message's tombstone, then the conversation's. Cut between:
  an empty conversation, which the timer unparks at once.

Nothing else can be found; a message record outside its conversation's range
would be a bug, and recovery drops it with a tombstone.

Upgrading: a conversation stored in the layout before issue 8 (one value with
the head and a ``waiting`` list) is rewritten in this one when recovery finds it.

Memory
------

:class:`ParkingLot` keeps an index of the conversation records (decoded), the
parked job ids and the count per instance, so the retry timer, the pause log
lines and the dedup horizon never decode the table. It is rebuilt from the
table after each recovery (Faust calls the table's recover callbacks once
recovered keys are in and revoked partitions' keys are out), the only time the
table changes other than through the lot. The lot records the partition of each
key it writes where Faust's memory store keeps those of recovered keys, so the
store drops them too when their partition goes to another worker.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import orjson

from streams.faust_adapter.hooks import key_partitions
from streams.kernel.contract import IntentCaptured, ParkedConversation
from streams.stores import compact

log = logging.getLogger(__name__)

PARKED_TABLE = "parked"

_SEP = b"\x00"


BULK_SUFFIX = _SEP + b"bulk"
"""Appended to a conversation's key for its bulk messages, which park apart from its
operational ones (they come from another topic and run in other lanes). The NUL keeps it
from ever meeting a text key, and from looking like a message key (NUL 9 bytes from the end)."""


def parking_key(partition_key: bytes, priority: str) -> bytes:
    """The parked table's key of a conversation's messages of ``priority``."""
    return partition_key + BULK_SUFFIX if priority == "bulk" else partition_key


def message_key(conversation: bytes, seq: int) -> bytes:
    """The key of message ``seq`` of ``conversation``: ``conversation 0x00 seq(8 bytes BE)``."""
    return conversation + _SEP + seq.to_bytes(8, "big")


def split_message_key(key: bytes) -> tuple[bytes, int] | None:
    """(conversation key, seq) of a message record's key; None for a conversation record."""
    if len(key) < 10 or key[-9:-8] != _SEP:
        return None
    return key[:-9], int.from_bytes(key[-8:], "big")


class ParkingLot:
    """The ``parked`` table (layout above); every write waits for Kafka's acknowledgement.

    Like :class:`~streams.stores.FaustJobStore` it updates the table's local store
    first and sends the changelog records itself, to the conversation's partition.
    Each conversation is changed by its own lane only, one operation at a time.
    """

    def __init__(self, table: Any, changelog: Any, *, now: Callable[[], float] = time.time) -> None:
        self.table = table
        self.changelog = changelog
        self.now = now
        self._index: dict[bytes, ParkedConversation] = {}
        self._jobs: collections.Counter[int] = collections.Counter()
        self._per_instance: collections.Counter[str] = collections.Counter()
        self._built = False
        table.on_recover(self.on_recovered)

    @property
    def store(self) -> Any:
        """The table's store: a mapping of key -> encoded record."""
        return self.table.data

    # --- reads (the index) ---------------------------------------------------------------

    def __len__(self) -> int:
        """Conversations parked."""
        return len(self._conversations())

    def get(self, key: bytes) -> ParkedConversation | None:
        return self._conversations().get(key)

    def items(self) -> list[tuple[bytes, ParkedConversation]]:
        """A snapshot of the parked conversations."""
        return list(self._conversations().items())

    def holds(self, job_id: int) -> bool:
        """The job is parked (as a head or behind one)."""
        self._conversations()
        return job_id in self._jobs

    def job_ids(self) -> Collection[int]:
        """Every parked job (a live view: copy it to keep it)."""
        self._conversations()
        return self._jobs.keys()

    def waiting(self, instance: str) -> int:
        """Jobs of ``instance`` parked here, heads included."""
        self._conversations()
        return self._per_instance[instance]

    def head(self, key: bytes) -> IntentCaptured | None:
        """The head message of a parked conversation (None: not parked, or empty)."""
        parked = self.get(key)
        while parked is not None and parked.messages:
            raw = self.store.get(message_key(key, parked.first))
            if raw is not None:
                return IntentCaptured.loads(raw)
            # Cannot happen (the range is dense after a rebuild and the lot keeps it so);
            # skipping the hole keeps the rest of the conversation going.
            log.error("parking: message %d of a parked conversation is missing", parked.first)
            parked = dataclasses.replace(parked, first=parked.first + 1)
            self._set(key, parked)
        return None

    # --- writes -------------------------------------------------------------------------

    async def park(self, key: bytes, intent: IntentCaptured, *, partition: int, due: float) -> None:
        """Park a conversation that is not parked, ``intent`` as its head."""
        if self.get(key) is not None:
            raise RuntimeError("conversation is parked already: append instead")
        parked = ParkedConversation(partition, due, intent.instance_id, 0, 1)
        await self._write_message(key, parked, 0, intent)

    async def append(self, key: bytes, intent: IntentCaptured) -> None:
        """Queue ``intent`` behind the messages of a parked conversation."""
        parked = self._require(key)
        grown = dataclasses.replace(parked, next=parked.next + 1)
        await self._write_message(key, grown, parked.next, intent)

    async def postpone(self, key: bytes, due: float) -> None:
        """The head failed again: it is due at ``due``."""
        parked = dataclasses.replace(self._require(key), due=due)
        value = self._put(key, parked)
        await self._send(key, value, parked.partition)

    async def pop(self, key: bytes, job_id: int) -> bool:
        """The head (job ``job_id``) is settled: drop it. False when nothing is left (unparked)."""
        parked = self._require(key)
        if parked.messages == 0:
            raise RuntimeError("an empty conversation has no head to pop")
        head = message_key(key, parked.first)
        self._delete(head)
        self._count_job(job_id, -1)
        left = dataclasses.replace(parked, first=parked.first + 1)
        if left.messages:
            self._set(key, left)
            await self._send(head, None, parked.partition)
            return True
        self._delete(key)
        self._set(key, None)
        await self._send(head, None, parked.partition)
        # Tombstones: recovery deletes the keys, compaction drops them.
        await self._send(key, None, parked.partition)
        return False

    async def unpark(self, key: bytes) -> None:
        """Forget an empty conversation (what a crash during the last pop leaves)."""
        parked = self._require(key)
        if parked.messages:
            raise RuntimeError("only an empty conversation is unparked; pop its messages")
        self._delete(key)
        self._set(key, None)
        await self._send(key, None, parked.partition)

    async def _write_message(
        self, key: bytes, parked: ParkedConversation, seq: int, intent: IntentCaptured
    ) -> None:
        mkey, message = message_key(key, seq), compact(intent.dumps())
        self._store_put(mkey, message, parked.partition)
        value = self._put(key, parked)
        self._count_job(intent.job_id, +1)
        # The message first: a conversation record never names a message Kafka lacks.
        await self._send(mkey, message, parked.partition)
        await self._send(key, value, parked.partition)

    # --- recovery ------------------------------------------------------------------------

    async def on_recovered(self) -> None:
        """Faust recovered the table: rebuild the index, then send what the rebuild owes Kafka."""
        for key, value, partition in self.rebuild():
            await self._send(key, value, partition)

    def rebuild(self) -> list[tuple[bytes, bytes | None, int]]:
        """Rebuild the index from the table; returns the records owed to the changelog.

        Decodes every conversation record and message once. Adopts what a crash
        between two writes left (see the module docstring); removes stray message
        records from the store (owed: their tombstones); rewrites conversations
        stored in the layout before issue 8 (one value holding the head and a
        ``waiting`` list) as message records and a conversation record (owed: those
        records, messages first).
        """
        conversations: dict[bytes, ParkedConversation] = {}
        messages: dict[bytes, dict[int, bytes]] = collections.defaultdict(dict)
        legacy: dict[bytes, dict[str, Any]] = {}
        for key, raw in list(self.store.items()):
            split = split_message_key(key)
            if split is not None:
                messages[split[0]][split[1]] = raw
                continue
            data: dict[str, Any] = orjson.loads(raw)
            if "waiting" in data:
                legacy[key] = data
            else:
                conversations[key] = ParkedConversation.from_dict(data)
        owed: list[tuple[bytes, bytes | None, int]] = []
        for key, data in legacy.items():
            conversations[key] = self._migrate(key, data, messages[key], owed)
        index: dict[bytes, ParkedConversation] = {}
        jobs: collections.Counter[int] = collections.Counter()
        per_instance: collections.Counter[str] = collections.Counter()
        stray: list[tuple[bytes, bytes | None, int]] = []
        adopted = 0
        for key in conversations.keys() | messages.keys():
            seqs = messages.get(key, {})
            parked = conversations.get(key)
            if parked is None:
                # A park cut after its first message: adopt it, due at once.
                first = min(seqs)
                head = IntentCaptured.loads(seqs[first])
                partition = self._partition_of(message_key(key, first))
                parked = ParkedConversation(partition, self.now(), head.instance_id, first, first)
                adopted += 1
            end = parked.next
            while end in seqs:  # an append cut after its message: adopt it
                end += 1
            adopted += end - parked.next
            live = sorted(s for s in seqs if parked.first <= s < end)
            for seq in seqs.keys() - set(live):
                stray.append((message_key(key, seq), None, parked.partition))
            first = live[0] if live else end
            if len(live) != end - first:
                log.error("parking: a parked conversation's messages have gaps; skipping them")
            parked = dataclasses.replace(parked, first=first, next=end)
            index[key] = parked
            per_instance[parked.instance] += parked.messages
            for seq in live:
                jobs[IntentCaptured.loads(seqs[seq]).job_id] += 1
        for key, _, _ in stray:
            self._delete(key)
        self._index, self._jobs, self._per_instance = index, jobs, per_instance
        self._built = True
        if index or stray:
            log.info(
                "parking: %d conversations with %d messages parked after recovery "
                "(%d messages adopted from interrupted writes, %d stray records dropped, "
                "%d conversations rewritten from the old layout)",
                len(index),
                sum(jobs.values()),
                adopted,
                len(stray),
                len(legacy),
            )
        return owed + stray

    def _migrate(
        self,
        key: bytes,
        data: dict[str, Any],
        messages: dict[int, bytes],
        owed: list[tuple[bytes, bytes | None, int]],
    ) -> ParkedConversation:
        """A conversation in the old layout, rewritten in the store as records of the new one.

        Its conversation record is written last, so a migration cut short is done
        again from the old value at the next recovery (rewriting the same messages).
        """
        intents = [IntentCaptured.from_dict(i) for i in (data["head"], *data["waiting"])]
        parked = ParkedConversation(
            int(data["partition"]), float(data["due"]), intents[0].instance_id, 0, len(intents)
        )
        for seq, intent in enumerate(intents):
            raw = compact(intent.dumps())
            messages[seq] = raw
            self._store_put(message_key(key, seq), raw, parked.partition)
            owed.append((message_key(key, seq), raw, parked.partition))
        value = compact(parked.dumps())
        self._store_put(key, value, parked.partition)
        owed.append((key, value, parked.partition))
        return parked

    # --- the store, the index, the changelog ---------------------------------------------------

    def _conversations(self) -> dict[bytes, ParkedConversation]:
        if not self._built:
            self.rebuild()
        return self._index

    def _require(self, key: bytes) -> ParkedConversation:
        parked = self.get(key)
        if parked is None:
            raise RuntimeError("conversation is not parked")
        return parked

    def _put(self, key: bytes, parked: ParkedConversation) -> bytes:
        value = compact(parked.dumps())
        self._store_put(key, value, parked.partition)
        self._set(key, parked)
        return value

    def _set(self, key: bytes, parked: ParkedConversation | None) -> None:
        old = self._index.pop(key, None)
        if old is not None:
            self._per_instance[old.instance] -= old.messages
            if self._per_instance[old.instance] <= 0:
                del self._per_instance[old.instance]
        if parked is not None:
            self._index[key] = parked
            self._per_instance[parked.instance] += parked.messages

    def _count_job(self, job_id: int, delta: int) -> None:
        self._jobs[job_id] += delta
        if self._jobs[job_id] <= 0:
            del self._jobs[job_id]

    def _store_put(self, key: bytes, value: bytes, partition: int) -> None:
        self.store[key] = value
        # Where Faust's memory store keeps recovered keys' partitions: so it drops our
        # keys too when their partition is revoked.
        recovered = key_partitions(self.store)
        if recovered is not None:
            recovered[key] = partition

    def _delete(self, key: bytes) -> None:
        self.store.pop(key, None)
        recovered = key_partitions(self.store)
        if recovered is not None:
            recovered.pop(key, None)

    def _partition_of(self, key: bytes) -> int:
        recovered = key_partitions(self.store) or {}
        if key not in recovered:
            raise RuntimeError("a parked record's partition is unknown to the table's store")
        return recovered[key]

    async def _send(self, key: bytes, value: bytes | None, partition: int) -> None:
        await (await self.changelog.send(key=key, value=value, partition=partition))
