"""Settings of ``zapstream webhook`` (``ZAPSTREAM_WEBHOOK_*``), read once in ``main()``."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from streams.settings import GatewaySettings, KafkaSettings, PostgresSettings, SettingsBase


class WebhookSettings(SettingsBase):
    """``zapstream webhook``: gateway status callbacks (``ZAPSTREAM_WEBHOOK_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_WEBHOOK_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0)
    secret: SecretStr = SecretStr("")
    """Shared HMAC-SHA256 secret; callbacks without a valid ``X-Zap-Signature`` get 401."""
    signature_header: str = "X-Zap-Signature"

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
