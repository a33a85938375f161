"""Settings of ``zapstream status`` (``ZAPSTREAM_STATUS_*``), read once when it runs."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from streams.kernel.settings import PostgresSettings, SettingsBase


class StatusSettings(SettingsBase):
    """``zapstream status``: one screen with every hop (``ZAPSTREAM_STATUS_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_STATUS_", extra="ignore")

    lag_url: str = ""
    """The Kafka lag monitor's Prometheus endpoint (``http://host:port/metrics``); empty:
    the consumer-lag section says "not configured"."""
    lag_timeout_s: float = Field(default=3.0, gt=0)
    """How long to wait for the lag monitor's answer."""
    max_pending_age_s: float = Field(default=600.0, gt=0)
    """A PENDING job older than this needs attention (exit code 1)."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Bound on PostgreSQL's answers (connect and each query)."""

    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
