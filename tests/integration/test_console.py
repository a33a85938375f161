"""``zapstream console`` end to end: a real pipeline, the console process, headless Chromium.

A :class:`LocalPipeline` (relay, worker, sink, gateway simulator, lag monitor)
holds jobs in several states: ACCEPTED, FAILED (the simulator refuses their
recipient), PENDING (their instance is paused), CANCELLED (the application
cancelled one), and then ``make dev``'s demo mix (:mod:`devtools.stack.demo_mix`: retried,
DEAD, UNCERTAIN, EXPIRED, INVALID, cancelled, and a second paused instance holding
two). The console runs as a ``zapstream console`` subprocess with
operator tokens; Chromium (Debian's ``chromium`` and ``chromium-driver``, through
Selenium) logs in (the cookie holds a session id, not the token), filters by state,
opens a job's history and cancels a PENDING job with a reason; PostgreSQL then says
the job is CANCELLED by that operator. A bulk reprocess of jobs that may be sent twice
is refused until its box is ticked; logging out ends the session on the server.
The overview page's figures (jobs by state, oldest waiting per instance, paused
instances, lag) are checked against PostgreSQL and the lag monitor.
The jobs list is saved as a screenshot (path printed; copied to
``tests/artifacts/console.png``) for a person to look at, like the overview
(``console-overview.png``).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from connectors.outbox.commands import cancel
from connectors.outbox.controls import pause_instance
from connectors.outbox.enqueue import enqueue
from devtools.stack.demo_mix import (
    PAUSE_REASON,
    PAUSED_INSTANCE,
    RETRY_SCHEDULE_S,
    DemoMix,
    MixReport,
)
from devtools.stack.devstack import ManagedProcess, find_free_port
from devtools.stack.local_pipeline import REPO_ROOT, LocalPipeline
from streams.kernel.contract import JobStatus
from tests.integration.support import wait_for_status, wait_until

pytestmark = pytest.mark.integration

OPERATOR_TOKEN = "op-" + "a" * 29
VIEWER_TOKEN = "view-" + "b" * 27
ADMIN_TOKEN = "adm-" + "c" * 28
TOKENS = {
    OPERATOR_TOKEN: {"operator": "alice", "role": "operator"},
    VIEWER_TOKEN: {"operator": "victor", "role": "viewer"},
    ADMIN_TOKEN: {"operator": "ada", "role": "admin"},
}
SESSION_COOKIE = "zapstream_session"
SENT, HELD = "shop-sent", "shop-held"
TEXT = "your order 4711 has shipped"


class Stage:
    """The running pipeline, the console's URL, and the jobs by the state they were put in."""

    def __init__(self, pipeline: LocalPipeline, url: str, console: ManagedProcess) -> None:
        self.pipeline = pipeline
        self.url = url
        self.console = console
        self.keys: dict[str, list[str]] = {}
        self.phones: list[str] = []
        self.mix: MixReport | None = None
        """``make dev``'s demo mix, made after the jobs above settled."""

    @property
    def job_count(self) -> int:
        """Every job in the outbox: the ones above (by state) and the mix's."""
        mine = sum(len(keys) for keys in self.keys.values())
        return mine + (len(self.mix.results) if self.mix else 0)

    def mix_held(self) -> int:
        """The mix's jobs held PENDING by its paused instance."""
        return sum(1 for r in self.mix.results if r.job.expected == "PENDING") if self.mix else 0


def _enqueue(dsn: str, instance: str, phones: list[str]) -> list[str]:
    keys = [f"console-{uuid.uuid4().hex[:10]}" for _ in phones]
    with psycopg.connect(dsn) as conn:
        for key, phone in zip(keys, phones, strict=True):
            enqueue(conn, instance_id=instance, to=phone, text=TEXT, idempotency_key=key)
    return keys


def _paused(worker_metrics: str, instance: str) -> bool:
    try:
        text = httpx.get(worker_metrics, timeout=2.0).text
    except httpx.HTTPError:
        return False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != "zapstream_control_paused":
                continue
            if sample.labels.get("target") == instance:
                return sample.value == 1
    return False


@pytest.fixture(scope="module")
def stage() -> Iterator[Stage]:
    with LocalPipeline(partitions=4) as pipeline:
        web_port = find_free_port()
        pipeline.start_relay()
        pipeline.start_worker(
            env={
                "ZAPSTREAM_WORKER_WEB_PORT": str(web_port),
                # The demo mix's retries, due in seconds as under `make dev`.
                "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": RETRY_SCHEDULE_S,
            }
        )
        _, lag_url = pipeline.start_lag_monitor(env={"ZAPSTREAM_LAG_INTERVAL_S": "1"})
        dsn = pipeline.dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            pause_instance(conn, HELD, reason="number under review", actor="ana")
        mix = DemoMix(
            pipeline,
            run=uuid.uuid4().hex[:8],
            worker_metrics_url=f"http://127.0.0.1:{web_port}/metrics",
        )
        mix.pause()
        wait_until(
            lambda: _paused(f"http://127.0.0.1:{web_port}/metrics", HELD),
            60,
            "the worker learning the pause",
        )
        accepted = [f"55119876500{i:02d}" for i in range(3)]
        failed = [f"55119876510{i:02d}" for i in range(2)]
        held = [f"55119876520{i:02d}" for i in range(4)]
        pipeline.sim_config(invalid_recipients=failed)
        port = find_free_port()
        console = pipeline.process(
            "console",
            ["console"],
            {
                "ZAPSTREAM_CONSOLE_TOKENS": json.dumps(TOKENS),
                "ZAPSTREAM_CONSOLE_PORT": str(port),
                "ZAPSTREAM_CONSOLE_LAG_URL": lag_url,
            },
        )
        console.start()
        s = Stage(pipeline, f"http://127.0.0.1:{port}", console)
        s.phones = accepted + failed + held
        s.keys["ACCEPTED"] = _enqueue(dsn, SENT, accepted)
        s.keys["FAILED"] = _enqueue(dsn, SENT, failed)
        s.keys["PENDING"] = _enqueue(dsn, HELD, held)
        with psycopg.connect(dsn) as conn:
            cancel(conn, s.keys["PENDING"][0], "customer changed their mind")
        s.keys["CANCELLED"] = [s.keys["PENDING"].pop(0)]
        for status in ("ACCEPTED", "FAILED", "CANCELLED"):
            wait_for_status(dsn, s.keys[status], status, 60)
        # After the jobs above settled: the UNCERTAIN one needs its send to be the only one.
        mix.run_mix(timeout_s=120)
        s.mix = mix.finish()
        s.phones += sorted({r.job.recipient for r in s.mix.results})
        console.wait_for_log(r"console listening", timeout_s=30)
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "chromium and chromedriver missing: run `make chromium`"
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,900")
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    chrome.implicitly_wait(5)
    try:
        yield chrome
    finally:
        chrome.quit()


def _no_full_number(page: str, phones: list[str]) -> None:
    shown = [p for p in phones if p in page or p[2:] in page]
    assert not shown, f"{len(shown)} full phone number(s) in the page"


def _screenshot(browser: WebDriver, stage: Stage, name: str) -> None:
    """Save the page under the pipeline's directory and copy it to tests/artifacts/."""
    shot = stage.pipeline.dir / name
    assert browser.save_screenshot(str(shot))
    artifacts = REPO_ROOT / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copy(shot, artifacts / name)
    print(f"\nconsole screenshot: {artifacts / name}")


def test_without_a_token_it_is_401_and_a_viewer_cannot_act(stage: Stage) -> None:
    assert httpx.get(f"{stage.url}/jobs").status_code == 401
    bad = httpx.get(f"{stage.url}/jobs", headers={"Authorization": "Bearer " + "x" * 32})
    assert bad.status_code == 401
    job_id = _job_id(stage.pipeline.dsn, stage.keys["PENDING"][-1])
    viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    # One wrong token holds this address up for a second, the right token included.
    throttled = httpx.get(f"{stage.url}/jobs", headers=viewer)
    assert throttled.status_code == 429 and throttled.headers["retry-after"] == "1"
    answers: list[httpx.Response] = []

    def let_through() -> bool:
        answers.append(httpx.get(f"{stage.url}/jobs", headers=viewer))
        return answers[-1].status_code != 429

    wait_until(let_through, 10, "the login throttle's wait after one wrong token", 0.25)
    listed = answers[-1]
    assert listed.status_code == 200 and "victor" in listed.text
    refused = httpx.post(
        f"{stage.url}/jobs/{job_id}/cancel", data={"reason": "try"}, headers=viewer
    )
    assert refused.status_code == 403
    with psycopg.connect(stage.pipeline.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_commands WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert row is not None and row[0] == 0
    # Only an admin sees the text.
    operator = httpx.get(
        f"{stage.url}/jobs/{job_id}", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    )
    admin = httpx.get(
        f"{stage.url}/jobs/{job_id}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert operator.status_code == admin.status_code == 200
    assert TEXT not in operator.text and TEXT in admin.text
    _no_full_number(admin.text, stage.phones)
    assert OPERATOR_TOKEN not in stage.console.log_tail(200)


def _navigate(browser: WebDriver, by: str, value: str) -> None:
    """Click what loads a new page, and return once that page has replaced the old one.

    WebDriver's click does not wait for a form's navigation: reading rows right
    after it can read the previous page's (a CI run saw all nine jobs after the
    PENDING filter was applied). The old page's root going stale is the signal.
    """
    old_root = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(by, value).click()
    WebDriverWait(browser, 20).until(lambda _: _gone(old_root))


def _gone(element: WebElement) -> bool:
    """``expected_conditions.staleness_of``, also when Chromium says so in other words: asked
    about a node of a page it just left, it can answer "Node with given id does not belong
    to the document" (an inspector error, not a StaleElementReferenceException)."""
    try:
        return bool(expected_conditions.staleness_of(element)(None))
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise


def _job_id(dsn: str, key: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM outbox_jobs WHERE idempotency_key = %s", (key,))
        found = row.fetchone()
    assert found is not None
    return int(found[0])


def test_an_operator_logs_in_filters_reads_a_history_and_cancels(
    stage: Stage, browser: WebDriver
) -> None:
    browser.get(f"{stage.url}/jobs")
    browser.find_element(By.ID, "token").send_keys(OPERATOR_TOKEN)
    _navigate(browser, By.ID, "login")
    # The browser holds a session id (bound to 127.0.0.1: plain HTTP, no __Host- prefix).
    cookies = {c["name"]: c for c in browser.get_cookies()}
    assert set(cookies) == {SESSION_COOKIE}, set(cookies)
    session = cookies[SESSION_COOKIE]
    assert session["value"] != OPERATOR_TOKEN and session["httpOnly"]
    assert session["sameSite"] == "Strict"
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tr.job")
    states = {row.get_attribute("data-status") for row in rows}
    assert {"ACCEPTED", "FAILED", "PENDING", "CANCELLED"} <= states, states
    assert len(rows) == stage.job_count
    masked = [r.find_element(By.CLASS_NAME, "recipient").text for r in rows]
    assert all("*" in m for m in masked), masked
    _no_full_number(browser.page_source, stage.phones)
    _screenshot(browser, stage, "console.png")

    Select(browser.find_element(By.ID, "f-state")).select_by_value("PENDING")
    _navigate(browser, By.ID, "apply")
    pending = browser.find_elements(By.CSS_SELECTOR, "#jobs tr.job")
    assert len(pending) == len(stage.keys["PENDING"]) + stage.mix_held()
    assert {r.get_attribute("data-status") for r in pending} == {"PENDING"}

    target = _job_id(stage.pipeline.dsn, stage.keys["PENDING"][0])
    _navigate(browser, By.LINK_TEXT, str(target))
    assert browser.find_element(By.TAG_NAME, "h1").text == f"Job {target}"
    assert browser.find_elements(By.ID, "text") == []  # an operator, not an admin
    _no_full_number(browser.page_source, stage.phones)
    browser.find_element(By.ID, "cancel-reason").send_keys("wrong recipient list")
    _navigate(browser, By.ID, "cancel-button")
    assert "cancel requested" in browser.find_element(By.ID, "notice").text

    wait_for_status(stage.pipeline.dsn, stage.keys["PENDING"][:1], "CANCELLED", 30)
    with psycopg.connect(stage.pipeline.dsn, autocommit=True) as conn:
        command = conn.execute(
            "SELECT command, actor, reason FROM outbox_commands WHERE job_id = %s", (target,)
        ).fetchall()
        event = conn.execute(
            "SELECT outcome FROM outbox_job_events WHERE job_id = %s AND to_status = 'CANCELLED'",
            (target,),
        ).fetchall()
    assert command == [("cancel", "alice", "wrong recipient list")]
    assert event == [("cancelled",)]
    browser.refresh()
    history = browser.find_element(By.ID, "events").text
    assert "CANCELLED" in history and "wrong recipient list" in history
    assert "alice" in browser.find_element(By.ID, "commands").text
    _screenshot(browser, stage, "console-job.png")


def _db_overview(dsn: str) -> tuple[dict[str, int], dict[str, tuple[int, float]]]:
    """Jobs per status, and per instance the waiting jobs and the oldest one's age (s)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM outbox_jobs GROUP BY status")
        counts = {str(k): int(n) for k, n in rows}
        waiting = conn.execute(
            "SELECT instance_id, count(*), extract(epoch FROM now() - min(created_at))::float"
            " FROM outbox_jobs WHERE status IN ('PENDING', 'RETRY_WAIT', 'ATTEMPTING')"
            " GROUP BY instance_id"
        ).fetchall()
    return counts, {str(i): (int(n), float(age)) for i, n, age in waiting}


def _log_in(browser: WebDriver, stage: Stage) -> None:
    """Log in through the form unless the browser holds the cookie already."""
    browser.get(f"{stage.url}/")
    if browser.find_elements(By.ID, "token"):
        browser.find_element(By.ID, "token").send_keys(OPERATOR_TOKEN)
        _navigate(browser, By.ID, "login")
        browser.get(f"{stage.url}/")


def test_the_overview_shows_the_demo_mix_the_waiting_the_pauses_and_the_lag(
    stage: Stage, browser: WebDriver
) -> None:
    assert stage.mix is not None and stage.mix.ok, stage.mix and stage.mix.summary()
    _log_in(browser, stage)  # the landing page is the overview
    assert browser.find_element(By.TAG_NAME, "h1").text == "Overview"
    nav = browser.find_elements(By.CSS_SELECTOR, "header a")
    assert nav[0].text == "Overview" and nav[0].get_attribute("href") == f"{stage.url}/overview"

    before = _db_overview(stage.pipeline.dsn)
    browser.refresh()
    after = _db_overview(stage.pipeline.dsn)
    counts, waiting = after
    assert before[0] == counts, "the jobs moved while the page was read"
    shown = {
        str(row.get_attribute("data-status")): int(row.find_element(By.CLASS_NAME, "count").text)
        for row in browser.find_elements(By.CSS_SELECTOR, "#states tr.state")
    }
    assert shown == {status: counts.get(status, 0) for status in shown}
    assert set(shown) == {s.value for s in JobStatus}
    # The demo mix's states and this module's own: every one an operator meets.
    for status in ("ACCEPTED", "FAILED", "PENDING", "CANCELLED", "DEAD", "UNCERTAIN", "EXPIRED"):
        assert shown[status] >= 1, status
    assert shown["INVALID"] >= 1
    for status in ("DEAD", "UNCERTAIN"):
        row = browser.find_element(By.CSS_SELECTOR, f'#states tr[data-status="{status}"]')
        assert "needs an operator" in row.text

    rows = {
        row.get_attribute("data-instance"): row
        for row in browser.find_elements(By.CSS_SELECTOR, "#waiting tr.waiting")
    }
    assert {HELD, PAUSED_INSTANCE} <= set(rows), set(rows)
    for instance in (HELD, PAUSED_INSTANCE):
        count = int(rows[instance].find_element(By.CLASS_NAME, "count").text)
        age = float(
            rows[instance].find_element(By.CLASS_NAME, "oldest").get_attribute("data-age-s") or "-1"
        )
        assert count == waiting[instance][0] and count >= 1, instance
        # The age the page showed lies between the database's two readings around it.
        assert before[1][instance][1] - 1 <= age <= waiting[instance][1] + 1, (instance, age)
        assert age > 0 and "paused" in rows[instance].text
    paused = {
        row.get_attribute("data-target"): row.text
        for row in browser.find_elements(By.CSS_SELECTOR, "#paused tr.paused")
    }
    assert set(paused) == {HELD, PAUSED_INSTANCE}
    assert "number under review" in paused[HELD] and "ana" in paused[HELD]
    assert PAUSE_REASON in paused[PAUSED_INSTANCE]
    _no_full_number(browser.page_source, stage.phones)

    # Lag at a glance: the worker's group from the lag monitor, the relay's slot.
    group = stage.pipeline.topics.group("zapstream-worker")

    def glance() -> bool:
        found = browser.find_elements(By.ID, "lag-glance")
        if found and group in found[0].text:
            return True
        browser.refresh()
        return False

    wait_until(glance, 60, "the worker's group at a glance", interval_s=1.0)
    assert "zapstream" in browser.find_element(By.ID, "slot-glance").text.lower()
    _screenshot(browser, stage, "console-overview.png")


def test_a_bulk_reprocess_previews_the_count_then_records_one_command_per_job(
    stage: Stage, browser: WebDriver
) -> None:
    browser.get(f"{stage.url}/jobs?state=FAILED&instance={SENT}")  # the cookie from the login
    assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tr.job")) == 2
    bulk = browser.find_element(By.ID, "bulk")
    Select(bulk.find_element(By.NAME, "action")).select_by_value("reprocess")
    bulk.find_element(By.NAME, "reason").send_keys("gateway fixed the number check")
    _navigate(browser, By.CSS_SELECTOR, "#bulk button")
    assert browser.find_element(By.ID, "preview").text.startswith("2 matching job(s)")
    _navigate(browser, By.CSS_SELECTOR, "#bulk-confirm button")
    assert "reprocess requested for 2 job(s) by alice" in browser.find_element(By.ID, "notice").text
    ids = [_job_id(stage.pipeline.dsn, key) for key in stage.keys["FAILED"]]
    with psycopg.connect(stage.pipeline.dsn, autocommit=True) as conn:
        commands = conn.execute(
            "SELECT job_id, command, actor, reason FROM outbox_commands WHERE job_id = ANY(%s)"
            " ORDER BY job_id",
            (ids,),
        ).fetchall()
    assert commands == [
        (job_id, "reprocess", "alice", "gateway fixed the number check") for job_id in sorted(ids)
    ]


def test_the_lag_page_charts_partitions_and_the_slot(stage: Stage, browser: WebDriver) -> None:
    browser.get(f"{stage.url}/lag")  # the cookie from the login above
    topics = stage.pipeline.topics
    group = topics.group("zapstream-worker")

    def chart() -> str:
        found = browser.find_elements(By.ID, "lag-chart")
        return (found[0].get_attribute("innerHTML") or "") if found else ""

    # The chart is drawn as soon as the lag monitor answers, with no bars until its first
    # reading of the group (on Apache Kafka that reading came a minute late once: an
    # unassigned consumer's metadata names no topic): wait for the worker's bars.
    def drawn() -> bool:
        if f"{group} {topics.intents}[" in chart():
            return True
        browser.refresh()
        return False

    wait_until(
        drawn,
        60,
        "the lag monitor's partitions of the worker's group",
        interval_s=1.0,
    )
    assert chart().count(f"{group} {topics.intents}[") == stage.pipeline.partitions
    slots = browser.find_element(By.ID, "slots").text
    assert "zapstream" in slots.lower()
    _screenshot(browser, stage, "console-lag.png")


def test_a_bulk_reprocess_that_may_send_twice_is_refused_until_accepted(stage: Stage) -> None:
    """The mix's UNCERTAIN job may have been delivered: the confirmation alone is not enough."""
    operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}", "Origin": stage.url}
    form = {"action": "reprocess", "reason": "retry the uncertain ones", "state": "UNCERTAIN"}
    preview = httpx.post(f"{stage.url}/jobs/bulk", data=form, headers=operator)
    assert preview.status_code == 200 and 'name="accept_duplicate"' in preview.text
    refused = httpx.post(
        f"{stage.url}/jobs/bulk", data={**form, "confirm": "yes"}, headers=operator
    )
    assert refused.status_code == 409 and "may be sent twice" in refused.text
    with psycopg.connect(stage.pipeline.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_commands c JOIN outbox_jobs j ON j.id = c.job_id"
            " WHERE j.status = 'UNCERTAIN' AND c.command = 'reprocess'"
        ).fetchone()
    assert row is not None and row[0] == 0


def test_logging_out_ends_the_session_on_the_server(stage: Stage, browser: WebDriver) -> None:
    _log_in(browser, stage)
    session = browser.get_cookie(SESSION_COOKIE)
    assert session is not None
    _navigate(browser, By.CSS_SELECTOR, "header form button")  # Log out
    assert browser.find_elements(By.ID, "token")
    # The cookie's value, replayed from elsewhere, opens nothing any more.
    replayed = httpx.get(
        f"{stage.url}/jobs", cookies={SESSION_COOKIE: session["value"]}, follow_redirects=False
    )
    assert replayed.status_code == 303 and replayed.headers["location"].startswith("/login")
