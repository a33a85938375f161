"""Settings of ``zapstream relay`` (``ZAPSTREAM_RELAY_*``), read once in ``main()``."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from streams.kernel.settings import BrokerFlavor, KafkaSettings, PostgresSettings, SettingsBase


class RelaySettings(SettingsBase):
    """``zapstream relay`` (``ZAPSTREAM_RELAY_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_RELAY_", extra="ignore")

    slot: str = "zapstream_outbox"
    """The logical replication slot the relay reads the outbox from."""
    publication: str = "zapstream_outbox"
    """The publication (the outbox tables) the slot's pgoutput streams."""
    status_interval_s: float = Field(default=1.0, gt=0)
    """The longest gap between two reports of the confirmed LSN to PostgreSQL (only what Kafka
    acknowledged is ever confirmed); once the WAL has been quiet for a tenth of it, what was
    acknowledged is confirmed at once."""
    standby_retry_s: float = Field(default=2.0, gt=0)
    """How often a standby relay retries to take the slot."""
    drain_timeout_s: float = Field(default=30.0, gt=0)
    """On SIGTERM, how long records in flight may take to be acknowledged and confirmed."""
    max_in_flight: int = Field(default=20_000, ge=1)
    """Records sent to Kafka and not yet acknowledged before the relay stops reading WAL."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Serve Prometheus ``/metrics`` on this port (see :mod:`connectors.cdc.metrics`); 0: off."""
    slot_metrics_interval_s: float = Field(default=10.0, gt=0)
    """How often the slot's lag and retained WAL are read from PostgreSQL for ``/metrics``."""
    slot_checkpoint_interval_s: float = Field(default=5.0, gt=0)
    """While streaming, copy the slot's confirmed position into ``outbox_relay_slots`` this
    often: on start and on every reconnect, a slot behind it (or new, or recreated) is a gap
    the relay restreams by itself (docs/guides/deployment.md, "Slot lost")."""
    slot_failover: bool = True
    """On PostgreSQL 17 and later, create the slot with ``failover`` (and turn it on for an
    existing slot at start), so standbys with ``sync_replication_slots = on`` keep a copy the
    relay resumes from after a promotion. False: a promotion loses the slot and the relay
    restreams the PENDING jobs instead (see the deployment guide's failover section)."""
    heartbeat_interval_s: float = Field(default=60.0, ge=0)
    """While streaming, write a non-transactional logical message this often so the slot's
    confirmed position advances on an idle outbox (and an alert can see the relay live);
    0: off."""
    metrics_bind_local: bool = True
    """Serve metrics on 127.0.0.1 only; false binds 0.0.0.0."""
    max_record_bytes: int = Field(default=256 * 1024, ge=4096, le=900 * 1024)
    """A record larger than this is reduced (rejections: long values cut; intents: rejected
    as too large) before it is produced; well under the producer's 1 MiB max_request_size.
    A row with a column longer than this (text bytes) is rejected on its size, its values
    never decoded nor parsed (see :func:`connectors.cdc.outbox_rows.oversized_rejection`)."""
    rejected_value_max_bytes: int = Field(default=4096, ge=64)
    """Each column value copied into a reduced rejection is cut to this many bytes."""
    reconnect_initial_s: float = Field(default=0.5, gt=0)
    """First wait before reconnecting to PostgreSQL or Kafka after a transient failure."""
    reconnect_max_s: float = Field(default=10.0, gt=0)
    """The reconnect wait doubles up to this."""
    replication_timeout_s: float = Field(default=60.0, gt=0)
    """A replication connection on which PostgreSQL sends nothing (no WAL, no keepalive) for
    this long is presumed hung, closed and reopened; after a third of it without a message
    the relay asks the server for a keepalive. 60 s: PostgreSQL's own subscribers'
    ``wal_receiver_timeout`` default (the server's ``wal_sender_timeout`` is 60 s too)."""
    release_interval_s: float = Field(default=1.0, ge=0, le=60)
    """While streaming, release due scheduled jobs (``SCHEDULED`` rows whose
    ``next_retry_at`` passed) this often: at most this long after its time a scheduled job
    becomes an intent (:mod:`connectors.cdc.scheduled_release`); 0: never (they wait)."""
    release_batch: int = Field(default=2000, ge=1, le=100_000)
    """Scheduled jobs released per tick (one transaction): the most that enter the stream
    per ``release_interval_s`` when many are due at once (they are paced anyway)."""

    exactly_once: bool = False
    """Apache Kafka only. Every record is produced inside a Kafka transaction (transactional
    id ``zapstream-relay.<slot>``, so a restarted relay fences its predecessor), committed
    at a PostgreSQL transaction boundary together with the position it reaches (as the
    offset metadata of the group of the same name); the LSN is confirmed to PostgreSQL
    only after that commit, and a restarted relay skips what Kafka already holds: a
    ``read_committed`` consumer sees every outbox row once (see
    :mod:`connectors.cdc.transactions`). Off: at-least-once (a crash replays the records
    produced since the last confirmation; the worker drops them by job id)."""
    transaction_interval_s: float = Field(default=0.1, gt=0, le=60)
    """With ``exactly_once``: a Kafka transaction is committed at the first PostgreSQL
    transaction boundary after this long, or sooner when no more WAL is at hand. What
    ``read_committed`` consumers wait for at most under load; longer: fewer commits."""
    transaction_timeout_s: float = Field(default=60.0, ge=1, le=900)
    """With ``exactly_once``: the broker aborts a Kafka transaction open this long
    (``transaction.timeout.ms``; the broker's ``transaction.max.timeout.ms`` caps it, 15 min
    by default). One PostgreSQL transaction is one Kafka transaction at least, so the
    largest outbox transaction must be produced within it."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)

    @model_validator(mode="after")
    def _exactly_once_possible(self) -> Self:
        if not self.exactly_once:
            return self
        if self.kafka.flavor is BrokerFlavor.TANSU:
            raise ValueError(
                "ZAPSTREAM_RELAY_EXACTLY_ONCE=true needs Apache Kafka: Tansu has no transactions "
                "(ZAPSTREAM_KAFKA_FLAVOR=tansu); set ZAPSTREAM_RELAY_EXACTLY_ONCE=false"
            )
        if not self.kafka.use_idempotent_producer:
            raise ValueError(
                "ZAPSTREAM_RELAY_EXACTLY_ONCE=true needs the idempotent producer: unset "
                "ZAPSTREAM_KAFKA_IDEMPOTENT_PRODUCER (or set it true)"
            )
        if self.transaction_interval_s >= self.transaction_timeout_s:
            raise ValueError(
                f"ZAPSTREAM_RELAY_TRANSACTION_INTERVAL_S={self.transaction_interval_s:g} must be "
                f"shorter than ZAPSTREAM_RELAY_TRANSACTION_TIMEOUT_S={self.transaction_timeout_s:g}"
            )
        return self
