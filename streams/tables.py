"""The worker's Faust tables, co-partitioned with ``zapstream.intents``.

- ``jobs``: the latest :class:`~streams.kernel.contract.StatusChanged` of every job of
  this worker's partitions, keyed by job id. Its changelog *is* the compacted
  ``zapstream.state`` topic, so one write both updates the worker's memory and
  publishes the job's state; after a restart or rebalance the table is rebuilt
  from it. It is the dedup memory and the attempt journal. Settled jobs leave it
  after the dedup horizon (:mod:`streams.dedup_horizon`), with a tombstone on the
  changelog; a later intent for one is checked against PostgreSQL
  (:mod:`streams.kernel.job_history`). Values are encoded bytes, one per job, never objects.
- ``parked``: conversations waiting for a retry (:mod:`streams.parking`): one small
  record per conversation, keyed by conversation, and one record per waiting
  message under a key derived from it; changelog ``zapstream.parked``.

Writes go to the partition of the conversation being processed, never to one
chosen by the key's hash, which keeps both tables co-partitioned with intents.
"""

from __future__ import annotations

from typing import Any

import faust

from streams.parking import PARKED_TABLE
from streams.topics import Topics

_RAW: Any = faust.Schema(
    key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)


def register_tables(app: faust.App, topics: Topics, partitions: int) -> tuple[Any, Any]:
    jobs = app.Table(
        "jobs",
        schema=_RAW,
        key_type=bytes,
        value_type=bytes,
        partitions=partitions,
        changelog_topic=topics.state,
    )
    parked = app.Table(
        PARKED_TABLE,
        schema=_RAW,
        key_type=bytes,
        value_type=bytes,
        partitions=partitions,
        changelog_topic=topics.parked,
    )
    return jobs, parked
