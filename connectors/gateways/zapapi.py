"""ZAP API gateway client.

``POST {ZAP_API_URL}/v1/instances/{instance}/messages`` with
``Authorization: Bearer <token>``, ``Idempotency-Key: <reference>`` and
``{"type": "text", "to", "text"}``; answers ``{"id", "status"}`` (some versions
say ``messageId``). Labels are mapped with ``settings.zapapi_labels``; every
failure is classified by :mod:`connectors.gateways.classify`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from urllib.parse import quote

from connectors.gateways.classify import send_request
from connectors.gateways.http_client import HttpGatewayClient
from streams.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.settings import GatewaySettings

log = logging.getLogger(__name__)


class ZapApiClient(HttpGatewayClient):
    """A :class:`~streams.ports.Gateway` for the ZAP API.

    Owns its ``aiohttp.ClientSession``: opened in :meth:`start`, closed in :meth:`stop`
    (idempotent); ``async with`` does both.
    """

    name = "zapapi"

    def __init__(
        self,
        settings: GatewaySettings,
    ) -> None:
        self._token = settings.zap_token.get_secret_value()
        self._labels = settings.zapapi_labels
        super().__init__(
            settings,
            base_url=settings.zap_api_url,
            auth_headers={"Authorization": f"Bearer {self._token}"} if self._token else {},
        )

    async def send_text(self, message: TextMessage) -> SendAccepted:
        """Send one text; a ``failed`` answer is a permanent error."""
        response = await send_request(
            self._http,
            "POST",
            self._url(f"/v1/instances/{quote(message.instance_id, safe='')}/messages"),
            gateway=self.name,
            sensitive=(message.to, message.text, self._token),
            headers={"Idempotency-Key": message.reference},
            json_body={"type": "text", "to": message.to, "text": message.text},
        )
        return self._accepted(
            response,
            self._labels,
            id_keys=("id", "messageId", "message_id"),
            label_keys=("status",),
            what="message",
        )

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
    ) -> list[ListedJob] | None:
        """The ZAP API has no job listing: uncertain outcomes cannot be reconciled."""
        return None

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        """The ZAP API cannot cancel a message once accepted."""
        return CancelOutcome.UNSUPPORTED
