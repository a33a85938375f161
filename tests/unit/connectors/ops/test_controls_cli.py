"""How ``zapstream instances|campaigns`` combine controls with the backlog and print them."""

from __future__ import annotations

import argparse
import datetime as dt
import json

import pytest

from connectors.ops.controls_cli import (
    add_controls_parser,
    control_targets,
    targets_json,
    targets_table,
)
from connectors.outbox.controls import Backlog, Control
from streams.kernel.contract import ControlAction, ControlKind

AT = dt.datetime(2026, 12, 1, 13, 0, 5, tzinfo=dt.UTC)
LATEST = [
    Control("instance", "shop-1", "pause", "number flagged by Meta", "alice", AT, 12),
    Control("instance", "shop-9", "resume", "ok again", "bob", AT, 13),
    Control("campaign", "black-friday", "pause", "copy under review", "carol", AT, 14),
]
WAITING = [
    Backlog("shop-1", "otp", "operational", 3, 42.5),
    Backlog("shop-1", "black-friday", "bulk", 1000, 3700.0),
    Backlog("shop-2", None, "operational", 2, 5.0),
    Backlog("shop-2", "black-friday", "bulk", 10, 30.0),
]


def test_instances_combine_latest_control_and_summed_backlog() -> None:
    views = control_targets(ControlKind.INSTANCE, LATEST, WAITING)
    assert [(v.target, v.state, v.waiting, v.oldest_waiting_age_s) for v in views] == [
        ("shop-1", "paused", 1003, 3700.0),
        ("shop-2", "-", 12, 30.0),
        ("shop-9", "resumed", 0, None),
    ]
    assert views[0].control is LATEST[0]


def test_campaigns_are_purposes_summed_over_instances() -> None:
    views = control_targets(ControlKind.CAMPAIGN, LATEST, WAITING)
    assert [(v.target, v.state, v.waiting, v.oldest_waiting_age_s) for v in views] == [
        ("black-friday", "paused", 1010, 3700.0),
        ("otp", "-", 3, 42.5),
    ]


def test_table_shows_who_why_when_and_the_backlog() -> None:
    text = targets_table(
        ControlKind.INSTANCE, control_targets(ControlKind.INSTANCE, LATEST, WAITING)
    )
    header, *rows = text.splitlines()
    assert header.split() == [
        "INSTANCE", "STATE", "BY", "REASON", "SINCE", "(UTC)", "WAITING", "OLDEST", "WAITING"
    ]  # fmt: skip
    shop1 = next(r for r in rows if r.startswith("shop-1"))
    for part in ("paused", "alice", "number flagged by Meta", "2026-12-01 13:00:05Z", "1003"):
        assert part in shop1
    assert shop1.rstrip().endswith("1h01m")
    shop2 = next(r for r in rows if r.startswith("shop-2"))
    assert shop2.split()[:3] == ["shop-2", "-", "-"] and shop2.rstrip().endswith("30s")


def test_table_without_targets_says_so() -> None:
    assert targets_table(ControlKind.CAMPAIGN, []) == "no campaigns with controls or waiting jobs"


def test_json_has_one_object_per_target() -> None:
    data = json.loads(targets_json(control_targets(ControlKind.INSTANCE, LATEST, WAITING)))
    assert data[0] == {
        "kind": "instance",
        "target": "shop-1",
        "paused": True,
        "action": "pause",
        "actor": "alice",
        "reason": "number flagged by Meta",
        "at": "2026-12-01T13:00:05+00:00",
        "control_id": 12,
        "waiting": 1003,
        "oldest_waiting_age_s": 3700.0,
    }
    assert data[1]["paused"] is None and data[1]["waiting"] == 12
    assert data[2]["paused"] is False and data[2]["oldest_waiting_age_s"] is None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zapstream")
    add_controls_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_parser_wires_kind_action_and_options() -> None:
    args = _parser().parse_args(
        ["campaigns", "pause", "black-friday", "--reason", "review", "--by", "carol"]
    )
    assert (args.control_kind, args.control_action) == (ControlKind.CAMPAIGN, ControlAction.PAUSE)
    assert (args.target, args.reason, args.by) == ("black-friday", "review", "carol")
    listing = _parser().parse_args(["instances", "list", "--json"])
    assert listing.control_kind == ControlKind.INSTANCE and listing.json


@pytest.mark.parametrize(
    "argv",
    [
        ["instances", "pause", "shop-1", "--by", "alice"],
        ["instances", "resume", "shop-1", "--reason", "ok"],
        ["instances", "pause", "--reason", "x", "--by", "y"],
    ],
)
def test_reason_by_and_target_are_required(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    assert exc.value.code == 2
