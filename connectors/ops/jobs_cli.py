"""``zapstream jobs list|cancel|reprocess``: what operators see of jobs, and how they act on them.

::

    zapstream jobs list [--state S]... [--instance I] [--since ISO | --last 1h] [--until ISO]
                        [--limit 50] [--page 1]
    zapstream jobs cancel ID --reason R --by WHO [--wait 30]
    zapstream jobs reprocess ID --reason R --by WHO [--wait 30] [--yes]

``list`` shows jobs with their recipient masked and never their text. ``cancel``
and ``reprocess`` write a command into ``outbox_commands`` (see
:mod:`connectors.outbox.commands`) in their own transaction; the worker applies it and
records the outcome, with who and why, in ``outbox_job_events``, which these
commands poll for up to ``--wait`` seconds. A command the worker has not handled
yet stays requested: it is applied when the worker gets to it.

Exit codes: 0 done (cancelled; reprocessing taken up by the worker), 1 not done
(the worker refused, or has not handled the command yet), 2 refused here (no
such job, a job that may not be reprocessed, an uncertain job without ``--yes``).

The functions take the DSN and an output stream so they can be tested without
the argument parser; :func:`add_jobs_parser` wires them into ``zapstream``. The
queries they run are in :mod:`connectors.ops.jobs_sql`, the text they print is
made by :mod:`connectors.ops.jobs_render`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import psycopg

from connectors.ops.jobs_render import (
    events_table,
    human_age,
    job_summary,
    jobs_table,
    page_footer,
    when,
)
from connectors.ops.jobs_sql import (
    Job,
    JobEvent,
    database_now,
    fetch_events,
    fetch_job,
    fetch_job_page,
    poll_events,
    request_command,
)
from connectors.outbox.commands import InvalidCommand, request_cancel_by_id, request_reprocess
from streams.contract import JobStatus

__all__ = [
    "EXIT_DONE",
    "EXIT_NOT_DONE",
    "EXIT_REFUSED",
    "REPROCESSABLE",
    "add_jobs_parser",
    "cancel_job",
    "human_age",  # lives in jobs_render; still importable from here
    "list_jobs",
    "parse_duration",
    "parse_instant",
    "reprocess_job",
]

EXIT_DONE = 0
EXIT_NOT_DONE = 1
EXIT_REFUSED = 2

REPROCESSABLE = frozenset({JobStatus.DEAD, JobStatus.UNCERTAIN, JobStatus.FAILED})
"""Statuses an operator may reprocess: the job will not be attempted again on its own."""
_IN_PROGRESS = frozenset({JobStatus.PENDING, JobStatus.ATTEMPTING, JobStatus.RETRY_WAIT})

DEFAULT_WAIT_S = 30.0
POLL_INTERVAL_S = 0.5


# --- parsing ------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``1h``, ``1h30m``, ``2d``, ``1w`` as a timedelta."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 15m, 1h30m, 2d)")
    return dt.timedelta(seconds=sum(int(n) * _DURATION_UNITS[u] for n, u in parts))


def parse_instant(text: str) -> dt.datetime:
    """An ISO 8601 date or date-time; without an offset it is taken as UTC."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"not an ISO 8601 date-time: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


# --- outcomes --------------------------------------------------------------------------


def _still_pending(out: TextIO, command_id: int) -> int:
    print(
        f"still pending: the worker has not handled it yet (command {command_id} stays "
        "requested; its outcome will appear in the job's events)",
        file=out,
    )
    return EXIT_NOT_DONE


# --- jobs list ---------------------------------------------------------------------


def list_jobs(
    dsn: str,
    *,
    states: Sequence[str] = (),
    instance: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    limit: int = 50,
    page: int = 1,
    out: TextIO | None = None,
    now: dt.datetime | None = None,
) -> int:
    """Print one page of jobs, newest first; ``since``/``until`` bound their creation time."""
    out = out or sys.stdout
    if limit < 1 or page < 1:
        raise ValueError("limit and page must be positive")
    # Checked before connecting: an unknown status is the caller's error, not the database's.
    statuses = [JobStatus(s.upper()).value for s in states]
    with psycopg.connect(dsn, autocommit=True) as conn:
        if now is None:
            # The database's clock, the one created_at was written with.
            now = database_now(conn)
        result = fetch_job_page(
            conn,
            statuses=statuses,
            instance=instance,
            since=since,
            until=until,
            limit=limit,
            page=page,
        )
    print(jobs_table(result.jobs, now=now), file=out)
    print(page_footer(page=page, limit=limit, total=result.total), file=out)
    return EXIT_DONE


# --- jobs cancel -----------------------------------------------------------------------


def _cancel_settled(events: list[JobEvent]) -> bool:
    return any(e.to_status == JobStatus.CANCELLED or _is_cancel_note(e) for e in events)


def _is_cancel_note(event: JobEvent) -> bool:
    return event.is_note and (event.reason or "").lower().startswith("cancel")


def cancel_job(
    dsn: str,
    job_id: int,
    *,
    reason: str,
    actor: str,
    wait_s: float = DEFAULT_WAIT_S,
    out: TextIO | None = None,
    poll_interval_s: float = POLL_INTERVAL_S,
) -> int:
    """Request the job's cancellation and report the worker's outcome within ``wait_s``."""
    out = out or sys.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = fetch_job(conn, job_id)
        if job is None:
            print(f"no job {job_id}", file=out)
            return EXIT_REFUSED
        try:
            command_id, baseline = request_command(
                conn, job_id, lambda c: request_cancel_by_id(c, job_id, reason, actor)
            )
        except InvalidCommand as exc:
            print(f"cannot cancel job {job_id}: {exc}", file=out)
            return EXIT_REFUSED
        print(
            f"cancel requested for job {job_id} ({job.status}): command {command_id} "
            f"by {actor.strip()}: {reason.strip()}",
            file=out,
        )
        events = poll_events(
            conn,
            job_id,
            baseline,
            wait_s=wait_s,
            poll_interval_s=poll_interval_s,
            settled=_cancel_settled,
        )
    for event in events:
        if event.to_status == JobStatus.CANCELLED:
            print(
                f"CANCELLED: job {job_id} by {event.actor} at {when(event.at)}"
                f" ({event.reason or 'no reason given'})",
                file=out,
            )
            return EXIT_DONE
        if _is_cancel_note(event):
            print(
                f"NOT CANCELLED: job {job_id} is {event.to_status}: {event.reason}",
                file=out,
            )
            return EXIT_NOT_DONE
    return _still_pending(out, command_id)


# --- jobs reprocess ---------------------------------------------------------------------


def _looks_uncertain(job: Job, history: list[JobEvent]) -> bool:
    """Whether the last attempt may have reached the gateway (so a resend may duplicate it)."""
    if job.status == JobStatus.UNCERTAIN:
        return True
    if not history:
        return False
    last = history[-1]
    return last.to_status == JobStatus.UNCERTAIN or "uncertain" in (last.reason or "").lower()


def _is_reprocess_refusal(event: JobEvent) -> bool:
    # The worker notes an accepted reprocess too ("reprocess requested: ..."),
    # before the new attempt; only "reprocess refused: ..." is a refusal.
    return event.is_note and (event.reason or "").lower().startswith("reprocess refused")


def _reprocess_settled(events: list[JobEvent]) -> bool:
    if any(_is_reprocess_refusal(e) for e in events):
        return True
    moves = [e for e in events if not e.is_note]
    return bool(moves) and moves[-1].to_status not in _IN_PROGRESS


def reprocess_job(
    dsn: str,
    job_id: int,
    *,
    reason: str,
    actor: str,
    wait_s: float = DEFAULT_WAIT_S,
    yes: bool = False,
    out: TextIO | None = None,
    poll_interval_s: float = POLL_INTERVAL_S,
) -> int:
    """Show the job's history, then request that it be sent again and report the outcome.

    Refused (exit 2) unless the job is DEAD, UNCERTAIN or FAILED, and, when its
    last attempt may have been delivered, unless ``yes`` confirms that a
    duplicate is acceptable.
    """
    out = out or sys.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = fetch_job(conn, job_id)
        if job is None:
            print(f"no job {job_id}", file=out)
            return EXIT_REFUSED
        if job.status not in REPROCESSABLE:
            allowed = ", ".join(sorted(REPROCESSABLE))
            print(
                f"refusing to reprocess job {job_id}: it is {job.status}; "
                f"only {allowed} jobs can be reprocessed",
                file=out,
            )
            return EXIT_REFUSED
        print(job_summary(job), file=out)
        history = fetch_events(conn, job_id, after_id=None)
        if history:
            print("history:", file=out)
            print(events_table(history), file=out)
        else:
            print("history: no transitions recorded", file=out)
        if _looks_uncertain(job, history):
            print(
                "\n"
                "!!! WARNING: the outcome of this job's last attempt is UNCERTAIN.\n"
                "!!! The gateway may already have DELIVERED this message.\n"
                "!!! Reprocessing may send it TWICE to the recipient.\n"
                "!!! Check with the gateway or the recipient first.\n",
                file=out,
            )
            if not yes:
                print("not reprocessed: re-run with --yes to reprocess anyway", file=out)
                return EXIT_REFUSED
        if job.expires_at is not None and job.expires_at <= dt.datetime.now(dt.UTC):
            print(
                f"note: the job expired at {when(job.expires_at)}; "
                "the worker will expire it again instead of sending it",
                file=out,
            )
        try:
            command_id, baseline = request_command(
                conn, job_id, lambda c: request_reprocess(c, job_id, reason, actor)
            )
        except InvalidCommand as exc:
            print(f"cannot reprocess job {job_id}: {exc}", file=out)
            return EXIT_REFUSED
        print(
            f"reprocess requested for job {job_id}: command {command_id} "
            f"by {actor.strip()}: {reason.strip()}",
            file=out,
        )
        events = poll_events(
            conn,
            job_id,
            baseline,
            wait_s=wait_s,
            poll_interval_s=poll_interval_s,
            settled=_reprocess_settled,
        )
    if not events:
        return _still_pending(out, command_id)
    print(events_table(events), file=out)
    refusals = [e for e in events if _is_reprocess_refusal(e)]
    if refusals:
        print(f"NOT REPROCESSED: job {job_id}: {refusals[-1].reason}", file=out)
        return EXIT_NOT_DONE
    moves = [e for e in events if not e.is_note]
    if not moves:
        return _still_pending(out, command_id)
    status = moves[-1].to_status
    suffix = " (still in progress)" if status in _IN_PROGRESS else ""
    print(f"job {job_id} is now {status}{suffix}", file=out)
    return EXIT_DONE


# --- argparse wiring -----------------------------------------------------------------------


def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Make a parser's ValueError an argparse error that shows its message."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    wrapped.__name__ = parse.__name__
    return wrapped


def _status(text: str) -> str:
    try:
        return JobStatus(text.strip().upper()).value
    except ValueError:
        raise ValueError(
            f"unknown status {text!r}; one of {', '.join(s.value for s in JobStatus)}"
        ) from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be a positive integer, not {text!r}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"must be a number of seconds >= 0, not {text!r}")
    return value


def _dsn() -> str:
    from streams.settings import PostgresSettings

    return PostgresSettings().dsn


def _cmd_list(args: argparse.Namespace) -> int:
    since: dt.datetime | None = args.since
    if args.last is not None:
        since = dt.datetime.now(dt.UTC) - args.last
    return list_jobs(
        _dsn(),
        states=args.state or (),
        instance=args.instance,
        since=since,
        until=args.until,
        limit=args.limit,
        page=args.page,
    )


def _cmd_cancel(args: argparse.Namespace) -> int:
    return cancel_job(_dsn(), args.job_id, reason=args.reason, actor=args.by, wait_s=args.wait)


def _cmd_reprocess(args: argparse.Namespace) -> int:
    return reprocess_job(
        _dsn(), args.job_id, reason=args.reason, actor=args.by, wait_s=args.wait, yes=args.yes
    )


def _add_command_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", type=_arg(_positive_int), help="the job's id")
    parser.add_argument("--reason", required=True, help="why (recorded with the job's events)")
    parser.add_argument("--by", required=True, metavar="WHO", help="who asks (recorded too)")
    parser.add_argument(
        "--wait",
        type=_arg(_seconds),
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait for the worker's outcome (default {DEFAULT_WAIT_S:g})",
    )


def add_jobs_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``jobs list|cancel|reprocess``; each sets ``func(args) -> exit code``."""
    jobs = subparsers.add_parser("jobs", help="list, cancel and reprocess jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)

    ls = jobs_sub.add_parser(
        "list", help="list jobs, newest first (recipients masked, never the text)"
    )
    ls.add_argument(
        "--state",
        action="append",
        type=_arg(_status),
        metavar="S",
        help="only jobs in this status (repeatable)",
    )
    ls.add_argument("--instance", metavar="I", help="only jobs of this WhatsApp instance")
    window = ls.add_mutually_exclusive_group()
    window.add_argument(
        "--since",
        type=_arg(parse_instant),
        metavar="ISO",
        help="only jobs created at or after this time (UTC unless an offset is given)",
    )
    window.add_argument(
        "--last",
        type=_arg(parse_duration),
        metavar="DURATION",
        help="only jobs created in the last DURATION (90s, 15m, 1h, 2d)",
    )
    ls.add_argument(
        "--until", type=_arg(parse_instant), metavar="ISO", help="only jobs created before this"
    )
    ls.add_argument("--limit", type=_arg(_positive_int), default=50, help="jobs per page")
    ls.add_argument("--page", type=_arg(_positive_int), default=1, help="page number, from 1")
    ls.set_defaults(func=_cmd_list)

    cancel = jobs_sub.add_parser("cancel", help="cancel a job that has not been sent yet")
    _add_command_options(cancel)
    cancel.set_defaults(func=_cmd_cancel)

    reprocess = jobs_sub.add_parser("reprocess", help="send a DEAD, UNCERTAIN or FAILED job again")
    _add_command_options(reprocess)
    reprocess.add_argument(
        "--yes",
        action="store_true",
        help="reprocess even if the last attempt may have been delivered (may send twice)",
    )
    reprocess.set_defaults(func=_cmd_reprocess)
