"""The StackZap listing for reconciliation: configurable names, narrow queries, unreadable
answers (issue 7, item 9). A scripted gateway on loopback only."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from connectors.gateways.stackzap import StackZapClient
from streams.kernel.errors import ListingUnreadable, TransientGatewayError
from streams.kernel.ports import ListedJob
from streams.kernel.settings import GatewayKind, GatewaySettings, default_listing_fields
from streams.metrics import LISTING_UNREADABLE
from streams.reconcile import SINCE_MARGIN, Verdict, listing_query, match, reconcile
from tests.unit.connectors.gateways.fake_gateway import FakeGateway, Reply, Seen

PHONE = "5511987654321"
OTHER_SHAPE = {"items": "jobs", "reference": "ref"}


@contextlib.asynccontextmanager
async def client(
    pages: list[dict[str, Any]], seen: list[Seen], **fields: str
) -> AsyncIterator[StackZapClient]:
    def handler(request: Seen) -> Reply:
        seen.append(request)
        page = int(request.params.get("page", "1"))
        return Reply(200, json=pages[page - 1])

    async with FakeGateway(handler) as fake:
        settings = GatewaySettings(
            kind=GatewayKind.STACKZAP,
            stackzap_api_url=f"{fake.url}/",
            stackzap_api_key=SecretStr("k"),
            stackzap_listing_fields=fields,
        )
        async with StackZapClient(settings) as gw:
            yield gw


def jobs_shape(*refs: str, next_page: int | None = None) -> dict[str, Any]:
    """A gateway that says ``jobs`` and ``ref``."""
    jobs = [{"id": f"g-{r}", "ref": r, "to": PHONE, "text": "hi", "status": "queued"} for r in refs]
    return {"jobs": jobs, "next_page": next_page}


def test_listing_fields_setting_merges_with_defaults_and_rejects_unknown_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZAPSTREAM_STACKZAP_LISTING_FIELDS", '{"items": "jobs", "reference": "ref"}')
    fields = GatewaySettings().stackzap_listing_fields
    assert fields == {**default_listing_fields(), "items": "jobs", "reference": "ref"}
    monkeypatch.delenv("ZAPSTREAM_STACKZAP_LISTING_FIELDS")
    assert GatewaySettings(stackzap_listing_fields={}).stackzap_listing_fields == (
        default_listing_fields()
    )
    with pytest.raises(ValidationError, match="unknown listing field"):
        GatewaySettings(stackzap_listing_fields={"itmes": "jobs"})
    with pytest.raises(ValidationError, match="non-empty"):
        GatewaySettings(stackzap_listing_fields={"items": ""})
    # A query parameter may be empty: the API has no such filter.
    no_filter = GatewaySettings(stackzap_listing_fields={"reference_param": ""})
    assert no_filter.stackzap_listing_fields["reference_param"] == ""


async def test_another_shape_parses_with_configured_names_across_pages() -> None:
    seen: list[Seen] = []
    pages = [jobs_shape("7-1", next_page=2), jobs_shape("8-1")]
    async with client(pages, seen, **OTHER_SHAPE) as gw:
        listed = await gw.list_for_reconciliation("shop")
    assert [(j.gateway_job_id, j.reference) for j in listed or []] == [
        ("g-7-1", "7-1"),
        ("g-8-1", "8-1"),
    ]
    assert len(seen) == 2


async def test_default_names_read_the_seeds_jobs_and_counts_shape() -> None:
    """``{"jobs": [...], "counts": {...}}`` with the reference in ``ref``: no setting needed."""
    seen: list[Seen] = []
    seed_shape = {**jobs_shape("7-1", "8-2"), "counts": {"queued": 2}}
    del seed_shape["next_page"]
    async with client([seed_shape], seen) as gw:
        listed = await gw.list_for_reconciliation("shop", references=["7-1"])
    assert [(j.gateway_job_id, j.reference) for j in listed or []] == [
        ("g-7-1", "7-1"),
        ("g-8-2", "8-2"),
    ]
    assert len(seen) == 1, "two jobs of 1000 asked for: the last page"


UNKNOWN_SHAPE = {"result": {"rows_b64": "eyJ9"}, "ok": True}


async def test_an_unknown_shape_is_unreadable_logged_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[Seen] = []
    caplog.set_level(logging.INFO, logger="connectors.gateways.stackzap")
    pages: list[dict[str, Any]] = [UNKNOWN_SHAPE]
    async with client(pages, seen) as gw:
        for _ in range(3):
            with pytest.raises(ListingUnreadable, match="no array of jobs"):
                await gw.list_for_reconciliation("shop")
        with pytest.raises(ListingUnreadable):
            await gw.list_for_reconciliation("shop-2")
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2, "once per instance per outage"
        text = warnings[0].getMessage()
        assert "ZAPSTREAM_STACKZAP_LISTING_FIELDS" in text and "result" in text
        assert "eyJ9" not in caplog.text  # keys are named, values never
        # The gateway is fixed: one recovery line, then a new outage logs again.
        pages[0] = jobs_shape("7-1")
        assert await gw.list_for_reconciliation("shop")
        assert sum("parses again" in r.getMessage() for r in caplog.records) == 1
        pages[0] = UNKNOWN_SHAPE
        with pytest.raises(ListingUnreadable):
            await gw.list_for_reconciliation("shop")
        assert sum(r.levelno == logging.WARNING for r in caplog.records) == 3


async def test_reconciliation_asks_narrowly_by_reference_and_since() -> None:
    seen: list[Seen] = []
    since = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)
    async with client([{"items": [], "next_page": None}], seen) as gw:
        await gw.list_for_reconciliation("shop", references=["7-1", "7-2"], since=since)
    params = seen[0].params
    assert params.getall("reference") == ["7-1", "7-2"]
    assert params["since"] == "2026-12-01T10:00:00+00:00"
    # An API without those filters: configured off, nothing sent (it lists everything).
    seen.clear()
    async with client(
        [{"items": [], "next_page": None}], seen, reference_param="", since_param=""
    ) as gw:
        await gw.list_for_reconciliation("shop", references=["7-1"], since=since)
    assert "reference" not in seen[0].params and "since" not in seen[0].params


def test_listing_query_covers_every_attempt_and_a_margin_before_creation() -> None:
    refs, since = listing_query(7, 3, "2026-12-01T10:00:00+00:00")
    assert refs == ["7-1", "7-2", "7-3"]
    assert since == dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC) - SINCE_MARGIN
    assert listing_query(7, 0, None) == ([], None)
    refs, since = listing_query(7, 500, "not a time")
    assert len(refs) == 500 and refs[-1] == "7-500" and since is None


class _Gateway:
    name = "fake"

    def __init__(self, error: Exception | None, listing: list[ListedJob] | None = None) -> None:
        self.error = error
        self.listing = listing
        self.queries: list[tuple[tuple[str, ...], dt.datetime | None]] = []

    async def list_for_reconciliation(
        self, instance_id: str, *, references: Any = (), since: dt.datetime | None = None
    ) -> list[ListedJob] | None:
        self.queries.append((tuple(references), since))
        if self.error is not None:
            raise self.error
        return self.listing


async def test_an_unreadable_listing_means_later_never_uncertain_and_is_counted() -> None:
    before = LISTING_UNREADABLE.labels("fake", "shop")._value.get()
    gw = _Gateway(ListingUnreadable("stackzap: listing has no 'items' array"))
    result = await reconcile(
        gw,  # type: ignore[arg-type]
        instance_id="shop",
        job_id=7,
        to=PHONE,
        text="hi",
        authoritative=True,
        attempt_seq=2,
        created_at="2026-12-01T10:00:00+00:00",
    )
    assert result.verdict is Verdict.LATER and "listing unreadable" in result.reason
    assert LISTING_UNREADABLE.labels("fake", "shop")._value.get() == before + 1
    assert gw.queries[0][0] == ("7-1", "7-2")
    transient = await reconcile(
        _Gateway(TransientGatewayError("503")),  # type: ignore[arg-type]
        instance_id="shop",
        job_id=7,
        to=PHONE,
        text="hi",
        authoritative=True,
    )
    assert transient.verdict is Verdict.LATER


def _listed(reference: str | None, text: str = "hi") -> ListedJob:
    from streams.kernel.contract import JobStatus

    return ListedJob("g-9", reference, PHONE, text, JobStatus.ACCEPTED, "queued")


@pytest.mark.parametrize(
    ("listed", "authoritative", "verdict"),
    [
        ([_listed("7-2")], True, Verdict.ADOPT),
        ([_listed("17-1"), _listed("70-1")], True, Verdict.RESEND),
        ([_listed("17-1")], False, Verdict.UNCERTAIN),
        ([], True, Verdict.RESEND),
        ([_listed(None)], True, Verdict.ADOPT),
        ([_listed(None), _listed(None)], True, Verdict.UNCERTAIN),
        ([_listed(None, "other")], False, Verdict.UNCERTAIN),
    ],
)
def test_match_is_pure(listed: list[ListedJob], authoritative: bool, verdict: Verdict) -> None:
    assert match(listed, job_id=7, to=PHONE, text="hi", authoritative=authoritative).verdict is (
        verdict
    )
