"""Settings of ``zapstream sink`` (``ZAPSTREAM_SINK_*``), read once in ``main()``."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from streams.settings import KafkaSettings, PostgresSettings, SettingsBase


class SinkSettings(SettingsBase):
    """``zapstream sink``: job states from Kafka back into PostgreSQL (``ZAPSTREAM_SINK_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_SINK_", extra="ignore")

    group_id: str = "zapstream-state-sink"
    """The sink's own consumer group on ``zapstream.state``, independent of the workers'."""
    batch: int = Field(default=500, ge=1)
    """Most state records written to PostgreSQL in one transaction."""
    within_s: float = Field(default=0.2, gt=0)
    """How long one poll waits for records before writing what it has."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
