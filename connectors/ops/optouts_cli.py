"""``zapstream optouts add|remove|list``: operators record who said stop, and who came back.

::

    zapstream optouts add INSTANCE RECIPIENT --reason R --by WHO
    zapstream optouts remove INSTANCE RECIPIENT --reason R --by WHO
    zapstream optouts list [--instance I] [--limit 100] [--json]

``add`` opts the recipient out of the instance's bulk messages, ``remove`` opts them
back in (:mod:`connectors.outbox.optouts`, source ``operator``; the reason is recorded
with who asked). ``list`` shows who is opted out now, newest first, the recipient
masked: an operator finds a person by asking ``add``/``remove`` with their number, never
by reading the list's numbers.

Exit codes: 0 done, 2 refused here (an invalid recipient, instance or reason).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

import psycopg

from connectors.ops.jobs_render import cut, table, when
from connectors.outbox.optouts import InvalidOptOut, OptOut, opt_in, opt_out, opted_out, optouts
from connectors.outbox.recipients import mask_recipient
from streams.kernel.contract import OptOutSource

__all__ = ["add_optouts_parser", "list_optouts", "optouts_json", "optouts_table", "set_optout"]

EXIT_DONE = 0
EXIT_REFUSED = 2
_REASON_WIDTH = 50


def set_optout(
    dsn: str,
    instance_id: str,
    recipient: str,
    *,
    out_of: bool,
    reason: str,
    actor: str,
    out: TextIO | None = None,
) -> int:
    """Opt ``recipient`` out of (``out_of``) or back into ``instance_id``, in one transaction."""
    out = out or sys.stdout
    verb = "opt out" if out_of else "opt in"
    masked = mask_recipient(recipient.strip())
    if not actor.strip():
        print(f"cannot {verb} {masked}: --by is required", file=out)
        return EXIT_REFUSED
    write = opt_out if out_of else opt_in
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            with conn.transaction():
                was_out = opted_out(conn, instance_id, recipient)
                row_id = write(
                    conn,
                    instance_id,
                    recipient,
                    reason=f"{reason.strip()} (by {actor.strip()})" if reason.strip() else "",
                    source=OptOutSource.OPERATOR,
                )
        except InvalidOptOut as exc:
            print(f"cannot {verb} {masked}: {exc}", file=out)
            return EXIT_REFUSED
    note = ""
    if was_out == out_of:
        note = f" (it was already opted {'out' if out_of else 'in'})"
    print(
        f"{masked} opted {'out of' if out_of else 'back into'} instance {instance_id.strip()}: "
        f"row {row_id} by {actor.strip()}{note}",
        file=out,
    )
    return EXIT_DONE


def optouts_table(rows: Sequence[OptOut]) -> str:
    if not rows:
        return "nobody is opted out"
    headers = ("INSTANCE", "RECIPIENT", "SOURCE", "SINCE (UTC)", "JOB", "REASON")
    return table(
        headers,
        [
            (
                o.instance_id,
                mask_recipient(o.recipient),
                o.source,
                when(o.at),
                "-" if o.job_id is None else str(o.job_id),
                cut(o.reason, _REASON_WIDTH),
            )
            for o in rows
        ],
    )


def optouts_json(rows: Sequence[OptOut]) -> str:
    return json.dumps(
        [
            {
                "instance_id": o.instance_id,
                "recipient": mask_recipient(o.recipient),
                "source": o.source,
                "reason": o.reason,
                "job_id": o.job_id,
                "at": o.at.isoformat(),
                "optout_id": o.optout_id,
            }
            for o in rows
        ],
        indent=2,
    )


def list_optouts(
    dsn: str,
    instance_id: str | None = None,
    *,
    limit: int = 100,
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = optouts(conn, instance_id, limit=limit)
    print(optouts_json(rows) if as_json else optouts_table(rows), file=out)
    return EXIT_DONE


def _dsn() -> str:
    from streams.kernel.settings import PostgresSettings

    return PostgresSettings().dsn


def _cmd_set(args: argparse.Namespace) -> int:
    return set_optout(
        _dsn(),
        args.instance,
        args.recipient,
        out_of=args.optout_out,
        reason=args.reason,
        actor=args.by,
    )


def _cmd_list(args: argparse.Namespace) -> int:
    return list_optouts(_dsn(), args.instance, limit=args.limit, as_json=args.json)


def add_optouts_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``optouts``; each subcommand sets ``func(args) -> exit code``."""
    parser = subparsers.add_parser(
        "optouts", help="recipients opted out of an instance's bulk messages: add, remove, list"
    )
    sub = parser.add_subparsers(dest="optouts_command", required=True)
    for name, out_of, what in (
        ("add", True, "opt a recipient out: bulk jobs to them end OPTED_OUT, never sent"),
        ("remove", False, "opt a recipient back in: bulk jobs enqueued from now on are sent"),
    ):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("instance", metavar="INSTANCE", help="the instance's id")
        cmd.add_argument(
            "recipient", metavar="RECIPIENT", help="phone number with country code, or a JID"
        )
        cmd.add_argument("--reason", required=True, help="why (recorded)")
        cmd.add_argument("--by", required=True, metavar="WHO", help="who asks (recorded too)")
        cmd.set_defaults(func=_cmd_set, optout_out=out_of)
    ls = sub.add_parser("list", help="recipients opted out now, newest first (masked)")
    ls.add_argument("--instance", default=None, help="only this instance's")
    ls.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    ls.add_argument("--json", action="store_true", help="one JSON array on stdout")
    ls.set_defaults(func=_cmd_list)
