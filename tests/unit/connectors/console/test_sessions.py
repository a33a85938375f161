"""Login sessions, the login throttle, and what the console logs, through the app.

The clock is a fake (monotonic seconds the test moves): expiry and throttling are
measured in its time, never by sleeping. Nothing here reaches PostgreSQL: a handler that
would is either not reached or given a stand-in for its one database call.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from connectors.console import app as console_app
from connectors.console.app import build_app
from connectors.console.auth import cookie_name
from connectors.console.login_throttle import (
    BASE_DELAY_S,
    GLOBAL_BURST,
    LOG_WINDOW_S,
    MAX_DELAY_S,
    LoginThrottle,
)
from connectors.console.sessions import SessionStore
from connectors.console.settings import ConsoleSettings, Operator, Role
from connectors.ops.actions import Action, BulkPlan
from connectors.ops.job_filter import JobFilter

ALICE = "alice-token-0123456789abcdef0123456789"
VICTOR = "victor-token-0123456789abcdef0123456789"
TOKENS_JSON = json.dumps(
    {
        ALICE: {"operator": "alice", "role": "operator"},
        VICTOR: {"operator": "victor", "role": "viewer"},
    }
)
COOKIE = cookie_name(secure=False)
IDLE_S, MAX_S = 1800.0, 12 * 3600.0


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the session store ----------------------------------------------------------------------


def test_a_session_id_is_random_and_stands_for_its_operator() -> None:
    clock = FakeClock()
    store = SessionStore(idle_s=IDLE_S, max_s=MAX_S, clock=clock)
    alice = Operator("alice", Role.OPERATOR)
    first, second = store.open(alice), store.open(alice)
    assert first != second and len(first) >= 43  # 32 random bytes, base64url
    assert store.find(first) == alice and store.find(second) == alice
    assert store.find("made-up") is None and store.find(None) is None
    assert store.find("\udcff" + first) is None  # an undecodable cookie is nobody's


def test_a_session_ends_when_idle_and_at_its_absolute_limit() -> None:
    clock = FakeClock()
    store = SessionStore(idle_s=IDLE_S, max_s=MAX_S, clock=clock)
    alice = Operator("alice", Role.OPERATOR)
    idle = store.open(alice)
    clock.now += IDLE_S
    assert store.find(idle) is None and len(store) == 0
    busy = store.open(alice)
    for _ in range(int(MAX_S // (IDLE_S / 2)) - 1):
        clock.now += IDLE_S / 2  # used every 15 minutes: never idle
        assert store.find(busy) == alice
    clock.now += IDLE_S / 2
    assert store.find(busy) is None  # 12 hours after the login


def test_closing_a_session_ends_it_and_the_store_stays_bounded() -> None:
    clock = FakeClock()
    store = SessionStore(idle_s=IDLE_S, max_s=MAX_S, clock=clock, max_sessions=3)
    alice = Operator("alice", Role.OPERATOR)
    session = store.open(alice)
    assert store.close(session) and store.find(session) is None and not store.close(session)
    ids = []
    for _ in range(5):
        clock.now += 1
        ids.append(store.open(alice))
    assert len(store) == 3 and store.find(ids[0]) is None and store.find(ids[-1]) == alice


# --- the throttle ---------------------------------------------------------------------------


def test_an_address_waits_longer_after_each_failure_and_starts_over_after_a_success() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(clock)
    assert throttle.wait_s("10.0.0.1") is None
    waits = []
    for _ in range(9):
        throttle.failed("10.0.0.1")
        wait = throttle.wait_s("10.0.0.1")
        assert wait is not None
        waits.append(wait)
        clock.now += wait
    assert waits == [min(MAX_DELAY_S, BASE_DELAY_S * 2**n) for n in range(9)]
    assert throttle.wait_s("10.0.0.2") is None  # another address is not held up
    throttle.succeeded("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") is None


def test_failures_from_many_addresses_hold_up_every_login() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(clock)
    for n in range(GLOBAL_BURST):
        throttle.failed(f"10.0.1.{n}")
    wait = throttle.wait_s("192.0.2.7")  # never failed itself
    assert wait is not None and wait > 0
    clock.now += wait
    assert throttle.wait_s("192.0.2.7") is None


def test_failed_logins_are_logged_once_a_window_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    throttle = LoginThrottle(clock)
    with caplog.at_level(logging.WARNING, logger="zapstream.console"):
        for n in range(50):
            throttle.failed(f"10.0.2.{n % 5}")
            clock.now += 0.5
        clock.now += LOG_WINDOW_S
        throttle.failed("10.0.2.9")
    lines = [r.getMessage() for r in caplog.records if "failed login" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].startswith("console: 1 failed login(s) from 1 address(es)")
    assert lines[1].startswith("console: 50 failed login(s) from 6 address(es)")


# --- the app ----------------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def client(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    monkeypatch.setenv("ZAPSTREAM_CONSOLE_TOKENS", TOKENS_JSON)
    monkeypatch.setenv("ZAPSTREAM_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    settings = ConsoleSettings(session_idle_s=IDLE_S, session_max_s=MAX_S)
    test_client = TestClient(TestServer(build_app(settings, clock=clock)))
    await test_client.start_server()
    yield test_client
    await test_client.close()


async def _log_in(client: TestClient, token: str = ALICE) -> str:  # type: ignore[type-arg]
    response = await client.post("/login", data={"token": token}, allow_redirects=False)
    assert response.status == 303, response.status
    return response.cookies[COOKIE].value


async def _visit(client: TestClient, session: str | None) -> ClientResponse:  # type: ignore[type-arg]
    """``/nowhere`` needs a login like every page and reaches no database: 404 when in."""
    cookies = {COOKIE: session} if session is not None else {}
    client.session.cookie_jar.clear()
    return await client.get("/nowhere", cookies=cookies, allow_redirects=False)


async def test_the_cookie_is_a_session_id_not_the_token(client: TestClient) -> None:  # type: ignore[type-arg]
    response = await client.post("/login", data={"token": ALICE}, allow_redirects=False)
    cookie = response.cookies[COOKIE]
    assert cookie.value != ALICE and ALICE not in response.headers.getall("Set-Cookie")[0]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert int(cookie["max-age"]) == int(MAX_S)
    assert (await _visit(client, cookie.value)).status == 404  # logged in
    assert (await _visit(client, ALICE)).status == 303  # the token is no cookie


async def test_an_idle_session_is_refused_and_sent_to_the_login(
    client: TestClient,  # type: ignore[type-arg]
    clock: FakeClock,
) -> None:
    session = await _log_in(client)
    clock.now += IDLE_S - 1
    assert (await _visit(client, session)).status == 404
    clock.now += IDLE_S - 1  # used a moment ago: still alive
    assert (await _visit(client, session)).status == 404
    clock.now += IDLE_S
    refused = await _visit(client, session)
    assert refused.status == 303 and refused.headers["Location"] == "/login?ended=1"
    assert refused.cookies[COOKIE].value == ""  # the browser is told to drop it
    page = await client.get("/login?ended=1")
    assert "Your session ended" in await page.text()


async def test_a_session_used_all_day_ends_at_its_absolute_limit(
    client: TestClient,  # type: ignore[type-arg]
    clock: FakeClock,
) -> None:
    session = await _log_in(client)
    while clock.now + 600 < 1000.0 + MAX_S:
        clock.now += 600
        assert (await _visit(client, session)).status == 404
    clock.now = 1000.0 + MAX_S
    refused = await _visit(client, session)
    assert refused.status == 303 and refused.headers["Location"].startswith("/login")


async def test_logout_revokes_the_session_on_the_server(client: TestClient) -> None:  # type: ignore[type-arg]
    session = await _log_in(client)
    out = await client.post("/logout", cookies={COOKIE: session}, allow_redirects=False)
    assert out.status == 303 and out.headers["Location"] == "/login"
    # A copy of the cookie kept elsewhere (another tab, a stolen one) is dead too.
    assert (await _visit(client, session)).status == 303


async def test_a_new_login_gets_a_new_session_and_ends_the_one_it_brought(
    client: TestClient,  # type: ignore[type-arg]
) -> None:
    first = await _log_in(client)
    response = await client.post(
        "/login", data={"token": ALICE}, cookies={COOKIE: first}, allow_redirects=False
    )
    second = response.cookies[COOKIE].value
    assert second != first
    assert (await _visit(client, first)).status == 303
    assert (await _visit(client, second)).status == 404


async def test_wrong_logins_are_throttled_in_the_clocks_time(
    client: TestClient,  # type: ignore[type-arg]
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 300 wrong tokens at once (the review ran them in 0.08 s): one is checked.
    with caplog.at_level(logging.INFO, logger="zapstream.console"):
        statuses = [
            (await client.post("/login", data={"token": f"guess-{n:032d}"})).status
            for n in range(300)
        ]
    assert statuses[0] == 401 and set(statuses[1:]) == {429}
    # Throttled, even the right token is refused unchecked: the answer tells nothing.
    right = await client.post("/login", data={"token": ALICE}, allow_redirects=False)
    assert right.status == 429 and COOKIE not in right.cookies
    # Ten wrong tokens checked take at least the doubling waits, in the clock's time.
    started, checked = clock.now, 1
    while checked < 10:
        response = await client.post("/login", data={"token": f"guess-{checked:032d}"})
        if response.status == 429:
            clock.now += float(response.headers["Retry-After"])
        else:
            assert response.status == 401
            checked += 1
    least = sum(min(MAX_DELAY_S, BASE_DELAY_S * 2**n) for n in range(9))
    assert clock.now - started >= least
    clock.now += MAX_DELAY_S
    await _log_in(client)  # waited out: the right token works, and starts the count over
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "failed login" in logged and "guess-" not in logged and ALICE not in logged
    # Bearer tokens are checked by the same throttle.
    for _ in range(2):
        await client.get("/jobs", headers={"Authorization": "Bearer " + "x" * 40})
    bearer = await client.get("/jobs", headers={"Authorization": f"Bearer {ALICE}"})
    assert bearer.status == 429 and "Retry-After" in bearer.headers


async def test_a_newline_in_the_path_forges_no_log_line(
    client: TestClient,  # type: ignore[type-arg]
    caplog: pytest.LogCaptureFixture,
) -> None:
    forged = "/jobs%0A2026-12-04 12:00:00 INFO zapstream.console: POST /jobs/bulk 303 admin%1B[2J"
    forged = forged.replace(" ", "%20")
    with caplog.at_level(logging.INFO, logger="zapstream.console"):
        response = await client.get(URL(forged, encoded=True), allow_redirects=False)
    assert response.status == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "zapstream.console"]
    assert lines and all("\n" not in line and "\x1b" not in line for line in lines)
    assert any("/jobs\\x0a2026-12-04" in line and "\\x1b[2J" in line for line in lines)


async def _raw_request(client: TestClient, head: bytes) -> int:  # type: ignore[type-arg]
    """Send request bytes as they are (a client library would refuse them); the status."""
    server = client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(head)
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return int(status_line.split()[1])


@pytest.mark.parametrize(
    "header",
    [
        b"Cookie: " + COOKIE.encode() + b"=\xff\xfe\xc3(",
        b"Cookie: \xff=\xfe",
        b"Authorization: Bearer \xff\xfe" + b"a" * 40,
        b"Authorization: \xc3\x28",
    ],
)
async def test_undecodable_cookie_or_authorization_headers_are_refused_not_a_500(
    client: TestClient,  # type: ignore[type-arg]
    header: bytes,
) -> None:
    head = b"GET /jobs HTTP/1.1\r\nHost: localhost\r\n" + header + b"\r\nConnection: close\r\n\r\n"
    assert await _raw_request(client, head) in (303, 401)


@pytest.mark.parametrize("path", ["/jobs/%C2%B2", "/jobs/" + "9" * 40, "/jobs/-1"])
async def test_hostile_job_ids_are_a_404(client: TestClient, path: str) -> None:  # type: ignore[type-arg]
    session = await _log_in(client)
    client.session.cookie_jar.clear()
    response = await client.get(URL(path, encoded=True), cookies={COOKIE: session})
    assert response.status == 404


# --- bulk reprocess: the "may be sent twice" confirmation ------------------------------------


@pytest.fixture
def stand_in_database(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The bulk handler's database calls, answered here: a plan with one risky job; the
    requests it would write are recorded instead."""
    requested: list[list[int]] = []

    async def run(request: web.Request, work: Callable[[Any], Any]) -> Any:
        return work(None)

    def plan_many(conn: Any, action: Action, job_filter: JobFilter, *, limit: int) -> BulkPlan:
        return BulkPlan(action, job_filter, total=3, chosen=[1, 2, 3], risky=[2])

    def request_many(conn: Any, plan: BulkPlan, *, reason: str, actor: str) -> list[int]:
        requested.append(list(plan.chosen))
        return [10 + job_id for job_id in plan.chosen]

    monkeypatch.setattr(console_app, "_db", run)
    monkeypatch.setattr(console_app, "database_now", lambda conn: dt.datetime.now(dt.UTC))
    monkeypatch.setattr(console_app, "plan_many", plan_many)
    monkeypatch.setattr(console_app, "request_many", request_many)
    return requested


async def test_a_bulk_reprocess_that_may_send_twice_needs_the_box_ticked(
    client: TestClient,  # type: ignore[type-arg]
    stand_in_database: list[list[int]],
) -> None:
    auth = {"Authorization": f"Bearer {ALICE}"}
    form = {"action": "reprocess", "reason": "gateway fixed", "state": "UNCERTAIN"}
    preview = await client.post("/jobs/bulk", data=form, headers=auth)
    assert preview.status == 200
    assert 'name="accept_duplicate"' in await preview.text()
    confirmed = await client.post(
        "/jobs/bulk", data={**form, "confirm": "yes"}, headers=auth, allow_redirects=False
    )
    assert confirmed.status == 409 and stand_in_database == []
    assert "may be sent twice" in await confirmed.text()
    accepted = await client.post(
        "/jobs/bulk",
        data={**form, "confirm": "yes", "accept_duplicate": "yes"},
        headers=auth,
        allow_redirects=False,
    )
    assert accepted.status == 303 and stand_in_database == [[1, 2, 3]]
    assert "reprocess+requested+for+3" in accepted.headers["Location"]
