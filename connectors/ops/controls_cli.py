"""``zapstream instances|campaigns pause|resume|list``: operators hold and release sending.

::

    zapstream instances pause INSTANCE --reason R --by WHO
    zapstream instances resume INSTANCE --reason R --by WHO
    zapstream instances list [--json]
    zapstream campaigns pause PURPOSE --reason R --by WHO
    zapstream campaigns resume PURPOSE --reason R --by WHO
    zapstream campaigns list [--json]

``pause`` and ``resume`` write a control into ``outbox_controls`` (see
:mod:`connectors.outbox.controls`) in their own transaction, with who and why;
the relay streams it to ``zapstream.controls`` and the worker holds (or
releases) the instance's, or the campaign's, messages. A campaign is named by
the ``purpose`` its jobs were enqueued with.

``list`` shows every instance (or campaign) that has a control or jobs waiting:
its latest control (paused or resumed, by whom, why, when) and its backlog (jobs
PENDING, RETRY_WAIT or ATTEMPTING, and the age of the oldest), from
``zapstream_backlog``. Never a recipient or a text: only ids, counts and the
operators' own reasons.

Exit codes: 0 done, 2 refused here (an empty target, reason or actor).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import psycopg

from connectors.ops.jobs_render import cut, human_age, table, when
from connectors.outbox.controls import (
    Backlog,
    Control,
    InvalidControl,
    backlog,
    controls,
    pause_campaign,
    pause_instance,
    resume_campaign,
    resume_instance,
)
from streams.kernel.contract import ControlAction, ControlKind

__all__ = [
    "EXIT_DONE",
    "EXIT_REFUSED",
    "TargetView",
    "add_controls_parser",
    "control_targets",
    "list_targets",
    "set_control",
    "targets_json",
    "targets_table",
]

EXIT_DONE = 0
EXIT_REFUSED = 2

_REASON_WIDTH = 40
_WRITERS = {
    (ControlKind.INSTANCE, ControlAction.PAUSE): pause_instance,
    (ControlKind.INSTANCE, ControlAction.RESUME): resume_instance,
    (ControlKind.CAMPAIGN, ControlAction.PAUSE): pause_campaign,
    (ControlKind.CAMPAIGN, ControlAction.RESUME): resume_campaign,
}
_NOUN = {ControlKind.INSTANCE: "instance", ControlKind.CAMPAIGN: "campaign"}
_PAST = {ControlAction.PAUSE: "paused", ControlAction.RESUME: "resumed"}


@dataclasses.dataclass(frozen=True, slots=True)
class TargetView:
    """One instance or campaign as ``list`` shows it: latest control and backlog."""

    kind: str
    target: str
    control: Control | None
    waiting: int
    oldest_waiting_age_s: float | None

    @property
    def state(self) -> str:
        if self.control is None:
            return "-"
        return _PAST[ControlAction(self.control.action)]


def control_targets(
    kind: ControlKind, latest: Iterable[Control], waiting: Iterable[Backlog]
) -> list[TargetView]:
    """Every target of ``kind`` with a control or jobs waiting, by name.

    An instance's backlog is summed over its purposes and priorities; a
    campaign's over the instances sending it (jobs without a purpose belong to
    no campaign).
    """
    by_target: dict[str, Control] = {c.target: c for c in latest if c.kind == kind}
    counts: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for row in waiting:
        name = row.instance_id if kind == ControlKind.INSTANCE else row.purpose
        if name is None:
            continue
        counts[name] = counts.get(name, 0) + row.waiting
        oldest[name] = max(oldest.get(name, 0.0), row.oldest_waiting_age_s)
    return [
        TargetView(kind.value, name, by_target.get(name), counts.get(name, 0), oldest.get(name))
        for name in sorted(set(by_target) | set(counts))
    ]


def targets_table(kind: ControlKind, views: Sequence[TargetView]) -> str:
    """The text ``list`` prints: one line per target, or a sentence when there is none."""
    noun = _NOUN[kind]
    if not views:
        return f"no {noun}s with controls or waiting jobs"
    headers = (noun.upper(), "STATE", "BY", "REASON", "SINCE (UTC)", "WAITING", "OLDEST WAITING")
    rows = []
    for view in views:
        control = view.control
        age = view.oldest_waiting_age_s
        rows.append(
            (
                view.target,
                view.state,
                control.actor if control else "-",
                cut(control.reason if control else None, _REASON_WIDTH),
                when(control.at if control else None),
                str(view.waiting),
                "-" if age is None else human_age(dt.timedelta(seconds=age)),
            )
        )
    return table(headers, rows)


def targets_json(views: Sequence[TargetView]) -> str:
    """``list --json``: one JSON array of objects, one per target."""
    out: list[dict[str, Any]] = []
    for view in views:
        control = view.control
        out.append(
            {
                "kind": view.kind,
                "target": view.target,
                "paused": None if control is None else control.paused,
                "action": control.action if control else None,
                "actor": control.actor if control else None,
                "reason": control.reason if control else None,
                "at": control.at.isoformat() if control else None,
                "control_id": control.control_id if control else None,
                "waiting": view.waiting,
                "oldest_waiting_age_s": view.oldest_waiting_age_s,
            }
        )
    return json.dumps(out, indent=2)


def set_control(
    dsn: str,
    kind: ControlKind,
    action: ControlAction,
    target: str,
    *,
    reason: str,
    actor: str,
    out: TextIO | None = None,
) -> int:
    """Write one control in its own transaction and say what was done."""
    out = out or sys.stdout
    noun = _NOUN[kind]
    write = _WRITERS[(kind, action)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            with conn.transaction():
                before = {(c.kind, c.target): c for c in controls(conn)}
                control_id = write(conn, target, reason=reason, actor=actor)
        except InvalidControl as exc:
            print(f"cannot {action.value} {noun} {target.strip() or repr(target)}: {exc}", file=out)
            return EXIT_REFUSED
    name = target.strip()
    previous = before.get((kind.value, name))
    note = ""
    if previous is not None and previous.action == action.value:
        note = (
            f" (it was already {_PAST[action]} by {previous.actor} at {when(previous.at)}:"
            f" {cut(previous.reason, _REASON_WIDTH)})"
        )
    print(
        f"{_PAST[action]} {noun} {name}: control {control_id} by {actor.strip()}: "
        f"{reason.strip()}{note}",
        file=out,
    )
    return EXIT_DONE


def list_targets(
    dsn: str, kind: ControlKind, *, as_json: bool = False, out: TextIO | None = None
) -> int:
    """Print every instance (or campaign) with its latest control and its backlog."""
    out = out or sys.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        views = control_targets(kind, controls(conn), backlog(conn))
    print(targets_json(views) if as_json else targets_table(kind, views), file=out)
    return EXIT_DONE


# --- argument parsing -------------------------------------------------------------------


def _dsn() -> str:
    from streams.kernel.settings import PostgresSettings

    return PostgresSettings().dsn


def _cmd_set(args: argparse.Namespace) -> int:
    return set_control(
        _dsn(),
        args.control_kind,
        args.control_action,
        args.target,
        reason=args.reason,
        actor=args.by,
    )


def _cmd_list(args: argparse.Namespace) -> int:
    return list_targets(_dsn(), args.control_kind, as_json=args.json)


def _add_kind(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], kind: ControlKind
) -> None:
    noun = _NOUN[kind]
    plural = f"{noun}s"
    metavar = "INSTANCE" if kind == ControlKind.INSTANCE else "PURPOSE"
    what = "a WhatsApp instance" if kind == ControlKind.INSTANCE else "a campaign, by its purpose"
    parser = subparsers.add_parser(plural, help=f"pause, resume and list {plural}")
    sub = parser.add_subparsers(dest=f"{plural}_command", required=True)
    for action in ControlAction:
        verb = action.value
        cmd = sub.add_parser(verb, help=f"{verb} {what}; recorded with who and why")
        cmd.add_argument(
            "target",
            metavar=metavar,
            help=f"the {noun}"
            + ("'s id" if kind == ControlKind.INSTANCE else "'s purpose, as its jobs carry it"),
        )
        cmd.add_argument("--reason", required=True, help="why (recorded)")
        cmd.add_argument("--by", required=True, metavar="WHO", help="who asks (recorded too)")
        cmd.set_defaults(func=_cmd_set, control_kind=kind, control_action=action)
    ls = sub.add_parser(
        "list", help=f"{plural} with their latest control and their backlog (waiting jobs)"
    )
    ls.add_argument("--json", action="store_true", help="one JSON array on stdout")
    ls.set_defaults(func=_cmd_list, control_kind=kind)


def add_controls_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``instances`` and ``campaigns``; each sets ``func(args) -> exit code``."""
    _add_kind(subparsers, ControlKind.INSTANCE)
    _add_kind(subparsers, ControlKind.CAMPAIGN)
