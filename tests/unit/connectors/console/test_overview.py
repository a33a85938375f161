"""The console's overview page: how it folds its figures and what it shows (and escapes)."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from aiohttp.test_utils import TestClient, TestServer

from connectors.console.app import build_app
from connectors.console.overview import group_lags, overview_page
from connectors.console.overview_sql import InstanceWaiting, Overview, waiting_per_instance
from connectors.console.queries import SlotLag
from connectors.console.settings import ConsoleSettings, Operator, Role
from connectors.ops.status import ConsumerLag, PartitionLag
from connectors.outbox.controls import Backlog, Control
from connectors.sink.pipeline_sql import STATUSES

NOW = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC)
ALICE = Operator("alice", Role.OPERATOR)
TOKEN = "alice-token-0123456789abcdef0123456789"


def _overview(**counts: int) -> Overview:
    jobs = {status: counts.get(status, 0) for status in STATUSES}
    return Overview(
        at=NOW,
        jobs=jobs,
        waiting=[InstanceWaiting("shop-held", 2, 754.0), InstanceWaiting("shop-1", 1, 3.0)],
        paused=[Control("instance", "shop-held", "pause", "number <under> review", "ana", NOW, 7)],
    )


def _cell(page: str, status: str) -> str:
    found = re.search(rf'data-status="{status}">.*?<td class="count">(\d+)</td>', page)
    assert found is not None, status
    return found.group(1)


def test_backlog_lines_fold_into_one_per_instance_oldest_first() -> None:
    rows = [
        Backlog("shop-1", None, "operational", 3, 10.0),
        Backlog("shop-2", "promo", "bulk", 5, 400.0),
        Backlog("shop-1", "promo", "bulk", 2, 90.0),
        Backlog("shop-3", None, "operational", 1, 10.0),
    ]
    assert waiting_per_instance(rows) == [
        InstanceWaiting("shop-2", 5, 400.0),
        InstanceWaiting("shop-1", 5, 90.0),
        InstanceWaiting("shop-3", 1, 10.0),
    ]
    assert waiting_per_instance([]) == []


def test_partition_lags_sum_per_group_and_topic() -> None:
    lags = [
        PartitionLag("g", "intents", "0", messages=3, seconds=1.5),
        PartitionLag("g", "intents", "1", messages=4, seconds=0.5),
        PartitionLag("g", "state", "0", messages=None, seconds=None),
    ]
    summed = group_lags(lags)
    assert [(g.topic, g.partitions, g.messages, g.seconds) for g in summed] == [
        ("intents", 2, 7, 1.5),
        ("state", 1, 0, None),
    ]


def test_the_page_shows_every_state_the_waiting_the_pauses_and_the_lag() -> None:
    page = overview_page(
        _overview(ACCEPTED=120, DEAD=1, UNCERTAIN=1, PENDING=2, INVALID=1),
        consumer=ConsumerLag(
            "http://lag/metrics", (PartitionLag("zapstream-worker", "intents", "0", 9, 2.0),)
        ),
        slots=[SlotLag("zapstream_relay", True, 512)],
        operator=ALICE,
    )
    assert _cell(page, "ACCEPTED") == "120" and _cell(page, "DEAD") == "1"
    assert _cell(page, "EXPIRED") == "0"  # every state is listed, 0 included
    assert "125 jobs in the outbox" in page
    dead_row = page.split('data-status="DEAD"', 1)[1].split("</tr>", 1)[0]
    assert "needs an operator" in dead_row
    expired_row = page.split('data-status="EXPIRED"', 1)[1].split("</tr>", 1)[0]
    assert "needs an operator" not in expired_row
    waiting = page.split('id="waiting"', 1)[1].split("</table>", 1)[0]
    assert waiting.index("shop-held") < waiting.index("shop-1")  # the oldest first
    assert 'data-age-s="754"' in waiting and "12m34s" in waiting and "paused" in waiting
    paused = page.split('id="paused"', 1)[1].split("</table>", 1)[0]
    assert "shop-held" in paused and "ana" in paused
    assert "number &lt;under&gt; review" in paused and "<under>" not in page
    glance = page.split('id="lag-glance"', 1)[1].split("</table>", 1)[0]
    assert "zapstream-worker" in glance and '<td class="messages">9</td>' in glance
    assert "zapstream_relay" in page.split('id="slot-glance"', 1)[1]
    assert '<a href="/overview">Overview</a>' in page


def test_an_idle_pipeline_says_nothing_waits_and_lag_is_not_configured() -> None:
    idle = Overview(at=NOW, jobs={s: 0 for s in STATUSES}, waiting=[], paused=[])
    page = overview_page(idle, consumer=ConsumerLag(None), slots=[], operator=ALICE)
    assert 'id="no-waiting"' in page and 'id="no-paused"' in page
    assert 'id="lag-not-configured"' in page and 'id="lag-glance"' not in page


@pytest.fixture
async def client(monkeypatch: pytest.MonkeyPatch) -> TestClient:  # type: ignore[type-arg]
    monkeypatch.setenv(
        "ZAPSTREAM_CONSOLE_TOKENS", json.dumps({TOKEN: {"operator": "alice", "role": "operator"}})
    )
    # Nothing listens here: the overview's database read fails, the guard answers 503.
    monkeypatch.setenv("ZAPSTREAM_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    test_client = TestClient(TestServer(build_app(ConsoleSettings())))
    await test_client.start_server()
    yield test_client
    await test_client.close()


async def test_the_overview_is_the_landing_page_and_needs_a_token(client: TestClient) -> None:  # type: ignore[type-arg]
    assert (await client.get("/overview")).status == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    landing = await client.get("/", headers=auth, allow_redirects=False)
    assert landing.status == 303 and landing.headers["Location"] == "/overview"
    assert (await client.get("/overview", headers=auth)).status == 503


def test_the_overview_counts_opt_outs_and_links_the_jobs_not_sent() -> None:
    import dataclasses

    page = overview_page(
        dataclasses.replace(_overview(OPTED_OUT=3), optouts=12),
        consumer=ConsumerLag(None),
        slots=[],
        operator=ALICE,
    )
    assert _cell(page, "OPTED_OUT") == "3"
    row = page.split('data-status="OPTED_OUT"', 1)[1].split("</tr>", 1)[0]
    assert "opted out" in row and "needs an operator" not in row
    section = page.split('id="optouts"', 1)[1].split("</p>", 1)[0]
    assert '<span class="count">12</span> recipient(s) opted out' in section
    assert "/jobs?state=OPTED_OUT" in section and "3 job(s) not sent" in section
