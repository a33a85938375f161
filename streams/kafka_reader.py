"""Reading Kafka outside any consumer group.

Three parts of zapstream read topics on their own, beside (or without) the
worker's consumer group: the controls reader (:mod:`streams.controls`) reads
``zapstream.controls`` from its start, the dedup horizon's sink progress
(:mod:`streams.sink_progress`) reads the state sink's committed offsets and the
record before each, and the lag monitor (:mod:`streams.lag_monitor`) reads a
group's committed offsets and the first record it has not consumed. They share:

- :func:`group_less_consumer`: an ``AIOKafkaConsumer`` with no ``group_id`` and
  no auto-commit (it joins no group, commits nothing, and is assigned partitions
  by hand), and :func:`admin_client` for committed offsets.

Their timers are the runtime's (:class:`streams.kernel.runtime.periodic.Periodic`, and
:func:`streams.kernel.runtime.periodic.guarded` for a Faust timer): one periodic mechanism,
one outage log, ``zapstream_timer_errors_total`` counted there.

Kafka is imported when these are called, never at import time.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    from streams.kernel.settings import KafkaSettings

log = logging.getLogger(__name__)


def group_less_consumer(kafka: KafkaSettings, client_id: str, **config: Any) -> AIOKafkaConsumer:
    """An ``AIOKafkaConsumer`` outside any group: assigned by hand, commits nothing.

    Not started: ``await consumer.start()``. It connects as ``kafka`` says (brokers,
    TLS, SASL); ``config`` adds to (or overrides) aiokafka's options, e.g.
    ``auto_offset_reset`` or ``fetch_max_wait_ms``.
    """
    from aiokafka import AIOKafkaConsumer

    options: dict[str, Any] = {
        "group_id": None,
        "enable_auto_commit": False,
        # Never an aborted transaction's records (the relay's exactly-once); end offsets
        # are then the last stable offset, what a read_committed group can reach.
        "isolation_level": kafka.consumer_isolation_level,
        **config,
    }
    return AIOKafkaConsumer(
        client_id=client_id, **kafka.client_options(), **{**kafka.deadline_options(), **options}
    )


def admin_client(kafka: KafkaSettings, client_id: str) -> AIOKafkaAdminClient:
    """An ``AIOKafkaAdminClient`` (not started) for a group's committed offsets."""
    from aiokafka.admin import AIOKafkaAdminClient

    return AIOKafkaAdminClient(
        client_id=client_id, **kafka.client_options(), **kafka.deadline_options()
    )
