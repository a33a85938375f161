"""ZAP API gateway client.

``POST {ZAP_API_URL}/v1/instances/{instance}/messages`` with
``Authorization: Bearer <token>``, ``Idempotency-Key: <reference>`` and
``{"type": "text", "to", "text"}``; answers ``{"id", "status"}`` (some versions
say ``messageId``). Labels are mapped with ``settings.zapapi_labels``; every
failure is classified by :mod:`connectors.gateways.classify`.

``ZAP_API_URL`` is the API's root: zapstream adds ``/v1`` itself, and drops it from a
base URL that already ends with it (the outbox article's ``baseURL:
"https://api.zap-api.tech/v1"``). A 404 on the send route that names no recipient
means that URL is wrong: the instance pauses (:class:`~streams.kernel.errors.GatewayMisconfigured`).

The ZAP API has no read-only call, so :meth:`ZapApiClient.probe_configuration` posts
an *empty* body to the send route: nothing can be sent, and a 400/422 (the body is
invalid) proves the route and the token, where a wrong base URL answers 404.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Sequence
from urllib.parse import quote

from connectors.gateways.classify import send_request
from connectors.gateways.http_client import HttpGatewayClient
from streams.kernel.errors import (
    PermanentGatewayError,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.kernel.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.kernel.settings import GatewaySettings

log = logging.getLogger(__name__)


class ZapApiClient(HttpGatewayClient):
    """A :class:`~streams.kernel.ports.Gateway` for the ZAP API.

    Owns its connection pool (:class:`~connectors.gateways.http_transport.HttpTransport`):
    opened in :meth:`start`, closed in :meth:`stop` (idempotent); ``async with`` does both.
    """

    name = "zapapi"
    url_setting = "ZAP_API_URL"
    credential_setting = "ZAP_TOKEN"
    added_path = re.compile(r"/v1$", re.IGNORECASE)

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

    def _messages_url(self, instance_id: str) -> str:
        return self._url(f"/v1/instances/{quote(instance_id, safe='')}/messages")

    async def send_text(self, message: TextMessage) -> SendAccepted:
        """Send one text; a ``failed`` answer is a permanent error."""
        response = await send_request(
            self._http,
            "POST",
            self._messages_url(message.instance_id),
            gateway=self.name,
            sensitive=(message.to, message.text, self._token),
            headers={"Idempotency-Key": message.reference},
            json_body={"type": "text", "to": message.to, "text": message.text},
            url_setting=self.url_setting,
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
        before_page: object = None,
    ) -> list[ListedJob] | None:
        """The ZAP API has no job listing: uncertain outcomes cannot be reconciled."""
        return None

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        """The ZAP API cannot cancel a message once accepted."""
        return CancelOutcome.UNSUPPORTED

    async def probe_configuration(self, instance_id: str) -> str:
        """POST ``{}`` to the instance's send route: an invalid body, so nothing is sent.

        A 400/422 proves the route and the token; 404/redirect raise
        :class:`~streams.kernel.errors.GatewayMisconfigured`, 401/403 and an unknown instance
        :class:`~streams.kernel.errors.InstanceUnavailableError`. A timeout or reset is only
        transient here: an empty body cannot have sent anything."""
        try:
            response = await send_request(
                self._http,
                "POST",
                self._messages_url(instance_id),
                gateway=self.name,
                sensitive=(self._token,),
                json_body={},
                url_setting=self.url_setting,
            )
        except PermanentGatewayError as exc:
            return f"the send route answered HTTP {exc.status_code} to an empty body, as it should"
        except UncertainGatewayError as exc:
            raise TransientGatewayError(str(exc), status_code=exc.status_code) from exc
        # A gateway that takes an empty body without complaint still proved its route.
        return f"the send route answered HTTP {response.status_code} to an empty body"
