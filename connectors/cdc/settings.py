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
    metrics_port: int = Field(default=0, ge=0)

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
