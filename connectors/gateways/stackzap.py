"""StackZap gateway client: the send queue, its paginated listing, and cancellation.

Endpoints (relative to ``STACKZAP_API_URL``), authenticated with ``X-API-Key``:

- ``POST /v1/instances/{instance}/send-queue/text`` with ``{"to", "text"}`` and
  ``Idempotency-Key: <reference>``; answers ``{"id", "status"}`` (older versions
  say ``jobId``/``job_id`` and ``state``).
- ``GET /v1/instances/{instance}/send-queue?page=&page_size=&status=&reference=&since=``
  answers the jobs and their counts, e.g. ``{"items": [{"id", "to", "text", "status",
  "reference", "created_at"}], "page", "page_size", "total", "counts": {label: n},
  "next_page": n | null}`` or ``{"jobs": [{"id", "ref", ...}], "counts": {...}}``:
  :mod:`connectors.gateways.stackzap_listing` reads the common shapes, and the
  names of ``ZAPSTREAM_STACKZAP_LISTING_FIELDS`` first. ``reference`` (repeatable,
  at most :data:`MAX_URL_REFERENCES`) and ``since`` (ISO 8601) narrow it. A
  listing that does not parse raises :class:`~streams.kernel.errors.ListingUnreadable`,
  logged once per instance until a listing of that instance parses again.
- ``POST /v1/instances/{instance}/send-queue/{job_id}/cancel`` answers
  ``{"id", "status": "cancelled"}``, or 409 when the job already left the queue.

Every failure is classified by :mod:`connectors.gateways.classify`; a 404 naming no
resource on the send or listing route means ``STACKZAP_API_URL`` is wrong (a trailing
``/v1``, which the client adds itself, is dropped from it).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from urllib.parse import quote

import orjson

from connectors.gateways.classify import GatewayResponse, json_object, send_request
from connectors.gateways.http_client import HttpGatewayClient, first_str
from connectors.gateways.labels import map_label
from connectors.gateways.stackzap_listing import (
    GatewayJob,
    JobPage,
    PageGuard,
    parse_page,
    url_references,
)
from streams.kernel.contract import JobStatus
from streams.kernel.errors import ListingUnreadable, PermanentGatewayError
from streams.kernel.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.kernel.settings import GatewaySettings

log = logging.getLogger(__name__)

MAX_URL_REFERENCES = 50
"""More references than this are not put in the listing's URL (its length): the listing is
then narrowed by ``since`` only, and our references are recognised in the answer."""


class StackZapClient(HttpGatewayClient):
    """A :class:`~streams.kernel.ports.Gateway` for StackZap.

    Owns its connection pool (:class:`~connectors.gateways.http_transport.HttpTransport`):
    opened in :meth:`start`, closed in :meth:`stop` (idempotent); ``async with`` does both.
    """

    name = "stackzap"
    url_setting = "STACKZAP_API_URL"
    credential_setting = "STACKZAP_API_KEY"
    added_path = re.compile(r"/v1$", re.IGNORECASE)

    def __init__(
        self,
        settings: GatewaySettings,
    ) -> None:
        self._api_key = settings.stackzap_api_key.get_secret_value()
        self._labels = settings.stackzap_labels
        self._fields = settings.stackzap_listing_fields
        self._unreadable: set[str] = set()
        """Instances whose last listing did not parse (logged once until one does)."""
        super().__init__(
            settings,
            base_url=settings.stackzap_api_url,
            auth_headers={"X-API-Key": self._api_key} if self._api_key else {},
        )

    def _queue_path(self, instance_id: str) -> str:
        return f"/v1/instances/{quote(instance_id, safe='')}/send-queue"

    # --- sending ----------------------------------------------------------------------

    async def send_text(self, message: TextMessage) -> SendAccepted:
        """Enqueue one text; a ``failed``/``cancelled`` answer is a permanent error."""
        sensitive = (message.to, message.text, self._api_key)
        response = await send_request(
            self._http,
            "POST",
            self._url(f"{self._queue_path(message.instance_id)}/text"),
            gateway=self.name,
            sensitive=sensitive,
            headers={"Idempotency-Key": message.reference},
            json_body={"to": message.to, "text": message.text},
            url_setting=self.url_setting,
        )
        return self._accepted(
            response,
            self._labels,
            id_keys=("id", "jobId", "job_id"),
            label_keys=("status", "state"),
            what="job",
        )

    # --- the queue ---------------------------------------------------------------------

    async def list_jobs(
        self,
        instance_id: str,
        *,
        page: int | None = None,
        page_size: int = 100,
        status: str | None = None,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
    ) -> JobPage:
        """One page of the instance's send queue, optionally only jobs with label ``status``,
        with one of ``references`` or created at or after ``since`` (where the API filters)."""
        pairs: list[tuple[str, str]] = [("page_size", str(page_size))]
        if page is not None:
            pairs.append(("page", str(page)))
        if status is not None:
            pairs.append(("status", status))
        if self._fields["reference_param"]:
            pairs.extend(
                (self._fields["reference_param"], r)
                for r in url_references(references, MAX_URL_REFERENCES)
            )
        if since is not None and self._fields["since_param"]:
            pairs.append((self._fields["since_param"], since.isoformat()))
        response = await send_request(
            self._http,
            "GET",
            self._url(self._queue_path(instance_id)),
            gateway=self.name,
            sensitive=(self._api_key,),
            params=pairs,
            url_setting=self.url_setting,
        )
        return parse_page(
            _json_body(response),
            self._fields,
            self._labels,
            page=page or 1,
            page_size=page_size,
            references=references,
            gateway=self.name,
        )

    async def iter_pages(
        self,
        instance_id: str,
        *,
        page_size: int = 100,
        status: str | None = None,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncIterator[JobPage]:
        """Every page of the listing, following its pagination to the end.

        ``before_page`` is awaited before each request (the worker's per-instance bound)."""
        page: int | None = None
        guard = PageGuard(self.name)
        while True:
            if before_page is not None:
                await before_page()
            current = await self.list_jobs(
                instance_id,
                page=page,
                page_size=page_size,
                status=status,
                references=references,
                since=since,
            )
            guard.check(current)
            yield current
            if current.next_page is None:
                return
            if current.next_page <= current.page:
                raise PermanentGatewayError(
                    f"{self.name}: listing went from page {current.page} to {current.next_page}"
                )
            page = current.next_page

    async def iter_jobs(
        self,
        instance_id: str,
        *,
        page_size: int = 100,
        status: str | None = None,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncIterator[GatewayJob]:
        """Every job of the listing, page after page."""
        async for current in self.iter_pages(
            instance_id,
            page_size=page_size,
            status=status,
            references=references,
            since=since,
            before_page=before_page,
        ):
            for job in current.items:
                yield job

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> list[ListedJob] | None:
        """The instance's jobs with one of ``references`` / since ``since``, all pages."""
        try:
            listed = [
                ListedJob(
                    gateway_job_id=job.id,
                    reference=job.reference,
                    to=job.to,
                    text=job.text,
                    status=job.status,
                    gateway_status=job.gateway_status,
                )
                async for job in self.iter_jobs(
                    instance_id,
                    page_size=1000,
                    references=references,
                    since=since,
                    before_page=before_page,
                )
            ]
        except ListingUnreadable as exc:
            if instance_id not in self._unreadable:
                self._unreadable.add(instance_id)
                log.warning(
                    "%s listing of instance %s is unreadable: %s; reconciliation cannot "
                    "conclude until it parses (set ZAPSTREAM_STACKZAP_LISTING_FIELDS to the "
                    "names the gateway uses)",
                    self.name,
                    instance_id,
                    exc,
                )
            raise
        if instance_id in self._unreadable:
            self._unreadable.discard(instance_id)
            log.info("%s listing of instance %s parses again", self.name, instance_id)
        return listed

    async def probe_configuration(self, instance_id: str) -> str:
        """One page of one job of the instance's send queue: the base URL, the key, and
        whether the listing parses (:class:`~streams.kernel.errors.ListingUnreadable` if not)."""
        listed = await self.list_jobs(instance_id, page_size=1)
        return f"the send-queue listing answered and parses ({len(listed.items)} of 1 asked for)"

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        cancelled = await self.cancel(instance_id, gateway_job_id)
        return CancelOutcome.CANCELLED if cancelled else CancelOutcome.REFUSED

    async def cancel(self, instance_id: str, job_id: str) -> bool:
        """Cancel a queued job. ``False`` when the gateway says it is too late (409)."""
        try:
            response = await send_request(
                self._http,
                "POST",
                self._url(f"{self._queue_path(instance_id)}/{quote(job_id, safe='')}/cancel"),
                gateway=self.name,
                sensitive=(self._api_key,),
            )
        except PermanentGatewayError as exc:
            if exc.status_code == 409:
                return False
            raise
        label = first_str(json_object(response) or {}, "status", "state")
        # A 2xx without a label is taken at its word; a label must say cancelled.
        return label is None or map_label(label, self._labels) is JobStatus.CANCELLED


def _json_body(response: GatewayResponse) -> object:
    """The listing's JSON: an object or an array (:func:`json_object` takes objects only)."""
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return None
