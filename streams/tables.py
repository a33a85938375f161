"""The worker's Faust tables.

``jobs``: the latest :class:`~streams.contract.StatusChanged` of every job this
worker's partitions have seen, keyed by job id. Its changelog *is* the compacted
``zapstream.state`` topic, so one table write both updates the worker's memory
and publishes the job's state; after a restart or rebalance the table is
rebuilt from it. It is the dedup memory: an intent whose job is already settled
(sent, failed, expired, ...) is not sent again.

Writes carry the partition of the intent being processed (Faust takes it from
the current event), so the table stays co-partitioned with ``zapstream.intents``.
"""

from __future__ import annotations

from typing import Any

import faust

from streams.topics import Topics


def register_tables(app: faust.App, topics: Topics, partitions: int) -> Any:
    return app.Table(
        "jobs",
        schema=faust.Schema(
            key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        ),
        key_type=bytes,
        value_type=bytes,
        partitions=partitions,
        changelog_topic=topics.state,
    )
