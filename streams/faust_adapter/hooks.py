"""Small accessors for Faust internals the worker needs outside the consumer.

Each one names the private attribute it reads and the versions it was checked
against (:data:`CHECKED_AGAINST`); ``tests/unit/streams/faust_adapter/test_hooks.py``
asserts the attribute still exists with the shape used here, and fails first when
an upgrade moves it. When a version changes, re-check every hook of this package
(``grep -rn "checked against" streams/faust_adapter``) and update this table.
"""

from __future__ import annotations

from typing import Any

import aiokafka

CHECKED_AGAINST = {
    "faust-streaming": "0.15.3",
    "mode-streaming": "0.7.1",
    "aiokafka": "0.14.0",
}
"""The versions every private hook of :mod:`streams.faust_adapter` was read against."""


def crash(app: Any, exc: BaseException) -> None:
    """Crash the Faust app from synchronous code (a lane's callback): the worker stops
    and the supervisor restarts it.

    mode's public ``Service.crash`` is a coroutine; its synchronous core ``_crash``
    (sets ``crashed`` and ``crash_reason`` on the app and its children) is what a
    callback outside a task can call (checked against mode-streaming 0.7.1).
    """
    app._crash(exc)


def kafka_producer(app: Any) -> aiokafka.AIOKafkaProducer:
    """The aiokafka producer under Faust's producer service (the one Faust configured:
    acks, batching), for sends that skip Faust's ``FutureMessage`` layers.

    ``Producer._ensure_producer`` raises ``NotReady`` before the service started
    (checked against faust-streaming 0.15.3, ``faust/transport/drivers/aiokafka.py``).
    """
    producer: aiokafka.AIOKafkaProducer = app.producer._ensure_producer()
    return producer


def key_partitions(store: Any) -> dict[bytes, int] | None:
    """The partition of each key of a table's memory store, as Faust recorded them for
    recovered keys (None: a store that keeps none, e.g. a test's dict).

    Faust's memory store keeps ``_key_partition`` to drop the keys of partitions no
    longer active after a recovery (``Store.on_recovery_completed``); a key written to the
    store directly (not through the table, see :mod:`streams.parking`) must be entered
    there too or it outlives its partition (checked against faust-streaming 0.15.3,
    ``faust/stores/memory.py``).
    """
    found: dict[bytes, int] | None = getattr(store, "_key_partition", None)
    return found


def monitor_metrics(app: Any) -> Any:
    """The ``FaustMetrics`` collectors of the app's ``PrometheusMonitor``: Faust exposes
    them only as ``monitor._metrics`` (checked against faust-streaming 0.15.3,
    ``faust/sensors/prometheus.py``)."""
    return app.monitor._metrics
