"""What ``zapstream jobs`` prints."""

import dataclasses
import datetime as dt

import pytest

from connectors.ops.jobs_render import (
    cut,
    events_table,
    human_age,
    job_summary,
    jobs_table,
    page_footer,
    when,
)
from connectors.ops.jobs_sql import Job, JobEvent, ListedJob

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
PHONE = "5511987654321"
GROUP = "120363025246125486@g.us"


def _listed(
    job_id: int,
    recipient: str | None,
    *,
    age: dt.timedelta = dt.timedelta(minutes=5),
    last_error: str | None = None,
) -> ListedJob:
    return ListedJob(
        id=job_id,
        instance_id="shop-1",
        recipient=recipient,
        status="FAILED",
        attempts=3,
        created_at=NOW - age,
        last_error=last_error,
        updated_at=NOW,
    )


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s"),
        (59, "59s"),
        (60, "1m00s"),
        (3 * 60 + 12, "3m12s"),
        (2 * 3600 + 5 * 60 + 59, "2h05m"),
        (3 * 86400 + 4 * 3600 + 59 * 60, "3d04h"),
        (-30, "0s"),  # a clock a little ahead of the database's
    ],
)
def test_human_age_shows_two_units_at_most(seconds: int, expected: str) -> None:
    assert human_age(dt.timedelta(seconds=seconds)) == expected


def test_jobs_table_masks_recipients_and_never_shows_them_whole() -> None:
    text = jobs_table(
        [_listed(2, GROUP), _listed(1, PHONE), _listed(3, None)],
        now=NOW,
    )
    assert "55*******4321" in text
    assert "12************5486@g.us" in text
    assert PHONE not in text and "120363025246125486" not in text
    assert text.splitlines()[3].split()[2] == "-"


def test_jobs_table_columns_ages_and_cut_errors() -> None:
    lines = jobs_table(
        [_listed(7, PHONE, age=dt.timedelta(hours=3), last_error="gateway\nsaid " + "x" * 100)],
        now=NOW,
    ).splitlines()
    assert lines[0].split() == [
        "ID",
        "INSTANCE",
        "RECIPIENT",
        "STATUS",
        "ATTEMPTS",
        "AGE",
        "LAST",
        "ERROR",
        "UPDATED",
        "(UTC)",
    ]
    row = lines[1]
    assert row.startswith("7 ")
    assert " 3h00m " in row
    assert "gateway said " + "x" * 24 + "..." in row  # 40 characters, on one line
    assert row.endswith("2026-03-01 12:00:00Z")
    assert all(line == line.rstrip() for line in lines)


def test_jobs_table_without_jobs_is_its_header() -> None:
    assert jobs_table([], now=NOW).splitlines() == [
        "ID  INSTANCE  RECIPIENT  STATUS  ATTEMPTS  AGE  LAST ERROR  UPDATED (UTC)"
    ]


@pytest.mark.parametrize(
    ("total", "limit", "page", "expected"),
    [
        (0, 50, 1, "page 1 of 1, 0 jobs"),
        (5, 2, 2, "page 2 of 3, 5 jobs"),
        (4, 2, 2, "page 2 of 2, 4 jobs"),
    ],
)
def test_page_footer(total: int, limit: int, page: int, expected: str) -> None:
    assert page_footer(page=page, limit=limit, total=total) == expected


def test_events_table_shows_transitions_in_utc() -> None:
    sao_paulo = dt.timezone(dt.timedelta(hours=-3))
    events = [
        JobEvent(
            1, 1, None, "PENDING", "relay", None, dt.datetime(2026, 3, 1, 9, 0, tzinfo=sao_paulo)
        ),
        JobEvent(2, 2, "ATTEMPTING", "UNCERTAIN", "worker", "read timeout " * 10, NOW),
    ]
    lines = events_table(events).splitlines()
    assert lines[0].split() == ["VERSION", "TRANSITION", "ACTOR", "REASON", "AT", "(UTC)"]
    assert lines[1].split() == ["v1", "-", "->", "PENDING", "relay", "-", "2026-03-01", "12:00:00Z"]
    assert "ATTEMPTING -> UNCERTAIN" in lines[2]
    assert cut("read timeout " * 10, 60) in lines[2]


def test_job_summary_masks_the_recipient() -> None:
    job = Job(9, "shop-1", PHONE, "DEAD", 3, "503\nfive times", None)
    assert job_summary(job) == (
        "job 9: DEAD after 3 attempt(s), instance shop-1, recipient 55*******4321, "
        "last error: 503 five times"
    )
    assert "recipient -," in job_summary(Job(9, "shop-1", None, "DEAD", 3, None, None))


def test_cut_and_when() -> None:
    assert cut(None, 10) == "-" and cut("", 10) == "-"
    assert cut("a  b\nc", 10) == "a b c"
    assert cut("abcdefghijk", 10) == "abcdefg..."
    assert when(None) == "-"
    assert when(dt.datetime(2026, 3, 1, 9, 0, tzinfo=dt.timezone(dt.timedelta(hours=-3)))) == (
        "2026-03-01 12:00:00Z"
    )


def test_events_table_leads_a_commands_answer_with_its_outcome() -> None:
    answer = JobEvent(
        3,
        3,
        "ACCEPTED",
        "ACCEPTED",
        "ops:ana",
        "cancel not possible: sent",
        NOW,
        "cancel_refused",
        17,
    )
    line = events_table([answer]).splitlines()[1]
    assert "ACCEPTED -> ACCEPTED" in line
    assert "[cancel_refused] cancel not possible: sent" in line


def test_values_cannot_forge_lines_or_drive_the_terminal() -> None:
    # An instance id and a gateway's error carrying CR/LF, ESC (a colour, a title via OSC)
    # and a C1 control: the table keeps one line per job and no control character.
    hostile = dataclasses.replace(
        _listed(7, PHONE, last_error="boom\r\nFAKE  7  ACCEPTED\x1b[31m\x1b]0;pwned\x07"),
        instance_id="shop\n8  ACCEPTED\x9b2J",
    )
    text = jobs_table([hostile, _listed(9, PHONE)], now=NOW)
    assert len(text.splitlines()) == 3, text
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in text.replace("\n", ""))
    summary = job_summary(Job(7, "shop\x1b[2J", PHONE, "FAILED", 1, "x\x1b]0;t\x07", None))
    assert "\x1b" not in summary and "\x07" not in summary and "\n" not in summary
