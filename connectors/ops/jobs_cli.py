"""``zapstream jobs list|cancel|reprocess``: what operators see of jobs, and how they act on them.

::

    zapstream jobs list [--state S]... [--instance I] [--since ISO | --last 1h] [--until ISO]
                        [--limit 50] [--page 1] [--json]
    zapstream jobs show ID | --key KEY [--json]
    zapstream jobs cancel ID --reason R --by WHO [--wait 30]
    zapstream jobs reprocess ID --reason R --by WHO [--wait 30] [--yes]
    zapstream jobs reprocess --state S [--state S2] [--instance I] [--since 2h|ISO]
                             [--until ISO] --reason R --by WHO [--dry-run] [--yes]
                             [--limit 1000]

``list`` shows jobs with their recipient masked and never their text; ``show``
one job's whole story: its columns (recipient masked, text never read), every
attempt, every event with who and why, the commands asked for it and their
answers, restreams, and the pauses holding it now. ``cancel``
and ``reprocess`` write a command into ``outbox_commands`` (see
:mod:`connectors.outbox.commands`) in their own transaction; the worker applies it and
answers with an event in ``outbox_job_events`` that carries the command's id and
a structured outcome (``cancelled``, ``cancel_refused``, ``reprocessed``, ...);
these commands poll for it up to ``--wait`` seconds, and a reprocess then for the
job's next settled state. A command the worker has not handled yet stays
requested: it is applied when the worker gets to it. An INVALID job (the relay
rejected its row) is refused here: it was never sent, and its row is malformed.

``reprocess`` without an ID reprocesses every job matching the filters (oldest
first, at most ``--limit``): ``--dry-run`` prints how many and a few masked
examples and changes nothing; more than :data:`BULK_CONFIRM_ABOVE` jobs, or any
UNCERTAIN one, need ``--yes``. One command per job is written in one transaction.

Exit codes: 0 done (cancelled; reprocessing taken up by the worker; bulk
requested or dry run), 1 not done (the worker refused, or has not handled the
command yet), 2 refused here (no such job, a job that may not be cancelled or
reprocessed, an uncertain job or a large bulk without ``--yes``).

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
    job_history_json,
    job_history_text,
    job_summary,
    jobs_json,
    jobs_table,
    page_footer,
    when,
)
from connectors.ops.jobs_sql import (
    Job,
    JobEvent,
    JobFilter,
    count_jobs,
    database_now,
    fetch_events,
    fetch_history,
    fetch_job,
    fetch_job_page,
    matching_job_ids,
    poll_events,
)
from connectors.outbox.commands import (
    InvalidCommand,
    request_cancel_by_id,
    request_reprocess,
    request_reprocess_many,
)
from streams.kernel import state_machine
from streams.kernel.contract import CommandOutcome, JobStatus

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
    "parse_since",
    "reprocess_job",
    "reprocess_matching",
    "show_job",
]

EXIT_DONE = 0
EXIT_NOT_DONE = 1
EXIT_REFUSED = 2

REPROCESSABLE = state_machine.REPROCESSABLE
"""Statuses an operator may reprocess (DEAD, FAILED, UNCERTAIN): the job will not be
attempted again on its own. The worker applies the same rule."""
_IN_PROGRESS = frozenset({JobStatus.PENDING, JobStatus.ATTEMPTING, JobStatus.RETRY_WAIT})

DEFAULT_WAIT_S = 30.0
POLL_INTERVAL_S = 0.5
BULK_CONFIRM_ABOVE = 10
"""A bulk reprocess of more jobs than this needs ``--yes``."""
DEFAULT_BULK_LIMIT = 1000
BULK_EXAMPLES = 5


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


def parse_since(text: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """A duration back from now (``2h``, ``90m``) or an ISO 8601 date-time."""
    try:
        delta = parse_duration(text)
    except ValueError:
        try:
            return parse_instant(text)
        except ValueError:
            raise ValueError(
                f"not a duration or an ISO 8601 date-time: {text!r} (e.g. 2h, 2026-01-31T12:00)"
            ) from None
    return (now or dt.datetime.now(dt.UTC)) - delta


# --- outcomes --------------------------------------------------------------------------


def _answer(events: list[JobEvent], command_id: int) -> JobEvent | None:
    """The worker's answer to command ``command_id``: the event that carries its id."""
    return next((e for e in events if e.command_id == command_id), None)


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
    as_json: bool = False,
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
    if as_json:
        print(jobs_json(result.jobs, now=now, page=page, limit=limit, total=result.total), file=out)
        return EXIT_DONE
    print(jobs_table(result.jobs, now=now), file=out)
    print(page_footer(page=page, limit=limit, total=result.total), file=out)
    return EXIT_DONE


# --- jobs show ---------------------------------------------------------------------------


def show_job(
    dsn: str,
    job_id: int | None = None,
    *,
    key: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    """Print one job and everything that happened to it; exit 2 when there is no such job."""
    out = out or sys.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        now = database_now(conn)
        history = fetch_history(conn, job_id=job_id, key=key)
    if history is None:
        # The key is the caller's own; it is not repeated (keys stay out of output and logs).
        print(f"no job {job_id}" if job_id is not None else "no job with that key", file=out)
        return EXIT_REFUSED
    text = job_history_json if as_json else job_history_text
    print(text(history, now=now), file=out)
    return EXIT_DONE


# --- jobs cancel -----------------------------------------------------------------------


def _refuse_invalid(out: TextIO, job: Job, action: str) -> int:
    print(
        f"refusing to {action} job {job.id}: it is INVALID (the relay rejected its row: "
        f"{job.last_error or 'no reason recorded'}); it was never sent and never will be. "
        "Fix the data and enqueue a new job.",
        file=out,
    )
    return EXIT_REFUSED


def _request_and_poll(
    conn: psycopg.Connection[Any],
    job_id: int,
    out: TextIO,
    *,
    verb: str,
    shown: str,
    request: Callable[[], int],
    settled: Callable[[list[JobEvent], int], bool],
    reason: str,
    actor: str,
    wait_s: float,
    poll_interval_s: float,
) -> tuple[int, list[JobEvent]] | None:
    """Request a command in its own transaction, then poll the job's events for the answer.

    None (after printing why) when the command is refused before it is written;
    otherwise the command id and the events seen when ``settled`` said so or
    ``wait_s`` ran out.
    """
    try:
        with conn.transaction():
            command_id = request()
    except InvalidCommand as exc:
        print(f"cannot {verb} job {job_id}: {exc}", file=out)
        return None
    print(
        f"{shown}: command {command_id} by {actor.strip()}: {reason.strip()}",
        file=out,
    )
    events = poll_events(
        conn,
        job_id,
        wait_s=wait_s,
        poll_interval_s=poll_interval_s,
        settled=lambda evs: settled(evs, command_id),
    )
    return command_id, events


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
        if job.status == JobStatus.INVALID:
            return _refuse_invalid(out, job, "cancel")
        requested = _request_and_poll(
            conn,
            job_id,
            out,
            verb="cancel",
            shown=f"cancel requested for job {job_id} ({job.status})",
            request=lambda: request_cancel_by_id(conn, job_id, reason, actor),
            settled=lambda evs, command_id: _answer(evs, command_id) is not None,
            reason=reason,
            actor=actor,
            wait_s=wait_s,
            poll_interval_s=poll_interval_s,
        )
        if requested is None:
            return EXIT_REFUSED
        command_id, events = requested
    answer = _answer(events, command_id)
    if answer is None:
        return _still_pending(out, command_id)
    if answer.outcome == CommandOutcome.CANCELLED:
        print(
            f"CANCELLED: job {job_id} by {answer.actor} at {when(answer.at)}"
            f" ({answer.reason or 'no reason given'})",
            file=out,
        )
        return EXIT_DONE
    print(
        f"NOT CANCELLED ({answer.outcome}): job {job_id} is {answer.to_status}: {answer.reason}",
        file=out,
    )
    return EXIT_NOT_DONE


# --- jobs reprocess ---------------------------------------------------------------------


def _looks_uncertain(job: Job, history: list[JobEvent]) -> bool:
    """Whether the last attempt may have reached the gateway (so a resend may duplicate it)."""
    if job.status == JobStatus.UNCERTAIN:
        return True
    if not history:
        return False
    last = history[-1]
    return last.to_status == JobStatus.UNCERTAIN or "uncertain" in (last.reason or "").lower()


def _since_answer(events: list[JobEvent], command_id: int) -> list[JobEvent]:
    """The worker's answer to the command and every event after it, in version order."""
    answer = _answer(events, command_id)
    if answer is None:
        return []
    return [answer, *(e for e in events if e.version > answer.version)]


def _reprocess_settled(events: list[JobEvent], command_id: int) -> bool:
    """Refused, or taken up and moved on to a state that is not in progress."""
    followed = _since_answer(events, command_id)
    if not followed:
        return False
    if followed[0].outcome != CommandOutcome.REPROCESSED:
        return True
    moves = [e for e in followed[1:] if not e.is_note]
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
        if job.status == JobStatus.INVALID:
            return _refuse_invalid(out, job, "reprocess")
        if job.status not in REPROCESSABLE:
            allowed = ", ".join(sorted(REPROCESSABLE))
            print(
                f"refusing to reprocess job {job_id}: it is {job.status}; "
                f"only {allowed} jobs can be reprocessed",
                file=out,
            )
            return EXIT_REFUSED
        print(job_summary(job), file=out)
        history = fetch_events(conn, job_id)
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
        requested = _request_and_poll(
            conn,
            job_id,
            out,
            verb="reprocess",
            shown=f"reprocess requested for job {job_id}",
            request=lambda: request_reprocess(conn, job_id, reason, actor),
            settled=_reprocess_settled,
            reason=reason,
            actor=actor,
            wait_s=wait_s,
            poll_interval_s=poll_interval_s,
        )
        if requested is None:
            return EXIT_REFUSED
        command_id, events = requested
    followed = _since_answer(events, command_id)
    if not followed:
        return _still_pending(out, command_id)
    print(events_table(followed), file=out)
    answer = followed[0]
    if answer.outcome != CommandOutcome.REPROCESSED:
        print(f"NOT REPROCESSED ({answer.outcome}): job {job_id}: {answer.reason}", file=out)
        return EXIT_NOT_DONE
    moves = [e for e in followed[1:] if not e.is_note]
    status = moves[-1].to_status if moves else answer.to_status
    suffix = " (still in progress)" if not moves or status in _IN_PROGRESS else ""
    print(f"job {job_id} is now {status}{suffix}", file=out)
    return EXIT_DONE


def reprocess_matching(
    dsn: str,
    *,
    states: Sequence[str],
    instance: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    reason: str,
    actor: str,
    dry_run: bool = False,
    yes: bool = False,
    limit: int = DEFAULT_BULK_LIMIT,
    out: TextIO | None = None,
) -> int:
    """Reprocess every job matching the filters (oldest first, at most ``limit``).

    Refused (exit 2) for a state that may not be reprocessed, and without ``yes``
    for more than :data:`BULK_CONFIRM_ABOVE` jobs or for UNCERTAIN ones. A dry
    run prints the count and a few masked examples and writes nothing.
    """
    out = out or sys.stdout
    statuses = sorted({JobStatus(s.strip().upper()) for s in states})
    if not statuses:
        print("refusing a bulk reprocess without --state", file=out)
        return EXIT_REFUSED
    if not reason.strip() or not actor.strip():
        print("refusing a bulk reprocess without --reason and --by", file=out)
        return EXIT_REFUSED
    if limit < 1:
        raise ValueError("limit must be positive")
    refused = [s for s in statuses if s not in REPROCESSABLE]
    if refused:
        allowed = ", ".join(sorted(REPROCESSABLE))
        print(
            f"refusing to reprocess {', '.join(refused)} jobs: only {allowed} jobs can be "
            "reprocessed"
            + (
                " (INVALID rows are malformed: fix the data and enqueue new jobs)"
                if JobStatus.INVALID in refused
                else ""
            ),
            file=out,
        )
        return EXIT_REFUSED
    job_filter = JobFilter([s.value for s in statuses], instance, since, until)
    with psycopg.connect(dsn, autocommit=True) as conn:
        now = database_now(conn)
        total = count_jobs(conn, job_filter)
        chosen = min(total, limit)
        described = _describe(job_filter)
        print(f"{total} jobs match ({described})", file=out)
        if total == 0:
            print("nothing to reprocess", file=out)
            return EXIT_DONE
        examples = fetch_job_page(
            conn,
            statuses=job_filter.statuses,
            instance=instance,
            since=since,
            until=until,
            limit=BULK_EXAMPLES,
            page=1,
        )
        print(f"newest {len(examples.jobs)} of them:", file=out)
        print(jobs_table(examples.jobs, now=now), file=out)
        if total > limit:
            print(
                f"only the oldest {limit} would be reprocessed now (--limit); run again for "
                "the rest",
                file=out,
            )
        uncertain = JobStatus.UNCERTAIN in statuses
        if uncertain:
            print(
                "\n"
                "!!! WARNING: UNCERTAIN jobs may already have been DELIVERED by the gateway.\n"
                "!!! Reprocessing them may send those messages TWICE.\n",
                file=out,
            )
        if dry_run:
            print(f"dry run: {chosen} jobs would be reprocessed; nothing was requested", file=out)
            return EXIT_DONE
        if not yes and (chosen > BULK_CONFIRM_ABOVE or uncertain):
            why = "UNCERTAIN jobs" if uncertain else f"more than {BULK_CONFIRM_ABOVE} jobs"
            print(
                f"not reprocessed: {chosen} jobs, {why}; re-run with --yes to reprocess them",
                file=out,
            )
            return EXIT_REFUSED
        try:
            with conn.transaction():
                job_ids = matching_job_ids(conn, job_filter, limit=limit)
                command_ids = request_reprocess_many(conn, job_ids, reason, actor)
        except InvalidCommand as exc:
            print(f"cannot reprocess: {exc}", file=out)
            return EXIT_REFUSED
    if not command_ids:
        print("nothing reprocessed: no matching job was left to reprocess", file=out)
        return EXIT_DONE
    print(
        f"reprocess requested for {len(command_ids)} jobs (commands {command_ids[0]}.."
        f"{command_ids[-1]}) by {actor.strip()}: {reason.strip()}",
        file=out,
    )
    print(
        "follow them with: zapstream jobs list "
        + " ".join(f"--state {s}" for s in (*statuses, "ACCEPTED"))
        + (f" --instance {instance}" if instance else ""),
        file=out,
    )
    return EXIT_DONE


def _describe(job_filter: JobFilter) -> str:
    parts = [f"state {' or '.join(job_filter.statuses)}"]
    if job_filter.instance is not None:
        parts.append(f"instance {job_filter.instance}")
    if job_filter.since is not None:
        parts.append(f"created since {when(job_filter.since)}")
    if job_filter.until is not None:
        parts.append(f"created before {when(job_filter.until)}")
    return ", ".join(parts)


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
    from streams.kernel.settings import PostgresSettings

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
        as_json=args.json,
    )


def _cmd_show(args: argparse.Namespace) -> int:
    if (args.job_id is None) == (args.key is None):
        args.error("give a job ID or --key KEY (one of them)")
    return show_job(_dsn(), args.job_id, key=args.key, as_json=args.json)


def _cmd_cancel(args: argparse.Namespace) -> int:
    return cancel_job(_dsn(), args.job_id, reason=args.reason, actor=args.by, wait_s=args.wait)


def _cmd_reprocess(args: argparse.Namespace) -> int:
    filters = {
        "--state": args.state,
        "--instance": args.instance,
        "--since": args.since,
        "--until": args.until,
        "--dry-run": args.dry_run or None,
        "--limit": args.limit,
    }
    given = [name for name, value in filters.items() if value is not None]
    if args.job_id is not None:
        if given:
            args.error(f"give a job ID or filters, not both (got ID and {', '.join(given)})")
        return reprocess_job(
            _dsn(), args.job_id, reason=args.reason, actor=args.by, wait_s=args.wait, yes=args.yes
        )
    if not args.state:
        args.error("give a job ID, or --state (and other filters) to reprocess many jobs")
    return reprocess_matching(
        _dsn(),
        states=args.state,
        instance=args.instance,
        since=args.since,
        until=args.until,
        reason=args.reason,
        actor=args.by,
        dry_run=args.dry_run,
        yes=args.yes,
        limit=args.limit if args.limit is not None else DEFAULT_BULK_LIMIT,
    )


def _add_command_options(parser: argparse.ArgumentParser, *, optional_id: bool = False) -> None:
    parser.add_argument(
        "job_id",
        metavar="ID",
        type=_arg(_positive_int),
        nargs="?" if optional_id else None,
        help="the job's id" + (" (or filters, to reprocess many)" if optional_id else ""),
    )
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
    """Register ``jobs list|show|cancel|reprocess``; each sets ``func(args) -> exit code``."""
    jobs = subparsers.add_parser("jobs", help="list, show, cancel and reprocess jobs")
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
    ls.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ls.set_defaults(func=_cmd_list)

    show = jobs_sub.add_parser(
        "show",
        help="one job's whole history: attempts, events, commands (recipient masked, no text)",
    )
    show.add_argument(
        "job_id", metavar="ID", type=_arg(_positive_int), nargs="?", help="the job's id"
    )
    show.add_argument("--key", metavar="KEY", help="find the job by its idempotency key instead")
    show.add_argument("--json", action="store_true", help="one JSON object on stdout")
    show.set_defaults(func=_cmd_show, error=show.error)

    cancel = jobs_sub.add_parser("cancel", help="cancel a job that has not been sent yet")
    _add_command_options(cancel)
    cancel.set_defaults(func=_cmd_cancel)

    reprocess = jobs_sub.add_parser(
        "reprocess",
        help="send a DEAD, UNCERTAIN or FAILED job again, or every job matching filters",
    )
    _add_command_options(reprocess, optional_id=True)
    reprocess.add_argument(
        "--yes",
        action="store_true",
        help="reprocess even if the last attempt may have been delivered (may send twice), "
        f"or more than {BULK_CONFIRM_ABOVE} jobs at once",
    )
    bulk = reprocess.add_argument_group("many jobs at once (instead of ID)")
    bulk.add_argument(
        "--state",
        action="append",
        type=_arg(_status),
        metavar="S",
        help="jobs in this status: DEAD, FAILED or UNCERTAIN (repeatable; required)",
    )
    bulk.add_argument("--instance", metavar="I", help="only jobs of this WhatsApp instance")
    bulk.add_argument(
        "--since",
        type=_arg(parse_since),
        metavar="DURATION|ISO",
        help="only jobs created in the last DURATION (2h, 1d) or since this time",
    )
    bulk.add_argument(
        "--until", type=_arg(parse_instant), metavar="ISO", help="only jobs created before this"
    )
    bulk.add_argument(
        "--dry-run",
        action="store_true",
        help="print how many jobs match, and a few of them; change nothing",
    )
    bulk.add_argument(
        "--limit",
        type=_arg(_positive_int),
        metavar="N",
        help=f"reprocess at most N jobs, oldest first (default {DEFAULT_BULK_LIMIT})",
    )
    reprocess.set_defaults(func=_cmd_reprocess, error=reprocess.error)
