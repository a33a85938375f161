"""Settings of ``zapstream relay`` (``ZAPSTREAM_RELAY_*``), read once in ``main()``."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from streams.settings import KafkaSettings, PostgresSettings, SettingsBase


class RelaySettings(SettingsBase):
    """``zapstream relay`` (``ZAPSTREAM_RELAY_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_RELAY_", extra="ignore")

    slot: str = "zapstream_outbox"
    publication: str = "zapstream_outbox"
    status_interval_s: float = Field(default=1.0, gt=0)
    """How often the confirmed LSN is reported to PostgreSQL."""
    standby_retry_s: float = Field(default=2.0, gt=0)
    """How often a standby relay retries to take the slot."""
    drain_timeout_s: float = Field(default=30.0, gt=0)
    max_in_flight: int = Field(default=20_000, ge=1)
    """Records sent to Kafka and not yet acknowledged before the relay stops reading WAL."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Serve Prometheus ``/metrics`` on this port (see :mod:`connectors.cdc.metrics`); 0: off."""
    slot_metrics_interval_s: float = Field(default=10.0, gt=0)
    """How often the slot's lag and retained WAL are read from PostgreSQL for ``/metrics``."""
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

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
