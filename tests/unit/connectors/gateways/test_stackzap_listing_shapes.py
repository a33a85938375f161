"""The StackZap listing in the shapes real gateways send (issue 15, item 1): sans-IO."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.gateways.stackzap_listing import PageGuard, parse_page
from streams.kernel.errors import ListingUnreadable
from streams.kernel.settings import GatewaySettings, default_listing_fields

FIELDS = default_listing_fields()
LABELS = GatewaySettings().stackzap_labels


def job(**extra: Any) -> dict[str, Any]:
    return {"id": "g-1", "status": "queued", **extra}


@pytest.mark.parametrize(
    ("body", "reference"),
    [
        ({"items": [job(reference="7-1")], "next_page": None}, "7-1"),
        ({"jobs": [job(ref="7-1")], "counts": {"queued": 1}}, "7-1"),  # the seed's words
        ({"data": [job(idempotency_key="7-1")]}, "7-1"),
        ({"results": [job(client_ref="7-1")], "has_more": False}, "7-1"),
        ({"data": {"jobs": [job(idempotencyKey="7-1")], "counts": {}}}, "7-1"),
        ([job(reference="7-1")], "7-1"),  # a bare array
        ({"queue": [job(metadata={"client_reference": "7-1"})]}, "7-1"),
        ({"whatever": [job(custom_tag="7-1")]}, "7-1"),  # by value, in any field
        ({"whatever": [job(custom_tag="x")]}, None),
    ],
)
def test_common_shapes_and_reference_fields(body: Any, reference: str | None) -> None:
    page = parse_page(body, FIELDS, LABELS, page=1, page_size=100, references=["7-1", "7-2"])
    (listed,) = page.items
    assert (listed.id, listed.reference) == ("g-1", reference)
    assert page.next_page is None


@pytest.mark.parametrize(
    ("top", "listed", "expected"),
    [
        ({"next_page": 2}, 1, 2),
        ({"next_page": None}, 100, None),
        ({"nextPage": 3}, 1, 3),
        ({"has_more": True}, 1, 2),
        ({"hasMore": False}, 100, None),
        ({"next": "https://gw/v1/instances/i/send-queue?page=2&page_size=100"}, 1, 2),
        ({"next": None}, 100, None),
        ({"pagination": {"page": 1, "total_pages": 3}}, 100, 2),
        ({"meta": {"current_page": 3, "last_page": 3}}, 100, None),
        ({"total": 250}, 100, 2),  # the gateway serves 100 a page although 1000 were asked
        ({"total": 80}, 80, None),
        ({}, 1000, 2),  # no pagination said, a full page: ask for the next
        ({}, 999, None),
    ],
)
def test_pagination_in_its_common_forms(
    top: dict[str, Any], listed: int, expected: int | None
) -> None:
    body = {"items": [job(id=f"g-{n}") for n in range(listed)], **top}
    assert parse_page(body, FIELDS, LABELS, page=1, page_size=1000).next_page == expected


def test_configured_names_come_first() -> None:
    fields = {**FIELDS, "items": "fila", "id": "codigo", "reference": "chave"}
    body = {"fila": [{"codigo": 9, "chave": "7-1", "id": "other"}], "items": "not this"}
    (listed,) = parse_page(body, fields, LABELS, page=1, page_size=10).items
    assert (listed.id, listed.reference) == ("9", "7-1")


def test_a_gateway_that_ignores_page_is_unreadable_not_short() -> None:
    guard = PageGuard()
    body = {"items": [job(id=f"g-{n}") for n in range(10)]}
    guard.check(parse_page(body, FIELDS, LABELS, page=1, page_size=10))
    with pytest.raises(ListingUnreadable, match="ignores the 'page' parameter"):
        guard.check(parse_page(body, FIELDS, LABELS, page=2, page_size=10))


@pytest.mark.parametrize(
    "body",
    [
        None,
        "SECRET",
        3,
        {"ok": "SECRET"},
        {"result": {"rows_b64": "SECRET"}},
        {"items": [{"to": "SECRET"}]},
    ],
)
def test_unreadable_shapes_name_keys_never_values(body: Any) -> None:
    with pytest.raises(ListingUnreadable) as info:
        parse_page(body, FIELDS, LABELS, page=1, page_size=10)
    assert "SECRET" not in str(info.value)
