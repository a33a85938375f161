"""What every HTTP gateway client shares: one connection pool, owned from start to stop.

A client is a :class:`~streams.kernel.runtime.service.Service`: its
:class:`~connectors.gateways.http_transport.HttpTransport` is created when it starts
(never at import or construction) with the timeouts and pool size of
:class:`GatewaySettings`, and closed when it stops (idempotent). Subclasses give the
base URL and their authentication header.

Our own HTTP/1.1 transport rather than a library: httpx/httpcore spent 1-3 ms of CPU
per request in pool bookkeeping that grows with the pool (encode/httpcore#928,
encode/httpx#3215), aiohttp's client ~0.1 ms, the transport ~0.04 ms (figures in
:mod:`connectors.gateways.http_transport`); the worker's budget is 0.35 ms per message.

Timeouts, chosen so that the phase of a timeout tells whether the request was written
(see :mod:`connectors.gateways.classify`):

- ``pool_timeout_s``: waiting for a free pooled connection (``max_connections``);
  ``PoolTimeoutError``, nothing was written (transient).
- ``connect_timeout_s``: the TCP/TLS connect; ``ConnectTimeoutError``, nothing was
  written (transient).
- ``read_timeout_s``: silence from the gateway once the request was written;
  ``ReadTimeoutError`` (uncertain on a send).
- total = ``pool_timeout_s + connect_timeout_s + 2 * read_timeout_s``: only a safety
  net against a gateway trickling its answer byte by byte (uncertain on a send).

Idle connections are kept 5 s at most (httpx's keep-alive expiry): one the gateway
(or its load balancer) may already have closed is not reused for a send, where a
reset would make the outcome uncertain. No cookies, no proxies from the environment,
no redirects followed: the transport has none of them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yarl

from connectors.gateways.classify import GatewayResponse, json_object
from connectors.gateways.http_transport import KEEPALIVE_S, HttpTransport
from connectors.gateways.labels import map_label
from streams.kernel.contract import JobStatus
from streams.kernel.errors import PermanentGatewayError
from streams.kernel.ports import SendAccepted
from streams.kernel.runtime.service import Service
from streams.kernel.settings import GatewaySettings

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


def normalise_base_url(url: str, added_path: re.Pattern[str] | None) -> tuple[str, str | None]:
    """``url`` without trailing slashes and without a trailing ``added_path`` (the version
    segment the client puts in front of every path itself), and what was dropped.

    The outbox article configures ``baseURL: "https://api.zap-api.tech/v1"`` and posts to
    ``/instances/{id}/messages``; copied into ``ZAP_API_URL``, zapstream (which adds
    ``/v1`` itself) would post to ``/v1/v1/...``. ``None``: nothing to drop."""
    stripped = url.rstrip("/")
    dropped: list[str] = []
    if stripped != url:
        dropped.append("a trailing '/'")
    if added_path is not None:
        found = added_path.search(stripped)
        if found is not None and yarl.URL(stripped).path not in ("", "/"):
            dropped.append(f"a trailing {found.group(0)!r}")
            stripped = stripped[: found.start()].rstrip("/")
    return stripped, (" and ".join(dropped) if dropped else None)


class HttpGatewayClient(Service):
    """Lifecycle of a gateway client's connection pool (open on start, closed on stop)."""

    name = "http"
    url_setting = ""
    """The setting holding the base URL, named in errors and in ``zapstream doctor``."""
    credential_setting = ""
    """The setting holding the key or token (never its value), named likewise."""
    added_path: re.Pattern[str] | None = None
    """The version segment the client adds to every path; a base URL ending with it
    has it dropped (see :func:`normalise_base_url`)."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        base_url: str,
        auth_headers: Mapping[str, str],
    ) -> None:
        super().__init__()
        self._settings = settings
        self._base_url, self._normalised = normalise_base_url(base_url, self.added_path)
        self._auth_headers = dict(auth_headers)
        self._session: HttpTransport | None = None

    async def on_start(self) -> None:
        s = self._settings
        self._session = HttpTransport(
            max_connections=s.max_connections,
            connect_timeout_s=s.connect_timeout_s,
            read_timeout_s=s.read_timeout_s,
            pool_timeout_s=s.pool_timeout_s,
            keepalive_s=KEEPALIVE_S,
            default_headers={"Accept": "application/json", **self._auth_headers},
        )
        url = yarl.URL(self._base_url)
        log.info(
            "%s client started: %s://%s:%s (max %d connections)",
            self.name,
            url.scheme,
            url.host,
            url.port,
            s.max_connections,
        )
        if self._normalised and self._normalised != "a trailing '/'":
            log.info(
                "%s: dropped %s from %s (zapstream adds it to every path itself)",
                self.name,
                self._normalised,
                self.url_setting,
            )

    async def on_stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @property
    def _http(self) -> HttpTransport:
        if self._session is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._session

    def _url(self, path: str) -> str:
        """The absolute URL of ``path`` (already quoted) under the configured base URL."""
        return self._base_url + path

    def _accepted(
        self,
        response: GatewayResponse,
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
