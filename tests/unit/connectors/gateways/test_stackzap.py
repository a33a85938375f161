"""StackZapClient against a scripted gateway on loopback: request shape, parsing, errors,
listing, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from connectors.gateways.factory import build_gateway
from connectors.gateways.stackzap import GatewayJob, StackZapClient
from streams.kernel.contract import JobStatus
from streams.kernel.errors import (
    ListingUnreadable,
    PermanentGatewayError,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.kernel.ports import TextMessage
from streams.kernel.settings import GatewayKind, GatewaySettings
from tests.unit.connectors.gateways.fake_gateway import (
    FakeGateway,
    Fault,
    Handler,
    Reply,
    Seen,
    answer,
    closed_port_url,
    failing,
)

API_KEY = "sz-key-0123456789abcdef"
PHONE = "5511987654321"
TEXT = "Seu codigo e 424242"
MESSAGE_PATH = "/base/v1/instances/inst%201/send-queue/text"


def settings(**overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "kind": GatewayKind.STACKZAP,
        "stackzap_api_url": "https://stackzap.test/base/",
        "stackzap_api_key": SecretStr(API_KEY),
    }
    values.update(overrides)
    return GatewaySettings(**values)


@contextlib.asynccontextmanager
async def client(handler: Handler, **overrides: Any) -> AsyncIterator[StackZapClient]:
    """A started client whose base URL (with a path) points at a fake gateway."""
    async with FakeGateway(handler) as fake:
        overrides.setdefault("stackzap_api_url", f"{fake.url}/base/")
        async with StackZapClient(settings(**overrides)) as gw:
            yield gw


def message(reference: str = "att-1") -> TextMessage:
    return TextMessage(instance_id="inst 1", to=PHONE, text=TEXT, reference=reference)


# --- send ------------------------------------------------------------------------


async def test_send_request_shape() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(201, json={"id": "job-1", "status": "queued"})

    async with client(handler) as gw:
        accepted = await gw.send_text(message("att-42"))

    assert accepted.gateway_job_id == "job-1"
    assert accepted.gateway_status == "queued"
    assert accepted.status is JobStatus.ACCEPTED
    (request,) = seen
    assert request.method == "POST"
    assert request.raw_path == MESSAGE_PATH
    assert request.headers["X-API-Key"] == API_KEY
    assert request.headers["Idempotency-Key"] == "att-42"
    assert request.headers["Content-Type"] == "application/json"
    assert "authorization" not in request.headers
    assert json.loads(request.content) == {"to": PHONE, "text": TEXT}


async def test_no_api_key_header_when_unset() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json={"id": "j", "status": "queued"})

    async with client(handler, stackzap_api_key=SecretStr("")) as gw:
        await gw.send_text(message())
    assert "x-api-key" not in seen[0].headers


@pytest.mark.parametrize(
    ("body", "job_id", "label", "status"),
    [
        ({"id": "a", "status": "queued"}, "a", "queued", JobStatus.ACCEPTED),
        ({"jobId": "b", "status": "QUEUED"}, "b", "QUEUED", JobStatus.ACCEPTED),
        ({"job_id": "c", "state": "pending"}, "c", "pending", JobStatus.ACCEPTED),
        ({"id": 17, "status": "sent"}, "17", "sent", JobStatus.ACCEPTED),
        ({"id": "", "jobId": "d", "status": "delivered"}, "d", "delivered", JobStatus.DELIVERED),
        ({"id": "e", "status": "weird"}, "e", "weird", JobStatus.REVIEW),
        ({"id": "f"}, "f", None, JobStatus.REVIEW),
        ({}, None, None, JobStatus.REVIEW),
        (b"OK", None, None, JobStatus.REVIEW),
        ([1, 2], None, None, JobStatus.REVIEW),
    ],
)
async def test_send_parses_id_and_label(
    body: Any, job_id: str | None, label: str | None, status: JobStatus
) -> None:
    async with client(answer(200, body)) as gw:
        accepted = await gw.send_text(message())
    assert accepted.gateway_job_id == job_id
    assert accepted.gateway_status == label
    assert accepted.status is status


async def test_custom_labels_from_settings() -> None:
    handler = answer(200, {"id": "x", "status": "Enfileirado"})
    async with client(handler, stackzap_labels={"enfileirado": "ACCEPTED"}) as gw:
        assert (await gw.send_text(message())).status is JobStatus.ACCEPTED


@pytest.mark.parametrize("label", ["failed", "ERROR", "cancelled", "canceled"])
async def test_refused_label_on_send_is_permanent(label: str) -> None:
    async with client(answer(200, {"id": "x", "status": label})) as gw:
        with pytest.raises(PermanentGatewayError) as info:
            await gw.send_text(message())
    assert info.value.status_code == 200
    assert not info.value.retriable


FAST = {"read_timeout_s": 0.2, "connect_timeout_s": 0.2, "pool_timeout_s": 0.05}


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        # The request was written and read by the gateway: it may have acted on it.
        (Fault.STALL, UncertainGatewayError),  # ReadTimeoutError
        (Fault.DISCONNECT, UncertainGatewayError),  # ConnectionDroppedError
        (Fault.CUT_BODY, UncertainGatewayError),  # MalformedResponseError
        (Fault.GARBAGE, UncertainGatewayError),  # MalformedResponseError (bad status line)
    ],
)
async def test_transport_errors_after_the_request_was_written_are_uncertain(
    fault: Fault, expected: type[Exception]
) -> None:
    async with client(failing(fault), **FAST) as gw:
        with pytest.raises(expected) as info:
            await gw.send_text(message())
    assert not info.value.retriable  # type: ignore[attr-defined]
    assert PHONE not in str(info.value) and API_KEY not in str(info.value)


@pytest.mark.parametrize("fault", [Fault.STALL, Fault.DISCONNECT, Fault.CUT_BODY, Fault.GARBAGE])
async def test_the_same_failures_on_a_listing_are_transient(fault: Fault) -> None:
    async with client(failing(fault), **FAST) as gw:
        with pytest.raises(TransientGatewayError):
            await gw.list_jobs("i")


async def test_connection_refused_is_transient() -> None:
    async with client(answer(200, {}), stackzap_api_url=closed_port_url(), **FAST) as gw:
        with pytest.raises(TransientGatewayError) as info:
            await gw.send_text(message())
    assert "ConnectError" in str(info.value)


async def test_waiting_for_a_pooled_connection_is_transient() -> None:
    """Pool full for longer than the pool timeout: nothing was written (transient)."""
    async with FakeGateway(failing(Fault.STALL)) as fake:
        overrides = {**FAST, "read_timeout_s": 3.0, "max_connections": 1}
        async with StackZapClient(settings(stackzap_api_url=fake.url, **overrides)) as gw:
            holder = asyncio.create_task(gw.send_text(message("att-holds-the-pool")))
            for _ in range(200):
                if fake.seen:
                    break
                await asyncio.sleep(0.01)
            assert len(fake.seen) == 1
            with pytest.raises(TransientGatewayError) as info:
                await gw.send_text(message("att-waits"))
            assert "PoolTimeoutError" in str(info.value)
            assert len(fake.seen) == 1  # the second request never reached the gateway
            holder.cancel()
            with pytest.raises(asyncio.CancelledError):
                await holder


@pytest.mark.parametrize(
    ("status", "headers", "expected", "retry_after_s"),
    [
        (429, {"Retry-After": "3"}, TransientGatewayError, 3.0),
        (429, {"Retry-After": "0.25"}, TransientGatewayError, 0.25),
        (503, {"Retry-After": "10"}, TransientGatewayError, 10.0),
        (503, {}, TransientGatewayError, None),
        (500, {}, TransientGatewayError, None),
        (408, {}, TransientGatewayError, None),
    ],
)
async def test_transient_statuses(
    status: int, headers: dict[str, str], expected: type[Exception], retry_after_s: float | None
) -> None:
    async with client(answer(status, {"error": "later"}, headers)) as gw:
        with pytest.raises(TransientGatewayError) as info:
            await gw.send_text(message())
    assert info.value.status_code == status
    assert info.value.retry_after_s == retry_after_s
    assert info.value.retriable


@pytest.mark.parametrize("status", [502, 504])
async def test_proxy_5xx_on_a_send_is_uncertain(status: int) -> None:
    from streams.kernel.errors import UncertainGatewayError as Uncertain

    async with client(answer(status, {"error": "bad gateway"})) as gw:
        with pytest.raises(Uncertain):
            await gw.send_text(message())


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_credentials_are_about_the_instance(status: int) -> None:
    from streams.kernel.errors import InstanceUnavailableError

    body = {"error": f"key {API_KEY} refused"}
    async with client(answer(status, body)) as gw:
        with pytest.raises(InstanceUnavailableError) as info:
            await gw.send_text(message())
    assert info.value.scope == "instance" and API_KEY not in str(info.value)


@pytest.mark.parametrize("status", [400, 404, 409, 422])
async def test_permanent_statuses_carry_masked_reason(status: int) -> None:
    # A gateway that echoes everything back must not leak it into our error.
    body = {"error": f"invalid recipient {PHONE} for text {TEXT!r} with key {API_KEY}"}
    async with client(answer(status, body)) as gw:
        with pytest.raises(PermanentGatewayError) as info:
            await gw.send_text(message())
    text = str(info.value)
    assert info.value.status_code == status
    assert "invalid recipient" in text
    assert PHONE not in text
    assert TEXT not in text
    assert API_KEY not in text


async def test_not_started_raises() -> None:
    gw = StackZapClient(settings())
    with pytest.raises(RuntimeError, match="not started"):
        await gw.send_text(message())


async def test_stop_is_idempotent_and_start_twice_is_harmless() -> None:
    async with FakeGateway(answer(200, {"id": "j", "status": "queued"})) as fake:
        gw = StackZapClient(settings(stackzap_api_url=fake.url))
        await gw.start()
        await gw.start()
        await gw.send_text(message())
        await gw.stop()
        await gw.stop()
        with pytest.raises(RuntimeError):
            await gw.send_text(message())


def test_factory_builds_stackzap() -> None:
    gw = build_gateway(settings())
    assert isinstance(gw, StackZapClient)
    assert gw.name == "stackzap"


# --- listing -----------------------------------------------------------------------


def listing_handler(total: int, seen: list[Seen]) -> Handler:
    def handler(request: Seen) -> Reply:
        seen.append(request)
        page = int(request.params.get("page", "1"))
        size = int(request.params["page_size"])
        start = (page - 1) * size
        items = [
            {
                "id": f"j{i}",
                "to": PHONE,
                "text": TEXT,
                "status": "queued" if i % 2 else "sent",
                "reference": f"att-{i}",
                "created_at": "2024-01-01T00:00:00+00:00",
            }
            for i in range(start, min(start + size, total))
        ]
        return Reply(
            200,
            json={
                "items": items,
                "page": page,
                "page_size": size,
                "total": total,
                "counts": {"queued": total // 2, "sent": total - total // 2},
                "next_page": page + 1 if start + size < total else None,
            },
        )

    return handler


async def test_list_jobs_request_and_parse() -> None:
    seen: list[Seen] = []
    async with client(listing_handler(5, seen)) as gw:
        page = await gw.list_jobs("inst 1", page=1, page_size=3, status="queued")
    (request,) = seen
    assert request.method == "GET"
    assert request.raw_path.startswith("/base/v1/instances/inst%201/send-queue?")
    assert dict(request.params) == {"page": "1", "page_size": "3", "status": "queued"}
    assert request.headers["X-API-Key"] == API_KEY
    assert page.page == 1
    assert page.page_size == 3
    assert page.total == 5
    assert page.next_page == 2
    assert page.counts == {"queued": 2, "sent": 3}
    assert [j.id for j in page.items] == ["j0", "j1", "j2"]
    first = page.items[0]
    assert first == GatewayJob(
        id="j0",
        gateway_status="sent",
        status=JobStatus.ACCEPTED,
        reference="att-0",
        created_at="2024-01-01T00:00:00+00:00",
        to=PHONE,
        text=TEXT,
    )
    # Phone numbers and texts never show up in a repr that might be logged.
    assert PHONE not in repr(first)
    assert TEXT not in repr(first)


async def test_list_jobs_omits_page_when_not_given() -> None:
    seen: list[Seen] = []
    async with client(listing_handler(1, seen)) as gw:
        page = await gw.list_jobs("i")
    assert dict(seen[0].params) == {"page_size": "100"}
    assert page.next_page is None


async def test_iter_jobs_follows_three_pages() -> None:
    seen: list[Seen] = []
    async with client(listing_handler(7, seen)) as gw:
        pages = [p async for p in gw.iter_pages("i", page_size=3)]
        jobs = [j async for j in gw.iter_jobs("i", page_size=3)]
    assert [p.page for p in pages] == [1, 2, 3]
    assert [len(p.items) for p in pages] == [3, 3, 1]
    assert [j.reference for j in jobs] == [f"att-{i}" for i in range(7)]
    assert [r.params.get("page") for r in seen[:3]] == [None, "2", "3"]


async def test_iter_pages_refuses_a_listing_that_does_not_advance() -> None:
    body = {"items": [], "page": 2, "page_size": 1, "total": 3, "next_page": 2}
    async with client(answer(200, body)) as gw:
        with pytest.raises(PermanentGatewayError, match="page 2 to 2"):
            _ = [p async for p in gw.iter_pages("i")]


async def test_listing_without_references_and_with_fallback_keys() -> None:
    body = {"items": [{"jobId": 5, "state": "mystery"}], "next_page": None}
    async with client(answer(200, body)) as gw:
        page = await gw.list_jobs("i", page=4, page_size=10)
    (job,) = page.items
    assert job.id == "5"
    assert job.reference is None
    assert job.status is JobStatus.REVIEW
    assert (page.page, page.page_size, page.total, page.counts) == (4, 10, None, {})


@pytest.mark.parametrize(
    "body",
    [
        b"nope",
        "7-1",
        [1],
        {"items": "x"},
        {"items": [1]},
        {"payload": "7-1", "entries_b64": "x"},
        {"items": [{"ref": "7-1"}]},
        {"a": [{"id": 1}], "b": [{"id": 2}]},
    ],
)
async def test_malformed_listing_is_unreadable_not_permanent(body: Any) -> None:
    async with client(answer(200, body)) as gw:
        with pytest.raises(ListingUnreadable) as info:
            await gw.list_jobs("i")
    assert not isinstance(info.value, PermanentGatewayError)
    assert "7-1" not in str(info.value)  # keys are named, values never


async def test_listing_errors_are_classified() -> None:
    async with client(answer(503, {"error": "down"}, {"Retry-After": "2"})) as gw:
        with pytest.raises(TransientGatewayError) as info:
            await gw.list_jobs("i")
    assert info.value.retry_after_s == 2.0


# --- cancel ------------------------------------------------------------------------


async def test_cancel_queued_job() -> None:
    seen: list[Seen] = []

    def handler(request: Seen) -> Reply:
        seen.append(request)
        return Reply(200, json={"id": "j/1", "status": "cancelled"})

    async with client(handler) as gw:
        assert await gw.cancel("inst 1", "j/1") is True
    (request,) = seen
    assert request.method == "POST"
    assert request.raw_path == "/base/v1/instances/inst%201/send-queue/j%2F1/cancel"
    assert request.headers["X-API-Key"] == API_KEY


async def test_cancel_too_late_is_false() -> None:
    async with client(answer(409, {"error": "job already sent"})) as gw:
        assert await gw.cancel("i", "j") is False


async def test_cancel_answer_with_other_label_is_false() -> None:
    async with client(answer(200, {"id": "j", "status": "sent"})) as gw:
        assert await gw.cancel("i", "j") is False


async def test_cancel_2xx_without_label_is_true() -> None:
    async with client(answer(204, b"")) as gw:
        assert await gw.cancel("i", "j") is True


async def test_cancel_unknown_job_is_permanent() -> None:
    async with client(answer(404, {"error": "unknown job"})) as gw:
        with pytest.raises(PermanentGatewayError) as info:
            await gw.cancel("i", "j")
    assert info.value.status_code == 404


async def test_cancel_read_timeout_is_uncertain() -> None:
    async with client(failing(Fault.STALL), **FAST) as gw:
        with pytest.raises(UncertainGatewayError):
            await gw.cancel("i", "j")
