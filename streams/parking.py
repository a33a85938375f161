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
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from streams.contract import IntentCaptured

PARKED_TABLE = "parked"


@dataclasses.dataclass(frozen=True, slots=True)
class ParkedConversation:
    """A conversation whose head waits for a retry, and the messages queued behind it."""

    partition: int
    due: float
    """When the head is due again (epoch seconds)."""
    head: IntentCaptured
    waiting: tuple[IntentCaptured, ...] = ()

    def dumps(self) -> bytes:
        return orjson.dumps(
            {
                "partition": self.partition,
                "due": self.due,
                "head": self.head.to_dict(),
                "waiting": [i.to_dict() for i in self.waiting],
            }
        )

    @classmethod
    def loads(cls, raw: bytes) -> ParkedConversation:
        data: dict[str, Any] = orjson.loads(raw)
        return cls(
            partition=int(data["partition"]),
            due=float(data["due"]),
            head=IntentCaptured.from_dict(data["head"]),
            waiting=tuple(IntentCaptured.from_dict(i) for i in data["waiting"]),
        )

    def behind(self, intent: IntentCaptured) -> ParkedConversation:
        """The same conversation with ``intent`` queued at the end."""
        return dataclasses.replace(self, waiting=(*self.waiting, intent))

    def holds(self, job_id: int) -> bool:
        return self.head.job_id == job_id or any(i.job_id == job_id for i in self.waiting)
