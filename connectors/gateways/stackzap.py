"""StackZap gateway client: the send queue, its paginated listing, and cancellation.

Endpoints (relative to ``STACKZAP_API_URL``), authenticated with ``X-API-Key``:

- ``POST /v1/instances/{instance}/send-queue/text`` with ``{"to", "text"}`` and
  ``Idempotency-Key: <reference>``; answers ``{"id", "status"}`` (older versions
  say ``jobId``/``job_id`` and ``state``).
- ``GET /v1/instances/{instance}/send-queue?page=&page_size=&status=&reference=&since=``
  answers ``{"items": [{"id", "to", "text", "status", "reference", "created_at"}],
  "page", "page_size", "total", "counts": {label: n}, "next_page": n | null}``;
  ``reference`` (repeatable) and ``since`` (ISO 8601) narrow it. Every one of
  these names is configurable (``ZAPSTREAM_STACKZAP_LISTING_FIELDS``, see
  :func:`streams.settings.default_listing_fields`); a listing that does not parse
  with them raises :class:`~streams.errors.ListingUnreadable`, logged once per
  instance until a listing of that instance parses again.
- ``POST /v1/instances/{instance}/send-queue/{job_id}/cancel`` answers
  ``{"id", "status": "cancelled"}``, or 409 when the job already left the queue.

Every failure is classified by :mod:`connectors.gateways.classify`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from connectors.gateways.classify import json_object, send_request
from connectors.gateways.http_client import HttpGatewayClient, first_str
from connectors.gateways.labels import map_label
from streams.contract import JobStatus
from streams.errors import ListingUnreadable, PermanentGatewayError
from streams.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.settings import GatewaySettings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayJob:
    """One job in the StackZap send queue. ``to`` and ``text`` stay out of ``repr``."""

    id: str | None
    gateway_status: str | None
    status: JobStatus
    reference: str | None
    """The ``Idempotency-Key`` we sent; ``None`` when the gateway does not show it."""
    created_at: str | None
    to: str | None = dataclasses.field(default=None, repr=False)
    text: str | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True, slots=True)
class JobPage:
    """One page of the StackZap send-queue listing."""

    items: tuple[GatewayJob, ...]
    page: int
    page_size: int
    total: int | None
    counts: Mapping[str, int]
    next_page: int | None


class StackZapClient(HttpGatewayClient):
    """A :class:`~streams.ports.Gateway` for StackZap.

    Owns its ``aiohttp.ClientSession``: opened in :meth:`start`, closed in :meth:`stop`
    (idempotent); ``async with`` does both.
    """

    name = "stackzap"

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
            pairs.extend((self._fields["reference_param"], r) for r in references)
        if since is not None and self._fields["since_param"]:
            pairs.append((self._fields["since_param"], since.isoformat()))
        response = await send_request(
            self._http,
            "GET",
            self._url(self._queue_path(instance_id)),
            gateway=self.name,
            sensitive=(self._api_key,),
            params=pairs,
        )
        return self._parse_page(json_object(response), page=page or 1, page_size=page_size)

    async def iter_pages(
        self,
        instance_id: str,
        *,
        page_size: int = 100,
        status: str | None = None,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
    ) -> AsyncIterator[JobPage]:
        """Every page of the listing, following ``next_page`` until it is null."""
        page: int | None = None
        while True:
            current = await self.list_jobs(
                instance_id,
                page=page,
                page_size=page_size,
                status=status,
                references=references,
                since=since,
            )
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
    ) -> AsyncIterator[GatewayJob]:
        """Every job of the listing, page after page."""
        async for current in self.iter_pages(
            instance_id, page_size=page_size, status=status, references=references, since=since
        ):
            for job in current.items:
                yield job

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
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
                    instance_id, page_size=1000, references=references, since=since
                )
            ]
        except ListingUnreadable as exc:
            if instance_id not in self._unreadable:
                self._unreadable.add(instance_id)
                log.warning(
                    "%s listing of instance %s is unreadable: %s; reconciliation is postponed "
                    "until it parses (set ZAPSTREAM_STACKZAP_LISTING_FIELDS to the names "
                    "the gateway uses)",
                    self.name,
                    instance_id,
                    exc,
                )
            raise
        if instance_id in self._unreadable:
            self._unreadable.discard(instance_id)
            log.info("%s listing of instance %s parses again", self.name, instance_id)
        return listed

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

    def _parse_page(self, body: dict[str, Any] | None, *, page: int, page_size: int) -> JobPage:
        """One listing page with the configured names; :class:`ListingUnreadable` if not.

        The errors name keys and types, never values (recipients and texts)."""
        f = self._fields
        if body is None:
            raise ListingUnreadable(f"{self.name}: listing is not a JSON object")
        if not isinstance(body.get(f["items"]), list):
            raise ListingUnreadable(
                f"{self.name}: listing has no {f['items']!r} array "
                f"(top-level keys: {_key_names(body)})"
            )
        items: list[GatewayJob] = []
        for raw in body[f["items"]]:
            if not isinstance(raw, dict):
                raise ListingUnreadable(
                    f"{self.name}: listing item is a {type(raw).__name__}, not an object"
                )
            job_id = first_str(raw, f["id"], "id", "jobId", "job_id")
            if job_id is None:
                raise ListingUnreadable(
                    f"{self.name}: listing item has no {f['id']!r} (keys: {_key_names(raw)})"
                )
            label = first_str(raw, f["status"], "status", "state")
            text = raw.get(f["text"])
            items.append(
                GatewayJob(
                    id=job_id,
                    gateway_status=label,
                    status=map_label(label, self._labels),
                    reference=first_str(
                        raw, f["reference"], "reference", "idempotency_key", "idempotencyKey"
                    ),
                    created_at=first_str(raw, f["created_at"], "created_at", "createdAt"),
                    to=first_str(raw, f["to"], "to"),
                    text=text if isinstance(text, str) else None,
                )
            )
        counts_raw = body.get(f["counts"])
        counts = (
            {str(k): v for k, v in counts_raw.items() if _int_or_none(v) is not None}
            if isinstance(counts_raw, dict)
            else {}
        )
        next_page = _int_or_none(body.get(f["next_page"]))
        return JobPage(
            items=tuple(items),
            page=_int_or_none(body.get(f["page"])) or page,
            page_size=_int_or_none(body.get(f["page_size"])) or page_size,
            total=_int_or_none(body.get(f["total"])),
            counts=counts,
            next_page=next_page if next_page is not None and next_page > 0 else None,
        )


def _key_names(obj: Mapping[str, Any], limit: int = 12) -> str:
    """A listing object's key names for an error (never its values), shortened."""
    names = [str(k)[:40] for k in list(obj)[:limit]]
    more = ", ..." if len(obj) > limit else ""
    return ", ".join(names) + more if names else "none"


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
