"""The StackZap send-queue listing, read in the shapes gateways really send.

StackZap documents ``GET /v1/instances/{id}/send-queue`` only as the way "to
look up jobs and counts"; the field names vary between versions and between
StackZap-compatible gateways. A reconciliation that cannot read the listing
cannot conclude, so the parser is tolerant of shape and strict about meaning:

- **The jobs**: the configured ``items`` name first, then ``items``, ``jobs``,
  ``data``, ``results``, ``records``, ``queue``, ``entries``, ``content``; one
  level down when that value is an object (``{"data": {"jobs": [...]}}``); a bare
  JSON array is the jobs; failing all that, the only top-level array of objects.
- **Each job**: the configured names first, then the common ones (``id``/``jobId``/
  ``job_id``/``_id``; ``status``/``state``; ``to``/``recipient``/``phone``/``number``/
  ``jid``/``chatId``; ``text``/``message``/``body``; ``created_at``/``createdAt``/
  ``created``), also inside a ``metadata``/``meta`` object.
- **Our reference** (the ``Idempotency-Key`` we sent): the configured name, then
  ``reference``/``ref``/``idempotency_key``/``idempotencyKey``/``client_ref``/
  ``clientRef``/``client_reference``/``external_id``/``externalId``/
  ``correlation_id``; and, when the caller names the references it looks for,
  any string value of the job equal to one of them: an attempt id
  (``<job_id>-<n>``) is unique enough to be matched by value, whatever field a
  gateway echoes it in.
- **Pagination** (:func:`next_page`): ``next_page``/``nextPage`` (null ends),
  ``has_more``/``hasMore``, ``next`` (a number or a link with ``page=``),
  ``total_pages``/``last_page``, ``total``, at the top or inside
  ``pagination``/``meta``/``page_info``/``paging``. A page with none of these is
  the last one when it holds fewer jobs than were asked for, otherwise the next
  page is asked for (a gateway that ignores ``page`` and repeats itself is
  detected by :class:`PageGuard` and the listing is unreadable, not short).

What does not parse raises :class:`~streams.kernel.errors.ListingUnreadable` whose
message names keys and types, never values (recipients and texts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from connectors.gateways.http_client import first_str
from connectors.gateways.labels import map_label
from streams.kernel.contract import JobStatus
from streams.kernel.errors import ListingUnreadable

ITEMS_KEYS = ("items", "jobs", "data", "results", "records", "queue", "entries", "content")
ID_KEYS = ("id", "jobId", "job_id", "_id", "uuid")
STATUS_KEYS = ("status", "state")
TO_KEYS = ("to", "recipient", "phone", "number", "jid", "chatId")
TEXT_KEYS = ("text", "message", "body")
CREATED_KEYS = ("created_at", "createdAt", "created")
REFERENCE_KEYS = (
    "reference",
    "ref",
    "idempotency_key",
    "idempotencyKey",
    "client_ref",
    "clientRef",
    "client_reference",
    "external_id",
    "externalId",
    "correlation_id",
)
NESTED_KEYS = ("metadata", "meta")
"""Objects inside a job that may hold its reference (``{"metadata": {"ref": ...}}``)."""
PAGINATION_KEYS = ("pagination", "meta", "page_info", "paging")
MAX_PAGES = 1000
"""A listing longer than this many pages is unreadable (a pagination that never ends)."""


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


def parse_page(
    body: object,
    fields: Mapping[str, str],
    labels: Mapping[str, str],
    *,
    page: int,
    page_size: int,
    references: Iterable[str] = (),
    gateway: str = "stackzap",
) -> JobPage:
    """One listing page; ``references``: attempt ids to recognise by value."""
    wanted = frozenset(references)
    raw_items, top = _find_items(body, fields, gateway)
    items = tuple(_job(raw, fields, labels, wanted, gateway) for raw in raw_items)
    counts_raw = _first(top, fields["counts"], "counts", "totals", "stats")
    counts = (
        {str(k): v for k, v in counts_raw.items() if _int_or_none(v) is not None}
        if isinstance(counts_raw, dict)
        else {}
    )
    return JobPage(
        items=items,
        page=_int_or_none(top.get(fields["page"])) or page,
        page_size=_int_or_none(top.get(fields["page_size"])) or page_size,
        total=_int_or_none(_first(top, fields["total"], "total", "count")),
        counts=counts,
        next_page=next_page(top, fields, page=page, page_size=page_size, listed=len(items)),
    )


def next_page(
    top: Mapping[str, Any], fields: Mapping[str, str], *, page: int, page_size: int, listed: int
) -> int | None:
    """The page to ask for next, or None when this one is the last (see the module doc)."""
    for where in (top, *(v for k in PAGINATION_KEYS if isinstance(v := top.get(k), dict))):
        for key in (fields["next_page"], "next_page", "nextPage"):
            if key in where:
                value = _int_or_none(where[key])
                return value if value is not None and value > 0 else None
        more = _first(where, "has_more", "hasMore", "more")
        if isinstance(more, bool):
            return page + 1 if more else None
        if "next" in where:
            link = where["next"]
            if link is None or link is False:
                return None
            number = _page_of(link)
            if number is not None:
                return number
        last = _int_or_none(_first(where, "total_pages", "totalPages", "last_page", "lastPage"))
        if last is not None:
            current = _int_or_none(_first(where, "page", "current_page", "currentPage")) or page
            return current + 1 if current < last else None
        total = _int_or_none(_first(where, fields["total"], "total"))
        if total is not None:
            # ``listed``, not the size asked for: a gateway may serve smaller pages. On the
            # last, short page this may ask once more, and the empty page ends it.
            return page + 1 if listed and page * listed < total else None
    return page + 1 if listed >= page_size > 0 else None


class PageGuard:
    """Stops a pagination that repeats itself or never ends (:data:`MAX_PAGES`)."""

    def __init__(self, gateway: str = "stackzap") -> None:
        self._gateway = gateway
        self._pages = 0
        self._last_ids: frozenset[str] = frozenset()

    def check(self, current: JobPage) -> None:
        self._pages += 1
        if self._pages > MAX_PAGES:
            raise ListingUnreadable(
                f"{self._gateway}: listing has more than {MAX_PAGES} pages; "
                "its pagination does not end"
            )
        ids = frozenset(j.id for j in current.items if j.id is not None)
        if self._pages > 1 and ids and ids == self._last_ids:
            raise ListingUnreadable(
                f"{self._gateway}: listing answered page {current.page} with the jobs of the "
                "page before: it ignores the 'page' parameter, so jobs past the first page "
                "cannot be seen"
            )
        self._last_ids = ids


def _find_items(
    body: object, fields: Mapping[str, str], gateway: str
) -> tuple[list[Any], Mapping[str, Any]]:
    """The array of jobs and the object that holds the page's other keys."""
    if isinstance(body, list):
        return body, {}
    if not isinstance(body, dict):
        raise ListingUnreadable(
            f"{gateway}: listing is a {type(body).__name__}, not a JSON object or array"
        )
    names = (fields["items"], *ITEMS_KEYS)
    for key in names:
        value = body.get(key)
        if isinstance(value, list):
            return value, body
    for key in names:
        inner = body.get(key)
        if isinstance(inner, dict):
            for name in names:
                value = inner.get(name)
                if isinstance(value, list):
                    return value, {**body, **inner}
    arrays = [v for v in body.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
    if len(arrays) == 1:
        return arrays[0], body
    raise ListingUnreadable(
        f"{gateway}: listing has no array of jobs (looked for {fields['items']!r} and "
        f"{', '.join(ITEMS_KEYS[1:4])}, ...; top-level keys: {key_names(body)})"
    )


def _job(
    raw: object,
    fields: Mapping[str, str],
    labels: Mapping[str, str],
    wanted: frozenset[str],
    gateway: str,
) -> GatewayJob:
    if not isinstance(raw, dict):
        raise ListingUnreadable(f"{gateway}: listing item is a {type(raw).__name__}, not an object")
    job_id = first_str(raw, fields["id"], *ID_KEYS)
    if job_id is None:
        raise ListingUnreadable(
            f"{gateway}: listing item has no job id (looked for {fields['id']!r}, "
            f"{', '.join(ID_KEYS[1:])}; keys: {key_names(raw)})"
        )
    nested = [v for k in NESTED_KEYS if isinstance(v := raw.get(k), dict)]
    reference = first_str(raw, fields["reference"], *REFERENCE_KEYS)
    for inner in nested:
        reference = reference or first_str(inner, fields["reference"], *REFERENCE_KEYS)
    if wanted and reference not in wanted:
        by_value = _value_in(raw, wanted) or next(
            (v for inner in nested if (v := _value_in(inner, wanted))), None
        )
        reference = by_value or reference
    label = first_str(raw, fields["status"], *STATUS_KEYS)
    text = _first(raw, fields["text"], *TEXT_KEYS)
    return GatewayJob(
        id=job_id,
        gateway_status=label,
        status=map_label(label, labels),
        reference=reference,
        created_at=first_str(raw, fields["created_at"], *CREATED_KEYS),
        to=first_str(raw, fields["to"], *TO_KEYS),
        text=text if isinstance(text, str) else None,
    )


def _value_in(obj: Mapping[str, Any], wanted: frozenset[str]) -> str | None:
    return next((v for v in obj.values() if isinstance(v, str) and v in wanted), None)


def _first(obj: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in obj and obj[key] is not None:
            return obj[key]
    return None


def _page_of(link: object) -> int | None:
    """A ``next`` value as a page number: a number, or a link whose query has ``page=``."""
    if isinstance(link, int) and not isinstance(link, bool):
        return link if link > 0 else None
    if isinstance(link, str):
        if link.isdigit():
            return int(link) or None
        pages = parse_qs(urlsplit(link).query).get("page")
        if pages and pages[0].isdigit():
            return int(pages[0]) or None
    return None


def key_names(obj: Mapping[str, Any], limit: int = 12) -> str:
    """A listing object's key names for an error (never its values), shortened."""
    names = [str(k)[:40] for k in list(obj)[:limit]]
    more = ", ..." if len(obj) > limit else ""
    return ", ".join(names) + more if names else "none"


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def url_references(references: Sequence[str], limit: int) -> Sequence[str]:
    """The references to put in the URL: all of them, or none past ``limit`` (URL length;
    the listing is then narrowed by time only and matched by value)."""
    return references if len(references) <= limit else ()
