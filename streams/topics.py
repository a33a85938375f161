"""The worker's Faust topic objects, named and shaped by :mod:`streams.contract`.

Every topic carries raw bytes: records are (de)serialised by the contract's own
codecs, so the relay (plain aiokafka) and the worker read the same bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import faust

from streams import contract

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Topics:
    intents: Any
    bulk_intents: Any
    results: Any
    state: Any
    invalid: Any
    dead: Any
    parked: Any


def register_topics(app: faust.App, partitions: int) -> Topics:
    return Topics(
        intents=app.topic(contract.INTENTS, partitions=partitions, **_RAW),
        bulk_intents=app.topic(contract.BULK_INTENTS, partitions=partitions, **_RAW),
        results=app.topic(contract.RESULTS, partitions=partitions, **_RAW),
        # The job table's changelog: compacted, co-partitioned with intents.
        state=app.topic(
            contract.STATE,
            partitions=partitions,
            compacting=True,
            deleting=False,
            acks=False,
            internal=True,
            **_RAW,
        ),
        parked=app.topic(
            contract.PARKED,
            partitions=partitions,
            compacting=True,
            deleting=False,
            acks=False,
            internal=True,
            **_RAW,
        ),
        invalid=app.topic(contract.INVALID, partitions=1, **_RAW),
        dead=app.topic(contract.DEAD, partitions=1, **_RAW),
    )
