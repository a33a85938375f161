"""How ``zapstream jobs`` parses its options (no database)."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest

from connectors.ops.jobs_cli import add_jobs_parser


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


def test_jobs_list_last_takes_the_one_duration_grammar() -> None:
    for text, minutes in (("1h30m", 90), ("1.5h", 90), ("90s", 1.5)):
        args = _parser().parse_args(["jobs", "list", "--last", text])
        assert args.last == dt.timedelta(minutes=minutes)
