"""How ``zapstream jobs`` reads the worker's answers and parses its options (no database)."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest

from connectors.ops import jobs_cli
from connectors.ops.jobs_cli import add_jobs_parser, parse_since
from connectors.ops.jobs_sql import JobEvent, JobFilter

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _event(
    event_id: int,
    version: int,
    from_status: str,
    to_status: str,
    outcome: str | None = None,
    command_id: int | None = None,
) -> JobEvent:
    return JobEvent(event_id, version, from_status, to_status, "w", None, NOW, outcome, command_id)


def test_reprocess_settles_on_the_move_after_its_answer_whatever_the_ids() -> None:
    # The sink of an older release inserted a batch's events in reverse order: ids
    # no longer follow versions. Versions decide.
    history = [
        _event(1, 1, "PENDING", "ATTEMPTING"),
        _event(2, 2, "ATTEMPTING", "DEAD"),
        _event(9, 3, "DEAD", "DEAD", "reprocessed", 7),
        _event(8, 4, "DEAD", "ATTEMPTING"),
        _event(7, 5, "ATTEMPTING", "ACCEPTED"),
    ]
    events = sorted(history, key=lambda e: e.version)
    assert jobs_cli._reprocess_settled(events, 7)
    assert [e.version for e in jobs_cli._since_answer(events, 7)] == [3, 4, 5]
    assert not jobs_cli._reprocess_settled(events[:4], 7)  # still ATTEMPTING
    assert not jobs_cli._reprocess_settled(events, 8)  # another command: not answered


def test_reprocess_refusal_settles_at_once_and_other_commands_answers_are_ignored() -> None:
    events = [
        _event(1, 1, "PENDING", "FAILED"),
        _event(2, 2, "FAILED", "FAILED", "cancel_refused", 3),
        _event(3, 3, "FAILED", "FAILED", "reprocess_refused", 4),
    ]
    assert jobs_cli._answer(events, 3) == events[1]
    assert jobs_cli._reprocess_settled(events, 4)
    assert jobs_cli._answer(events, 5) is None


def test_parse_since_takes_a_duration_or_an_instant() -> None:
    assert parse_since("2h", now=NOW) == NOW - dt.timedelta(hours=2)
    assert parse_since("2026-11-30T08:00", now=NOW) == dt.datetime(2026, 11, 30, 8, tzinfo=dt.UTC)
    with pytest.raises(ValueError, match="not a duration or an ISO 8601"):
        parse_since("yesterday")


def test_job_filter_builds_its_where_clause() -> None:
    where, params = JobFilter(["DEAD"], "shop", NOW, None).where()
    assert "status = ANY" in repr(where) and "instance_id" in repr(where)
    assert params == [["DEAD"], "shop", NOW]
    assert JobFilter().where()[1] == []


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zapstream")
    add_jobs_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_bulk_reprocess_options_parse() -> None:
    args = _parser().parse_args(
        [
            "jobs",
            "reprocess",
            "--state",
            "failed",
            "--state",
            "DEAD",
            "--instance",
            "shop",
            "--since",
            "2h",
            "--reason",
            "fixed",
            "--by",
            "ops",
            "--dry-run",
            "--limit",
            "20",
        ]
    )
    assert args.job_id is None and args.state == ["FAILED", "DEAD"]
    assert args.dry_run and args.limit == 20 and args.instance == "shop"
    assert args.since < dt.datetime.now(dt.UTC) - dt.timedelta(minutes=119)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["jobs", "reprocess", "--reason", "r", "--by", "b"], "give a job ID, or --state"),
        (
            ["jobs", "reprocess", "5", "--state", "DEAD", "--reason", "r", "--by", "b"],
            "give a job ID or filters, not both",
        ),
    ],
)
def test_reprocess_needs_an_id_or_filters_not_both(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parser().parse_args(argv)
    with pytest.raises(SystemExit) as exit_info:
        args.func(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
