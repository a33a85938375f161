"""Builds the ``faust.App`` of the worker, and nothing else.

Topics, tables and agents register against the app from their own modules
(:mod:`streams.topics`, :mod:`streams.tables`, :mod:`streams.agents`), wired by
:func:`streams.worker.build_worker_app`. Nothing here runs at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import faust

from streams.faust_adapter.app import AdaptedApp
from streams.kernel.settings import KafkaSettings
from streams.worker_settings import WorkerSettings


class Resource(Protocol):
    """A long-lived thing the worker owns: gateway client, state sink."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class WorkerApp(AdaptedApp):
    """A Faust app that starts its resources before its agents and stops them after."""

    def __init__(
        self,
        *args: Any,
        resources: Sequence[Resource] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.resources = list(resources)
        self.after_streams_stopped: list[Any] = []
        """Hooks run once Faust stopped the flow and waited for every event to be acked."""

    async def on_start(self) -> None:
        for resource in self.resources:
            await resource.start()
        await super().on_start()

    async def on_stop(self) -> None:
        # Faust's on_stop stops the flow, pauses partitions and waits until every
        # event handed to a stream is acknowledged (stream_wait_empty): in-flight
        # sends finish with the gateway client still open.
        await super().on_stop()
        for hook in self.after_streams_stopped:
            await hook()
        for resource in reversed(self.resources):
            await resource.stop()


STREAM_BUFFER_MAXSIZE = 4096
"""Faust's default. The worker stops fetching a topic once its agent's queue holds 80% of it
(3,276 events) and fetches again at 40%: a bulk backlog costs a few thousand events of memory,
and filling the queue takes a fraction of a second. With 20,000 the first fill (16,000 bulk
events decoded) held the first operational messages up to 4.5 s in 3 of 6 runs."""


def broker_credentials(kafka: KafkaSettings) -> faust.types.auth.CredentialsT | None:
    """``kafka``'s TLS and SASL as Faust's ``broker_credentials``.

    Faust's aiokafka transport turns them into the same ``security_protocol``,
    ``ssl_context`` and ``sasl_*`` options :meth:`KafkaSettings.security_options`
    gives our own clients, for its worker consumer, its client consumer and its
    producer (whose client also creates the topics): one mapping, every client.
    """
    protocol = kafka.security_protocol
    context = kafka.ssl_context() if protocol.uses_tls else None
    if protocol.uses_sasl:
        # With a context Faust says SASL_SSL, without one SASL_PLAINTEXT.
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password.get_secret_value(),
            ssl_context=context,
            mechanism=kafka.mechanism.value,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def build_app(settings: WorkerSettings, resources: Sequence[Resource] = ()) -> WorkerApp:
    kafka = settings.kafka
    extra: dict[str, Any] = {}
    if kafka.one_record_per_batch:
        # Tansu's ListOffsets is wrong after multi-record batches and Faust's table
        # recovery reads up to it; one record per produce request keeps it exact.
        extra["producer_max_batch_size"] = 1
        extra["producer_linger"] = 0.0
    return WorkerApp(
        # The prefixed app id: the worker's consumer group, and the start of Faust's own topics.
        settings.group_id,
        resources=resources,
        fetch_max_wait_ms=kafka.consumer_fetch_max_wait_ms,
        isolation_level=kafka.consumer_isolation_level,
        broker=[f"kafka://{server}" for server in kafka.bootstrap_servers],
        broker_credentials=broker_credentials(kafka),
        autodiscover=False,
        datadir=settings.data_dir,
        store="memory://",
        processing_guarantee="at_least_once",
        topic_partitions=kafka.partitions,
        topic_replication_factor=kafka.replication_factor,
        topic_allow_declare=True,
        broker_session_timeout=kafka.session_timeout_s,
        broker_heartbeat_interval=kafka.heartbeat_interval_s,
        # A broker silent without closing: every consumer request (fetch, heartbeat, commit)
        # gives up after this and aiokafka reconnects. The producer keeps Faust's own
        # producer_request_timeout: aiokafka expires unsent batches after it too.
        broker_request_timeout=kafka.request_timeout_s,
        consumer_metadata_max_age_ms=round(kafka.metadata_max_age_s * 1000),
        consumer_connections_max_idle_ms=round(kafka.connections_max_idle_s * 1000),
        producer_metadata_max_age_ms=round(kafka.metadata_max_age_s * 1000),
        producer_connections_max_idle_ms=round(kafka.connections_max_idle_s * 1000),
        broker_commit_interval=settings.commit_interval_s,
        consumer_auto_offset_reset="earliest",
        # Faust's conductor hands each fetched record to its agent's queue and, when that
        # queue is full, waits for room with every other topic's records behind it: a bulk
        # backlog whose agent waits for tokens would hold operational intents back. Here a
        # queue is never full (streams/faust_adapter/transport.py: AgentQueue); the worker
        # stops fetching a topic, every partition of it, once its queue passes 80% of this.
        stream_buffer_maxsize=STREAM_BUFFER_MAXSIZE,
        producer_acks=-1,
        table_standby_replicas=0,
        stream_ack_exceptions=False,
        stream_ack_cancelled_tasks=False,
        web_port=settings.web_port,
        web_bind="127.0.0.1" if settings.web_bind_local else "0.0.0.0",
        # Faust's /table/ (every table's keys and values: recipients) and /router/ pages are
        # on by default in faust-streaming 0.15.3; the worker's port serves only our paths.
        web_tables_enabled=False,
        web_router_enabled=False,
        **extra,
    )
