"""The worker's Faust topic objects, named and shaped by :mod:`streams.kernel.contract`.

Every topic carries raw bytes: records are (de)serialised by the contract's own
codecs, so the relay (plain aiokafka) and the worker read the same bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import faust

from streams.kernel import contract

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Topics:
    names: contract.TopicNames
    """The names these topics have (under ``ZAPSTREAM_KAFKA_TOPIC_PREFIX``)."""
    intents: Any
    bulk_intents: Any
    results: Any
    state: Any
    invalid: Any
    dead: Any
    parked: Any


def register_topics(app: faust.App, partitions: int, names: contract.TopicNames) -> Topics:
    """The worker's topics, named by ``names`` (the app's ``KafkaSettings.names``)."""
    return Topics(
        names=names,
        intents=app.topic(names.intents, partitions=partitions, **_RAW),
        bulk_intents=app.topic(names.bulk_intents, partitions=partitions, **_RAW),
        results=app.topic(names.results, partitions=partitions, **_RAW),
        # The job table's changelog: compacted, co-partitioned with intents.
        state=app.topic(
            names.state,
            partitions=partitions,
            compacting=True,
            deleting=False,
            acks=False,
            internal=True,
            **_RAW,
        ),
        parked=app.topic(
            names.parked,
            partitions=partitions,
            compacting=True,
            deleting=False,
            acks=False,
            internal=True,
            **_RAW,
        ),
        invalid=app.topic(names.invalid, partitions=1, **_RAW),
        dead=app.topic(names.dead, partitions=1, **_RAW),
    )
