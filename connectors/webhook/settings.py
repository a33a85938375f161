"""Settings of ``zapstream webhook`` (``ZAPSTREAM_WEBHOOK_*``), read once in ``main()``."""

from __future__ import annotations

from typing import Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from streams.kernel.settings import (
    GatewayKind,
    GatewaySettings,
    KafkaSettings,
    PostgresSettings,
    SettingsBase,
)

MIN_SECRET_CHARS = 32
"""The shortest ``ZAPSTREAM_WEBHOOK_SECRET`` accepted: an HMAC key anyone can guess offline
from one signed callback protects nothing."""


class WebhookSettings(SettingsBase):
    """``zapstream webhook``: gateway status callbacks (``ZAPSTREAM_WEBHOOK_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_WEBHOOK_", extra="ignore")

    host: str = "127.0.0.1"
    """Address the callback server listens on."""
    port: int = Field(default=8090, ge=0)
    """Port the callback server listens on; 0: any free port."""
    secret: SecretStr = SecretStr("")
    """Shared HMAC-SHA256 secret of ``X-Zap-Signature``; callbacks without a valid, fresh
    signature get 401. At least 32 characters (the webhook refuses to start otherwise);
    empty only with ``ZAPSTREAM_GATEWAY=meta`` (Meta signs with ``META_APP_SECRET``), and
    then every StackZap and ZAP API callback gets 401."""
    signature_header: str = "X-Zap-Signature"
    """Header carrying ``t=<unix seconds>,v2=<hex>`` (:mod:`connectors.webhook.signature`)."""
    replay_window_s: float = Field(default=300.0, gt=0)
    """Signed callbacks older than this (by their signed timestamp) get 401."""
    clock_skew_s: float = Field(default=30.0, ge=0)
    """How far in the future a signed timestamp may be (clocks differ a little)."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)

    @model_validator(mode="after")
    def _secret_long_enough(self) -> Self:
        length = len(self.secret.get_secret_value())
        if length == 0 and self.gateway.kind is GatewayKind.META:
            return self
        if length < MIN_SECRET_CHARS:
            problem = (
                "is not set" if length == 0 else f"is shorter than {MIN_SECRET_CHARS} characters"
            )
            raise ValueError(
                f"ZAPSTREAM_WEBHOOK_SECRET {problem}: use at least {MIN_SECRET_CHARS} random "
                "characters (e.g. `openssl rand -hex 32`)"
            )
        return self
