"""One Apache Kafka broker for every pipeline of a process, each pipeline in its own namespace.

A KRaft node takes 5-10 s and most of a core to start; the test suite starts a pipeline
per module. With sharing on (:func:`share_one_broker`, which the integration tests'
``conftest.py`` turns on), every :class:`~devtools.stack.local_pipeline.LocalPipeline` of the
process that needs a plain single Kafka node (not proxied, not TLS, not 3 nodes, not asked
for its own) uses this one broker under a topic prefix of its own
(``ZAPSTREAM_KAFKA_TOPIC_PREFIX``: every topic, consumer group and Faust app id named from
it), and deletes its topics when it stops. Isolation is by namespace, as two deployments
sharing a production cluster are; a test that kills or restarts the broker asks for its own.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging

from devtools.stack.kafka_broker import KafkaBroker

log = logging.getLogger(__name__)

_enabled = False
_broker: SharedKafkaBroker | None = None
_prefixes = itertools.count(1)


class SharedKafkaBroker(KafkaBroker):
    """The shared node: killing, restarting or stopping it from a pipeline would break every
    other pipeline of the process, so those refuse, naming what to ask for instead."""

    def start(self) -> None:
        super().start()
        atexit.unregister(self.stop)
        atexit.register(self.stop_for_good)

    def kill(self, sig: int = 9) -> None:
        raise RuntimeError(_REFUSED)

    def terminate(self) -> None:
        raise RuntimeError(_REFUSED)

    def restart(self) -> None:
        raise RuntimeError(_REFUSED)

    def stop(self) -> None:
        raise RuntimeError(_REFUSED)

    def stop_for_good(self) -> None:
        atexit.unregister(self.stop_for_good)
        KafkaBroker.stop(self)


_REFUSED = (
    "this pipeline shares the process's Kafka broker (devtools.stack.shared_broker); a test that "
    "kills, restarts or stops its broker needs its own: LocalPipeline(..., own_broker=True)"
)


def share_one_broker(enabled: bool = True) -> None:
    """Turn sharing on (or off) for the pipelines this process creates from now on."""
    global _enabled
    _enabled = enabled


def sharing() -> bool:
    return _enabled


def shared_broker() -> SharedKafkaBroker:
    """The process's broker, started on first use."""
    global _broker
    if _broker is None:
        broker = SharedKafkaBroker()
        broker.start()
        _broker = broker
    return _broker


def next_prefix() -> str:
    """A topic prefix no other pipeline of this process has used."""
    return f"p{next(_prefixes)}-"


def stop_shared_broker() -> None:
    global _broker
    if _broker is not None:
        _broker.stop_for_good()
        _broker = None


def delete_namespace(bootstrap: str, prefix: str) -> None:
    """Delete every topic whose name starts with ``prefix`` (best effort: the broker is
    throwaway; this keeps it small over a whole test session)."""
    asyncio.run(_delete_namespace(bootstrap, prefix))


async def _delete_namespace(bootstrap: str, prefix: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    try:
        await admin.start()
        names = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if names:
            await admin.delete_topics(names, timeout_ms=15_000)
    except Exception as exc:  # noqa: BLE001 - cleanup of a throwaway broker; say it, go on
        log.warning("could not delete the topics of namespace %s: %s", prefix, exc)
    finally:
        await admin.close()
