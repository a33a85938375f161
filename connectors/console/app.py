"""``zapstream console``: the operators' web console, an aiohttp app served by the process.

Routes: ``/login`` (token form, opens a session), ``/logout``, ``/jobs`` (filters,
pagination, bulk cancel/reprocess with a count preview), ``/jobs/{id}`` (one
job's history, cancel, reprocess), ``/lag`` (consumer lag per partition and the
replication slots' lag), ``/overview`` (the landing page: jobs by state, oldest
waiting per instance, pauses, lag at a glance; :mod:`connectors.console.overview`).
Every other request needs a login session (its cookie, :mod:`connectors.console.sessions`)
or a token in an ``Authorization: Bearer`` header; without either the answer is 401 with
the login form, and a session that ended sends the browser to ``/login``. Each token
check is throttled (:mod:`connectors.console.login_throttle`): while a client must wait
the answer is 429 and the token is not checked.

Database calls are sync psycopg run in a thread (:func:`asyncio.to_thread`), a
connection per request. Actions are planned and requested by
:mod:`connectors.ops.actions`, the core ``zapstream jobs cancel|reprocess`` calls
(the same refusals, the same delivered-already warning, the same filter and
durations, the same "may be sent twice" confirmation), with the operator's name
from the token as the actor; the worker applies them through Kafka and answers in
the job's events. aiohttp's access log is off (a query string may hold an
idempotency key); one line per request says method, path, status and operator,
with control characters escaped (:func:`connectors.console.log_text.loggable`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import psycopg
from aiohttp import web

from connectors.console import pages
from connectors.console.auth import authenticate, bearer_token, cookie_name
from connectors.console.log_text import loggable
from connectors.console.login_throttle import LoginThrottle
from connectors.console.overview import overview_page
from connectors.console.overview_sql import read_overview
from connectors.console.queries import fetch_text, slot_lags
from connectors.console.sessions import Clock, SessionStore
from connectors.console.settings import ConsoleSettings, Operator
from connectors.ops.actions import Action, BulkPlan, plan_many, plan_one, request_many, request_one
from connectors.ops.durations import parse_duration, parse_instant
from connectors.ops.job_filter import JobFilter
from connectors.ops.jobs_render import when
from connectors.ops.jobs_sql import JobHistory, database_now, fetch_history, fetch_page
from connectors.ops.status import read_consumer_lag
from connectors.outbox.commands import InvalidCommand
from connectors.outbox.schedule import NotRescheduled, reschedule
from streams.kernel.contract import JobStatus
from streams.kernel.runtime.health import IDLE_CONNECTION_TIMEOUT_S
from streams.kernel.runtime.outage import OutageLog
from streams.kernel.runtime.service import Service
from streams.kernel.state_machine import REPROCESSABLE

__all__ = ["ConsoleServer", "FilterError", "build_app", "parse_filter"]

log = logging.getLogger("zapstream.console")

_T = TypeVar("_T")
_OPERATORS: web.AppKey[dict[bytes, Operator]] = web.AppKey("operators")
_SETTINGS = web.AppKey("settings", ConsoleSettings)
_SESSIONS = web.AppKey("sessions", SessionStore)
_THROTTLE = web.AppKey("throttle", LoginThrottle)
_COOKIE = web.AppKey("cookie", str)
"""The session cookie's name (:func:`connectors.console.auth.cookie_name`)."""
_WHO = web.RequestKey("operator", Operator)
"""Where the guard leaves the request's operator for the handlers."""


_DB_STATE = web.AppKey("db_state", OutageLog)
"""The database's outages as the console's requests meet them: logged once each way."""
FILTER_FIELDS = ("state", "instance", "priority", "purpose", "period", "q")
_PUBLIC = frozenset({"/login"})
LAG_TIMEOUT_S = 3.0
"""How long the lag page waits for the lag monitor's metrics."""


class FilterError(ValueError):
    """A filter field the console cannot use; the message names it."""


def parse_filter(
    query: Mapping[str, str], *, now: dt.datetime
) -> tuple[JobFilter, int, dict[str, str]]:
    """The filter, the page number and the cleaned form fields of a ``/jobs`` query."""
    form = {name: query.get(name, "").strip() for name in FILTER_FIELDS}
    statuses: list[str] = []
    if form["state"]:
        try:
            statuses = [JobStatus(form["state"].upper()).value]
        except ValueError:
            raise FilterError(f"state: unknown status {form['state']!r}") from None
        form["state"] = statuses[0]
    since = None
    if form["period"]:
        try:
            since = now - parse_duration(form["period"])
        except (ValueError, OverflowError) as exc:  # OverflowError: before year 1
            raise FilterError(f"period: {exc}") from None
    raw_page = query.get("page", "1").strip() or "1"
    # ASCII digits only ("²".isdigit() is true, int("²") fails), and a page OFFSET fits.
    if not (raw_page.isascii() and raw_page.isdigit()) or len(raw_page) > 9 or int(raw_page) < 1:
        raise FilterError(f"page: must be a positive integer, not {raw_page!r}")
    job_filter = JobFilter(
        statuses=statuses,
        instance=form["instance"] or None,
        priority=form["priority"] or None,
        purpose=form["purpose"] or None,
        since=since,
        search=form["q"] or None,
    )
    return job_filter, int(raw_page), form


# --- plumbing ---------------------------------------------------------------------------------


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(
        text=text,
        status=status,
        content_type="text/html",
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
            "img-src 'self'; form-action 'self'; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff",
        },
    )


def _client(request: web.Request) -> str:
    """The client's address for the login throttle (the TCP peer, not a forwarded header)."""
    return request.remote or "-"


def _check_token(request: web.Request, token: str) -> Operator | web.Response:
    """The operator of ``token``, or the answer when it may not be checked now (429) or is
    wrong (401 with the login form). Throttled before the check, counted after it."""
    throttle = request.app[_THROTTLE]
    client = _client(request)
    wait_s = throttle.wait_s(client)
    if wait_s is not None:
        response = _html(
            pages.login_page(failed=True, why="Too many failed logins: try again later."), 429
        )
        response.headers["Retry-After"] = str(max(1, math.ceil(wait_s)))
        return response
    operators: dict[bytes, Operator] = request.app[_OPERATORS]
    operator = authenticate(operators, token)
    if operator is None:
        throttle.failed(client)
        return _html(pages.login_page(failed=True), status=401)
    throttle.succeeded(client)
    return operator


def _identify(request: web.Request) -> Operator | web.Response:
    """Who sends the request (a Bearer token, else the session cookie), or the answer to a
    request nobody may send: 429/401 for a token, 303 to /login for a session that ended,
    401 with the login form without either."""
    token = bearer_token(request.headers.get("Authorization"))
    if token is not None:
        return _check_token(request, token)
    cookie = request.app[_COOKIE]
    session_id = request.cookies.get(cookie)
    if session_id is None:
        return _html(pages.login_page(failed=False), status=401)
    operator = request.app[_SESSIONS].find(session_id)
    if operator is None:
        # A plain 303 (returning an HTTPException instance is deprecated in aiohttp).
        response = web.Response(status=303, headers={"Location": "/login?ended=1"})
        _forget_cookie(request, response)
        return response
    return operator


def _forget_cookie(request: web.Request, response: web.StreamResponse) -> None:
    """Tell the browser to drop the session cookie (a ``__Host-`` one only goes with the
    attributes it was set with)."""
    secure = request.app[_SETTINGS].cookie_secure
    response.del_cookie(
        request.app[_COOKIE], path="/", secure=secure, httponly=True, samesite="Strict"
    )


def _operator(request: web.Request) -> Operator:
    """The operator of a request the guard let through (it checked there is one)."""
    operator = request.get(_WHO)
    if not isinstance(operator, Operator):
        raise web.HTTPUnauthorized()
    return operator


async def _db(request: web.Request, work: Callable[[psycopg.Connection[Any]], _T]) -> _T:
    """Run ``work`` on a fresh autocommit connection, in a thread."""
    dsn = request.app[_SETTINGS].postgres.dsn

    def run() -> _T:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            return work(conn)

    return await asyncio.to_thread(run)


@web.middleware
async def _guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Authenticate, refuse cross-site posts, turn an unreachable database into a 503."""
    operator: Operator | None = None
    status = 500
    try:
        if request.path not in _PUBLIC:
            found = _identify(request)
            if isinstance(found, web.StreamResponse):
                status = found.status
                return found
            operator = request[_WHO] = found
        if request.method == "POST" and not _same_origin(request):
            status = 403
            return _html(pages.message_page("Refused", "cross-site request", operator), 403)
        outage = request.app[_DB_STATE]
        try:
            response = await handler(request)
            outage.recovered()
        except psycopg.OperationalError as exc:
            outage.failed(type(exc).__name__)
            response = _html(
                pages.message_page(
                    "Database unreachable",
                    "PostgreSQL cannot be reached (ZAPSTREAM_DATABASE_URL); try again.",
                    operator,
                ),
                status=503,
            )
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        who = operator.name if operator is not None else "-"
        # The decoded path: %0A is a newline by now, so every value is escaped.
        log.info(
            "%s %s %d %s",
            loggable(request.method, 20),
            loggable(request.path),
            status,
            loggable(who, 100),
        )


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return origin is None
    return origin.split("://", 1)[-1] == request.host


def _may_act(request: web.Request) -> web.Response | None:
    operator = _operator(request)
    if operator.role.can_act:
        return None
    return _html(
        pages.message_page("Not allowed", "viewers cannot cancel or reprocess jobs", operator),
        status=403,
    )


# --- handlers ---------------------------------------------------------------------------------


async def _login_form(request: web.Request) -> web.Response:
    ended = "ended" in request.query
    why = "Your session ended: log in again." if ended else None
    return _html(pages.login_page(failed=False, why=why))


async def _login(request: web.Request) -> web.StreamResponse:
    """Check the form's token (throttled) and open a session; the cookie holds its id."""
    token = str((await request.post()).get("token", "")).strip()
    found = _check_token(request, token)
    if isinstance(found, web.StreamResponse):
        return found
    sessions = request.app[_SESSIONS]
    cookie = request.app[_COOKIE]
    sessions.close(request.cookies.get(cookie))  # a new id at each login, never the old one
    session_id = sessions.open(found)
    log.info("console: %s logged in (%s)", loggable(found.name, 100), found.role.value)
    settings = request.app[_SETTINGS]
    response = web.HTTPSeeOther("/jobs")
    response.set_cookie(
        cookie,
        session_id,
        httponly=True,
        samesite="Strict",
        path="/",
        secure=settings.cookie_secure,
        max_age=int(settings.session_max_s),
    )
    raise response


async def _logout(request: web.Request) -> web.StreamResponse:
    """End the session on the server, not only in the browser."""
    cookie = request.app[_COOKIE]
    request.app[_SESSIONS].close(request.cookies.get(cookie))
    response = web.HTTPSeeOther("/login")
    _forget_cookie(request, response)
    raise response


async def _root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPSeeOther("/overview")


async def _jobs(request: web.Request) -> web.Response:
    operator = _operator(request)
    settings = request.app[_SETTINGS]
    now = await _db(request, database_now)
    try:
        job_filter, page_number, form = parse_filter(request.query, now=now)
    except FilterError as exc:
        return _html(pages.message_page("Bad filter", str(exc), operator), status=400)
    page = await _db(
        request,
        lambda conn: fetch_page(conn, job_filter, page=page_number, page_size=settings.page_size),
    )
    notice = request.query.get("notice")
    return _html(pages.jobs_page(page, form, operator, now=now, notice=notice))


def _job_id(request: web.Request) -> int:
    raw = request.match_info["job_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise web.HTTPNotFound()
    return int(raw)


async def _job(request: web.Request) -> web.Response:
    operator = _operator(request)
    job_id = _job_id(request)

    def load(conn: psycopg.Connection[Any]) -> tuple[JobHistory | None, str | None]:
        story = fetch_history(conn, job_id=job_id)
        text = fetch_text(conn, job_id) if story and operator.role.sees_text else None
        return story, text

    story, text = await _db(request, load)
    if story is None:
        return _html(pages.message_page("No such job", f"no job {job_id}", operator), 404)
    notice = request.query.get("notice")
    return _html(pages.job_page(story, operator, text=text, notice=notice))


async def _reason(request: web.Request) -> tuple[str, Mapping[str, str]]:
    data = {k: str(v) for k, v in (await request.post()).items()}
    return data.get("reason", "").strip(), data


def _back_to_job(job_id: int, notice: str) -> web.HTTPSeeOther:
    from urllib.parse import urlencode

    return web.HTTPSeeOther(f"/jobs/{job_id}?{urlencode({'notice': notice})}")


def _act_on_one(
    conn: psycopg.Connection[Any],
    action: Action,
    job_id: int,
    reason: str,
    actor: str,
    *,
    accepted: bool = False,
) -> str:
    """Plan ``action`` on the job, refuse what the core refuses, else request it: the notice."""
    plan = plan_one(conn, action, job_id)
    if plan is None:
        return f"no job {job_id}"
    if plan.refused:
        if plan.job.status == JobStatus.INVALID and action is Action.CANCEL:
            return f"job {job_id} is INVALID: it was never sent; nothing to cancel"
        allowed = ", ".join(sorted(REPROCESSABLE))
        return f"not reprocessed: job {job_id} is {plan.job.status}; only {allowed} can be"
    if plan.risk is not None and not accepted:
        return (
            "not reprocessed: " + pages.duplicate_warning(plan.risk) + " Tick the box to accept it."
        )
    try:
        command_id = request_one(conn, action, job_id, reason=reason, actor=actor)
    except InvalidCommand as exc:
        return f"cannot {action} job {job_id}: {exc}"
    log.info(
        "console: %s asked to %s job %d (command %d)",
        loggable(actor, 100),
        action,
        job_id,
        command_id,
    )
    if action is Action.CANCEL:
        return (
            f"cancel requested (command {command_id}) by {actor}; "
            "the worker's answer appears in the history"
        )
    return f"reprocess requested (command {command_id}) by {actor}"


async def _cancel(request: web.Request) -> web.StreamResponse:
    if (refused := _may_act(request)) is not None:
        return refused
    operator = _operator(request)
    job_id = _job_id(request)
    reason, _ = await _reason(request)
    notice = await _db(
        request, lambda conn: _act_on_one(conn, Action.CANCEL, job_id, reason, operator.name)
    )
    raise _back_to_job(job_id, notice)


def _reschedule_one(conn: psycopg.Connection[Any], job_id: int, text: str, actor: str) -> str:
    """Move the SCHEDULED job to the time the form gave: the notice."""
    try:
        send_at = parse_instant(text)
    except ValueError as exc:
        return f"not rescheduled: {exc}"
    try:
        with conn.transaction():
            moved = reschedule(conn, job_id, send_at)
    except NotRescheduled as exc:
        return f"not rescheduled: {exc}"
    log.info("console: %s rescheduled job %d to %s", loggable(actor, 100), job_id, moved)
    return f"rescheduled by {actor}: due {when(moved)} UTC"


async def _reschedule(request: web.Request) -> web.StreamResponse:
    if (refused := _may_act(request)) is not None:
        return refused
    operator = _operator(request)
    job_id = _job_id(request)
    data = {k: str(v) for k, v in (await request.post()).items()}
    send_at = data.get("send_at", "").strip()
    notice = await _db(request, lambda conn: _reschedule_one(conn, job_id, send_at, operator.name))
    raise _back_to_job(job_id, notice)


async def _reprocess(request: web.Request) -> web.StreamResponse:
    if (refused := _may_act(request)) is not None:
        return refused
    operator = _operator(request)
    job_id = _job_id(request)
    reason, data = await _reason(request)
    accepted = data.get("accept_duplicate") == "yes"
    notice = await _db(
        request,
        lambda conn: _act_on_one(
            conn, Action.REPROCESS, job_id, reason, operator.name, accepted=accepted
        ),
    )
    raise _back_to_job(job_id, notice)


async def _bulk(request: web.Request) -> web.StreamResponse:
    if (refused := _may_act(request)) is not None:
        return refused
    operator = _operator(request)
    settings = request.app[_SETTINGS]
    reason, data = await _reason(request)
    try:
        action = Action(data.get("action", ""))
    except ValueError:
        return _html(pages.message_page("Bad request", "unknown action", operator), 400)
    if not reason:
        return _html(pages.message_page("Bad request", "a reason is required", operator), 400)
    now = await _db(request, database_now)
    try:
        job_filter, _, form = parse_filter(data, now=now)
    except FilterError as exc:
        return _html(pages.message_page("Bad filter", str(exc), operator), status=400)

    def plan(conn: psycopg.Connection[Any]) -> BulkPlan:
        return plan_many(conn, action, job_filter, limit=settings.bulk_limit)

    def preview(shown: BulkPlan, refused: str | None = None, status: int = 200) -> web.Response:
        fields = {**form, "action": action.value, "reason": reason}
        page = pages.bulk_preview_page(
            action=action.value,
            count=shown.total,
            risky=len(shown.risky),
            limit=settings.bulk_limit,
            fields=fields,
            operator=operator,
            refused=refused,
        )
        return _html(page, status)

    if data.get("confirm") != "yes":
        return preview(await _db(request, plan))
    accepted = data.get("accept_duplicate") == "yes"

    def act(conn: psycopg.Connection[Any]) -> tuple[BulkPlan, list[int] | None]:
        planned = plan(conn)
        # The preview and its button are the confirmation the plan asks for; one that may
        # send jobs twice also needs the box ticked, as one job's reprocess and --yes do.
        if planned.needs_confirmation and planned.risky and not accepted:
            return planned, None
        return planned, request_many(conn, planned, reason=reason, actor=operator.name)

    planned, asked = await _db(request, act)
    if asked is None:
        why = (
            f"not reprocessed: {len(planned.risky)} of these jobs may be sent twice. "
            "Tick the box to accept it."
        )
        return preview(planned, refused=why, status=409)
    requested = len(asked)
    log.info(
        "console: %s asked to %s %d jobs in bulk", loggable(operator.name, 100), action, requested
    )
    from urllib.parse import urlencode

    notice = f"{action} requested for {requested} job(s) by {operator.name}"
    query = urlencode({**{k: v for k, v in form.items() if v}, "notice": notice})
    raise web.HTTPSeeOther(f"/jobs?{query}")


async def _lag(request: web.Request) -> web.Response:
    consumer = await read_consumer_lag(request.app[_SETTINGS].lag_url, LAG_TIMEOUT_S)
    slots = await _db(request, slot_lags)
    return _html(pages.lag_page(consumer=consumer, slots=slots, operator=_operator(request)))


async def _overview(request: web.Request) -> web.Response:
    settings = request.app[_SETTINGS]
    consumer, slots, found = await asyncio.gather(
        read_consumer_lag(settings.lag_url, LAG_TIMEOUT_S),
        _db(request, slot_lags),
        read_overview(settings.postgres.dsn),
    )
    page = overview_page(found, consumer=consumer, slots=slots, operator=_operator(request))
    return _html(page)


# --- the app ------------------------------------------------------------------------------------


def build_app(settings: ConsoleSettings, *, clock: Clock = time.monotonic) -> web.Application:
    """The console's routes, guarded by the tokens of ``settings``; ``clock`` (monotonic
    seconds) times sessions and the login throttle."""
    app = web.Application(middlewares=[_guard], client_max_size=64 * 1024)
    app[_SETTINGS] = settings
    app[_OPERATORS] = settings.operators()
    app[_SESSIONS] = SessionStore(
        idle_s=settings.session_idle_s, max_s=settings.session_max_s, clock=clock
    )
    app[_THROTTLE] = LoginThrottle(clock)
    app[_COOKIE] = cookie_name(settings.cookie_secure)
    app[_DB_STATE] = OutageLog("console: PostgreSQL", log, retrying="answering 503")

    app.router.add_get("/", _root)
    app.router.add_get("/login", _login_form)
    app.router.add_post("/login", _login)
    app.router.add_post("/logout", _logout)
    app.router.add_get("/jobs", _jobs)
    app.router.add_post("/jobs/bulk", _bulk)
    app.router.add_get("/jobs/{job_id}", _job)
    app.router.add_post("/jobs/{job_id}/cancel", _cancel)
    app.router.add_post("/jobs/{job_id}/reprocess", _reprocess)
    app.router.add_post("/jobs/{job_id}/reschedule", _reschedule)
    app.router.add_get("/lag", _lag)
    app.router.add_get("/overview", _overview)
    return app


class ConsoleServer(Service):
    """``zapstream console``: the app served on ``ZAPSTREAM_CONSOLE_PORT`` until stopped.

    A port that cannot be listened on is a refused start (one line, exit 2). With
    ``ZAPSTREAM_CONSOLE_METRICS_PORT`` set, its metrics (failed logins) are served there.
    """

    name = "console"

    def __init__(self, settings: ConsoleSettings) -> None:
        from streams.kernel.runtime.health import HealthEndpoint

        super().__init__()
        self._settings = settings
        self._runner: web.AppRunner | None = None
        self.host = "127.0.0.1" if settings.bind_local else "0.0.0.0"  # noqa: S104
        self.add_child(
            HealthEndpoint(
                settings.metrics_port,
                bind_local=settings.metrics_bind_local,
                name="console",
                logger=log,
                port_setting="ZAPSTREAM_CONSOLE_METRICS_PORT",
            )
        )

    async def on_start(self) -> None:
        from streams.kernel.failures import StartRefused

        settings = self._settings
        runner = web.AppRunner(
            build_app(settings),
            access_log=None,
            handle_signals=False,
            keepalive_timeout=IDLE_CONNECTION_TIMEOUT_S,
        )
        await runner.setup()
        self._runner = runner  # closed by on_stop, also after a failed start
        try:
            await web.TCPSite(runner, self.host, settings.port).start()
        except OSError as exc:
            raise StartRefused(
                f"cannot listen on port {settings.port} ({exc.strerror or exc})",
                hint="set ZAPSTREAM_CONSOLE_PORT to a free port",
            ) from exc
        log.info(
            "console listening on http://%s:%d (%d operator token(s), lag %s; sessions in "
            "memory, idle %gs, at most %gs, cookie %s)",
            self.host,
            settings.port,
            len(settings.operators()),
            "from " + settings.lag_url if settings.lag_url else "not configured",
            settings.session_idle_s,
            settings.session_max_s,
            cookie_name(settings.cookie_secure) + ("; Secure" if settings.cookie_secure else ""),
        )

    async def on_stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def summary(self) -> str:
        return f"served on {self.host}:{self._settings.port}"
