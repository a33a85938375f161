"""What every HTTP gateway client shares: one ``httpx.AsyncClient``, owned from start to stop.

The client is created in :meth:`HttpGatewayClient.start` (never at import or
construction) with the timeouts and pool limits of :class:`GatewaySettings`,
and closed by the idempotent :meth:`stop`. Subclasses give the base URL and
their authentication header.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import httpx

from connectors.gateways.classify import json_object
from connectors.gateways.labels import map_label
from streams.contract import JobStatus
from streams.errors import PermanentGatewayError
from streams.ports import SendAccepted
from streams.settings import GatewaySettings

log = logging.getLogger(__name__)

_REFUSED = (JobStatus.FAILED, JobStatus.CANCELLED)


def first_str(body: Mapping[str, Any], *keys: str) -> str | None:
    """The first of ``keys`` holding a non-empty string or an integer, as a string."""
    for key in keys:
        value = body.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


class HttpGatewayClient:
    """Lifecycle of a gateway client's connection pool."""

    name = "http"

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        base_url: str,
        auth_headers: Mapping[str, str],
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._settings = settings
        self._transport = transport
        self._base_url = base_url.rstrip("/")
        self._auth_headers = dict(auth_headers)
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        if self._client is not None:
            return
        s = self._settings
        self._client = httpx.AsyncClient(
            base_url=self._base_url,
            headers={"Accept": "application/json", **self._auth_headers},
            # No write timeout setting of its own: writing a small JSON body is bounded
            # by the read timeout's budget.
            timeout=httpx.Timeout(
                connect=s.connect_timeout_s,
                read=s.read_timeout_s,
                write=s.read_timeout_s,
                pool=s.pool_timeout_s,
            ),
            limits=httpx.Limits(
                max_connections=s.max_connections,
                max_keepalive_connections=s.max_connections,
            ),
            transport=self._transport,
            follow_redirects=False,
        )
        url = httpx.URL(self._base_url)
        log.info("%s client started: %s://%s", self.name, url.scheme, url.netloc.decode())

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._client

    def _accepted(
        self,
        response: httpx.Response,
        labels: Mapping[str, str],
        *,
        id_keys: Sequence[str],
        label_keys: Sequence[str],
        what: str,
    ) -> SendAccepted:
        """Read a send's answer: the gateway's id and label, mapped; a refusal is permanent."""
        body = json_object(response) or {}
        gateway_id = first_str(body, *id_keys)
        label = first_str(body, *label_keys)
        status = map_label(label, labels)
        if status in _REFUSED:
            raise PermanentGatewayError(
                f"{self.name}: {what} {gateway_id} answered {label!r}",
                status_code=response.status_code,
            )
        return SendAccepted(gateway_job_id=gateway_id, gateway_status=label, status=status)
