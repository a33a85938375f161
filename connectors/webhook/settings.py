"""Settings of ``zapstream webhook`` (``ZAPSTREAM_WEBHOOK_*``), read once in ``main()``."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from streams.kernel.settings import GatewaySettings, KafkaSettings, PostgresSettings, SettingsBase


class WebhookSettings(SettingsBase):
    """``zapstream webhook``: gateway status callbacks (``ZAPSTREAM_WEBHOOK_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_WEBHOOK_", extra="ignore")

    host: str = "127.0.0.1"
    """Address the callback server listens on."""
    port: int = Field(default=8090, ge=0)
    """Port the callback server listens on; 0: any free port."""
    secret: SecretStr = SecretStr("")
    """Shared HMAC-SHA256 secret; callbacks without a valid, fresh signature get 401."""
    signature_header: str = "X-Zap-Signature"
    """Header carrying ``t=<unix seconds>,v1=<hex>`` (:mod:`connectors.webhook.signature`)."""
    replay_window_s: float = Field(default=300.0, gt=0)
    """Signed callbacks older than this (by their signed timestamp) get 401."""
    clock_skew_s: float = Field(default=30.0, ge=0)
    """How far in the future a signed timestamp may be (clocks differ a little)."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
