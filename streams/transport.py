"""Faust's aiokafka transport, with the consumer's fetch wait taken from our settings.

Faust builds its worker consumer with ``fetch_max_wait_ms=1500`` and no setting
to change it (``faust/transport/drivers/aiokafka.py``). On Apache Kafka that
costs nothing while data flows: a fetch is answered as soon as data arrives. On
Tansu a waiting fetch is not answered early, so every consuming hop waited up to
1.5 s. :class:`KafkaTransport` is Faust's transport with a consumer thread that
sets the wait from :attr:`streams.settings.KafkaSettings.consumer_fetch_max_wait_ms`
before the consumer starts (aiokafka reads it when it builds its fetcher, in
``start()``). :class:`~streams.app.WorkerApp` hands it to Faust.
"""

from __future__ import annotations

from typing import Any

import aiokafka
from faust.transport.drivers import aiokafka as faust_aiokafka


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        wait_ms = getattr(self.app, "fetch_max_wait_ms", None)
        if wait_ms is not None:
            # The constructor's argument, stored as is; start() passes it to the fetcher.
            consumer._fetch_max_wait_ms = int(wait_ms)
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class KafkaTransport(faust_aiokafka.Transport):
    """Faust's aiokafka transport whose worker consumer waits ``fetch_max_wait_ms`` at most."""

    Consumer = _Consumer
