"""The console's filters from a query string, and what its pages show (and never show)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from connectors.console.app import FilterError, parse_filter
from connectors.console.pages import bulk_preview_page, job_page, jobs_page, lag_page
from connectors.console.queries import SlotLag
from connectors.console.settings import Operator, Role
from connectors.ops.jobs_sql import (
    JobCommand,
    JobDetail,
    JobEvent,
    JobHistory,
    JobReplay,
    ListedJob,
    PageOfJobs,
)
from connectors.ops.status import ConsumerLag, PartitionLag

NOW = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC)
PHONE = "5511987654321"


def test_a_query_string_becomes_a_filter_and_a_page() -> None:
    job_filter, page, form = parse_filter(
        {"state": "pending", "instance": " shop ", "period": "1h", "q": "k-1", "page": "2"},
        now=NOW,
    )
    assert list(job_filter.statuses) == ["PENDING"] and job_filter.instance == "shop"
    assert job_filter.since == NOW - dt.timedelta(hours=1) and job_filter.search == "k-1"
    assert job_filter.priority is None and job_filter.purpose is None and page == 2
    assert form["state"] == "PENDING"


def test_an_empty_query_is_every_job_on_page_one() -> None:
    job_filter, page, _ = parse_filter({}, now=NOW)
    assert job_filter.where()[1] == [] and page == 1


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"state": "SENT"}, "state"),
        ({"period": "soon"}, "period"),
        ({"page": "0"}, "page"),
        # Hostile values were 500s: not ASCII digits, an OFFSET past bigint, before year 1.
        ({"page": "²"}, "page"),
        ({"page": "٣"}, "page"),
        ({"page": "9" * 30}, "page"),
        ({"period": "99999999w"}, "period"),
        ({"period": "٣h"}, "period"),
    ],
)
def test_a_bad_field_is_named(query: dict[str, str], field: str) -> None:
    with pytest.raises(FilterError, match=f"^{field}:"):
        parse_filter(query, now=NOW)


def _job(status: str = "FAILED") -> ListedJob:
    return ListedJob(7, "shop", PHONE, status, 2, NOW, "boom <b>", NOW)


def test_the_list_masks_recipients_and_escapes_errors() -> None:
    page = PageOfJobs(jobs=[_job()], total=1, page=1, page_size=50)
    html = jobs_page(page, {}, Operator("alice", Role.OPERATOR), now=NOW)
    assert PHONE not in html and "55*******4321" in html
    assert "boom &lt;b&gt;" in html and 'id="bulk"' in html


def test_a_viewer_gets_no_bulk_form() -> None:
    page = PageOfJobs(jobs=[_job()], total=1, page=1, page_size=50)
    assert 'id="bulk"' not in jobs_page(page, {}, Operator("v", Role.VIEWER), now=NOW)


def _story(status: str) -> JobHistory:
    detail = JobDetail(
        7,
        "shop",
        PHONE,
        PHONE,
        "text",
        status,
        "operational",
        None,
        1,
        5,
        2,
        None,
        None,
        NOW,
        NOW,
        None,
        None,
    )
    events = [
        JobEvent(1, 1, "PENDING", "ATTEMPTING", "worker", None, NOW),
        JobEvent(2, 2, "ATTEMPTING", status, "worker", "read timeout", NOW),
    ]
    return JobHistory(job=detail, events=events, commands=[], replays=[], paused_by=[])


def test_only_an_admin_sees_the_text() -> None:
    story = _story("FAILED")
    admin = job_page(story, Operator("ada", Role.ADMIN), text="hello <there>")
    operator = job_page(story, Operator("alice", Role.OPERATOR), text=None)
    assert "hello &lt;there&gt;" in admin and 'id="text"' not in operator
    assert PHONE not in admin + operator


def test_the_history_shows_attempts_events_and_who_asked_what() -> None:
    story = _story("FAILED")
    story.commands.append(JobCommand(3, "reprocess", "alice", "number fixed", NOW))
    html = job_page(story, Operator("alice", Role.OPERATOR), text=None)
    assert 'id="attempts"' in html and "7-1" in html and "read timeout" in html
    assert 'id="events"' in html and "number fixed" in html and "alice" in html


def test_an_uncertain_job_warns_that_it_may_be_sent_twice() -> None:
    html = job_page(_story("UNCERTAIN"), Operator("alice", Role.OPERATOR), text=None)
    assert 'id="uncertain-warning"' in html and "TWICE" in html
    assert 'name="accept_duplicate"' in html
    calm = job_page(_story("FAILED"), Operator("alice", Role.OPERATOR), text=None)
    assert 'id="uncertain-warning"' not in calm and 'id="reprocess"' in calm


def test_the_warning_follows_the_history_not_the_reason_text() -> None:
    operator = Operator("alice", Role.OPERATOR)
    story = _story("DEAD")
    # An earlier attempt ended UNCERTAIN, a reprocess then died: it may still be delivered.
    story.events[1:] = [
        JobEvent(2, 2, "ATTEMPTING", "UNCERTAIN", "worker", None, NOW),
        JobEvent(3, 3, "UNCERTAIN", "ATTEMPTING", "alice", None, NOW),
        JobEvent(4, 4, "ATTEMPTING", "DEAD", "worker", "503", NOW),
    ]
    html = job_page(story, operator, text=None)
    assert 'id="uncertain-warning"' in html and "ended UNCERTAIN" in html
    assert 'name="accept_duplicate"' in html
    worded = _story("FAILED")
    worded.events[1] = JobEvent(2, 2, "ATTEMPTING", "FAILED", "worker", "uncertain?", NOW)
    assert 'id="uncertain-warning"' not in job_page(worded, operator, text=None)


def test_the_bulk_preview_counts_the_jobs_that_may_be_sent_twice() -> None:
    operator = Operator("alice", Role.OPERATOR)
    fields = {"action": "reprocess", "reason": "fixed"}
    html = bulk_preview_page(
        action="reprocess", count=3, risky=2, limit=10, fields=fields, operator=operator
    )
    assert 'id="uncertain-warning"' in html and "2 of them may already have been" in html
    assert "TWICE" in html and "Reprocess 3 job(s)" in html
    calm = bulk_preview_page(
        action="reprocess", count=3, risky=0, limit=10, fields=fields, operator=operator
    )
    assert 'id="uncertain-warning"' not in calm


def test_only_what_the_state_allows_is_offered() -> None:
    operator = Operator("alice", Role.OPERATOR)
    pending = job_page(_story("PENDING"), operator, text=None)
    assert 'id="cancel"' in pending and 'id="reprocess"' not in pending
    done = job_page(_story("CANCELLED"), operator, text=None)
    assert 'id="cancel"' not in done and 'id="reprocess"' not in done
    failed = job_page(_story("FAILED"), operator, text=None)
    assert 'id="cancel"' not in failed and 'id="reprocess"' in failed


def test_a_viewer_gets_no_action_forms() -> None:
    html = job_page(_story("FAILED"), Operator("v", Role.VIEWER), text=None)
    assert 'id="cancel"' not in html and 'id="reprocess"' not in html


def test_lag_not_configured_is_said() -> None:
    viewer = Operator("a", Role.VIEWER)
    html = lag_page(consumer=ConsumerLag(url=None), slots=[], operator=viewer)
    assert 'id="lag-not-configured"' in html and "not configured" in html


def test_lag_is_a_bar_per_partition_and_the_slot_lag_in_bytes() -> None:
    partitions = (
        PartitionLag("w", "zapstream.intents", "0", 0.0),
        PartitionLag("w", "zapstream.intents", "1", 8.0),
    )
    html = lag_page(
        consumer=ConsumerLag("http://lag/metrics", partitions),
        slots=[SlotLag("zapstream_outbox", True, 4096)],
        operator=Operator("a", Role.VIEWER),
    )
    assert html.count("<rect") == 2 and "zapstream.intents[1]" in html and ">8</text>" in html
    assert "4096" in html and "zapstream_outbox" in html


def test_an_unreadable_lag_monitor_is_said() -> None:
    lag = ConsumerLag("http://lag/metrics", error="cannot read http://lag/metrics: refused")
    html = lag_page(consumer=lag, slots=[], operator=Operator("a", Role.VIEWER))
    assert 'id="lag-error"' in html and "refused" in html


ECHOED = "zapapi: HTTP 400: Your code is 482913. Do not share it."


def test_a_gateways_message_reaches_only_admins_whole() -> None:
    story = _story("FAILED")
    story.events[1] = JobEvent(2, 2, "ATTEMPTING", "FAILED", "worker", ECHOED, NOW)
    story = dataclasses.replace(story, job=dataclasses.replace(story.job, last_error=ECHOED))
    admin = job_page(story, Operator("ada", Role.ADMIN), text=None)
    assert "482913" in admin
    for role in (Role.VIEWER, Role.OPERATOR):
        html = job_page(story, Operator("v", role), text=None)
        assert "482913" not in html and "share" not in html
        assert "zapapi: HTTP 400: [message hidden: admins see it]" in html
    listed = PageOfJobs(
        jobs=[ListedJob(7, "shop", PHONE, "FAILED", 2, NOW, ECHOED, NOW)],
        total=1,
        page=1,
        page_size=50,
    )
    assert "482913" not in jobs_page(listed, {}, Operator("v", Role.VIEWER), now=NOW)
    assert "482913" in jobs_page(listed, {}, Operator("ada", Role.ADMIN), now=NOW)


def test_a_risky_bulk_preview_asks_for_the_box_and_says_why_it_refused() -> None:
    operator = Operator("alice", Role.OPERATOR)
    fields = {"action": "reprocess", "reason": "fixed"}
    html = bulk_preview_page(
        action="reprocess",
        count=3,
        risky=1,
        limit=10,
        fields=fields,
        operator=operator,
        refused="not reprocessed: tick the box",
    )
    assert 'name="accept_duplicate"' in html and 'id="notice"' in html
    calm = bulk_preview_page(
        action="reprocess", count=3, risky=0, limit=10, fields=fields, operator=operator
    )
    assert 'name="accept_duplicate"' not in calm


def test_a_scheduled_job_shows_its_due_time_and_a_reschedule_form_to_operators() -> None:
    import dataclasses

    story = _story("SCHEDULED")
    due = NOW + dt.timedelta(hours=2)
    story = dataclasses.replace(story, job=dataclasses.replace(story.job, next_retry_at=due))
    story.replays.append(JobReplay(4, "scheduler", "scheduled: due", NOW))
    html = job_page(story, Operator("alice", Role.OPERATOR), text=None)
    assert 'id="reschedule"' in html and due.isoformat(timespec="seconds") in html
    assert 'id="cancel"' in html and "<dt>Due</dt>" in html and ">release<" in html
    viewer = job_page(story, Operator("v", Role.VIEWER), text=None)
    assert 'id="reschedule"' not in viewer
    pending = job_page(_story("PENDING"), Operator("alice", Role.OPERATOR), text=None)
    assert 'id="reschedule"' not in pending and "<dt>Due</dt>" not in pending
