"""Build the configured gateway client; used by the composition root only."""

from __future__ import annotations

from connectors.gateways.meta import MetaCloudClient
from connectors.gateways.stackzap import StackZapClient
from connectors.gateways.zapapi import ZapApiClient
from streams.kernel.ports import Gateway
from streams.kernel.settings import GatewayKind, GatewaySettings


def build_gateway(settings: GatewaySettings) -> Gateway:
    """The client for ``settings.kind``, not yet started."""
    if settings.kind is GatewayKind.STACKZAP:
        return StackZapClient(settings)
    if settings.kind is GatewayKind.ZAPAPI:
        return ZapApiClient(settings)
    if settings.kind is GatewayKind.META:
        return MetaCloudClient(settings)
    raise ValueError(f"unknown gateway kind {settings.kind!r}")
