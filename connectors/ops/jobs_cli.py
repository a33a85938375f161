"""``zapstream jobs list|cancel|reschedule|reprocess``: what operators see of jobs, and how
they act on them.

::

    zapstream jobs list [--state S]... [--instance I] [--since ISO | --last 1h] [--until ISO]
                        [--limit 50] [--page 1] [--json]
    zapstream jobs show ID | --key KEY [--json]
    zapstream jobs cancel ID --reason R --by WHO [--wait 30]
    zapstream jobs reschedule ID (--at ISO | --in DURATION)
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

``reschedule`` moves a SCHEDULED job (one not released yet: see
:mod:`connectors.outbox.schedule`) to another time, at once, in its own transaction;
a job already released, cancelled or never scheduled is refused (exit 2).

``reprocess`` without an ID reprocesses every job matching the filters (oldest
first, at most ``--limit``): ``--dry-run`` prints how many and a few masked
examples and changes nothing; more than :data:`BULK_CONFIRM_ABOVE` jobs, or any
that may already have been delivered, need ``--yes``. One command per job is
written in one transaction.

What is refused, what needs ``--yes`` and how the worker's answer is read is
decided by :mod:`connectors.ops.actions`, the core the console calls too; "may
already have been delivered" is :mod:`connectors.ops.delivery_risk` (UNCERTAIN
now or in the job's history, a REVIEW or DELIVERED status, or an attempt with no
recorded outcome). Durations (``--last``, ``--since 2h``) are
:mod:`connectors.ops.durations`' grammar: ``90s``, ``1h30m``, ``1.5h``, ``2d``, ``1w``.

Exit codes: 0 done (cancelled; reprocessing taken up by the worker; bulk
requested or dry run), 1 not done (the worker refused, or has not handled the
command yet), 2 refused here (no such job, a job that may not be cancelled or
reprocessed, a job that may already have been delivered or a large bulk without
``--yes``).

The functions take the DSN and an output stream so they can be tested without
the argument parser; :func:`add_jobs_parser` wires them into ``zapstream``. The
queries they run are in :mod:`connectors.ops.jobs_sql`, the text they print is
made by :mod:`connectors.ops.jobs_render`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import psycopg

from connectors.ops.actions import (
    BULK_CONFIRM_ABOVE,
    Action,
    Answer,
    BulkPlan,
    Plan,
    bulk_refused,
    plan_many,
    plan_one,
    request_many,
    request_one,
    wait_for_answer,
)
from connectors.ops.delivery_risk import DeliveryRisk
from connectors.ops.durations import parse_duration, parse_instant, parse_since
from connectors.ops.job_filter import JobFilter
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
from connectors.ops.jobs_sql import Job, database_now, fetch_history, fetch_page
from connectors.outbox.commands import InvalidCommand
from connectors.outbox.schedule import NotRescheduled, reschedule
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
    "parse_duration",  # the durations live in connectors.ops.durations
    "parse_instant",
    "parse_since",
    "reprocess_job",
    "reprocess_matching",
    "reschedule_job",
    "show_job",
]

EXIT_DONE = 0
EXIT_NOT_DONE = 1
EXIT_REFUSED = 2

REPROCESSABLE = state_machine.REPROCESSABLE
"""Statuses an operator may reprocess (DEAD, FAILED, UNCERTAIN): the job will not be
attempted again on its own. The worker applies the same rule."""

DEFAULT_WAIT_S = 30.0
POLL_INTERVAL_S = 0.5
DEFAULT_BULK_LIMIT = 1000
BULK_EXAMPLES = 5


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
    as_json: bool = False,
) -> int:
    """Print one page of jobs, newest first; ``since``/``until`` bound their creation time."""
    out = out or sys.stdout
    if limit < 1 or page < 1:
        raise ValueError("limit and page must be positive")
    # Checked before connecting: an unknown status is the caller's error, not the database's.
    statuses = [JobStatus(s.upper()).value for s in states]
    job_filter = JobFilter(statuses, instance, since, until)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if now is None:
            # The database's clock, the one created_at was written with.
            now = database_now(conn)
        result = fetch_page(conn, job_filter, page=page, page_size=limit)
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


# --- jobs cancel and reprocess: one job ----------------------------------------------------


def _refused(out: TextIO, plan: Plan) -> int:
    """Say why the core refused ``plan`` here (nothing was written)."""
    job = plan.job
    if job.status == JobStatus.INVALID:
        print(
            f"refusing to {plan.action} job {job.id}: it is INVALID (the relay rejected its "
            f"row: {job.last_error or 'no reason recorded'}); it was never sent and never "
            "will be. Fix the data and enqueue a new job.",
            file=out,
        )
    else:
        allowed = ", ".join(sorted(REPROCESSABLE))
        print(
            f"refusing to {plan.action} job {job.id}: it is {job.status}; "
            f"only {allowed} jobs can be reprocessed",
            file=out,
        )
    return EXIT_REFUSED


def _request_and_wait(
    conn: psycopg.Connection[Any],
    plan: Plan,
    out: TextIO,
    *,
    shown: str,
    reason: str,
    actor: str,
    wait_s: float,
    poll_interval_s: float,
) -> Answer | None:
    """Request the plan's command in its own transaction, then wait for the worker's answer.

    None (after printing why) when the database refuses the command.
    """
    job_id = plan.job.id
    try:
        command_id = request_one(conn, plan.action, job_id, reason=reason, actor=actor)
    except InvalidCommand as exc:
        print(f"cannot {plan.action} job {job_id}: {exc}", file=out)
        return None
    print(f"{shown}: command {command_id} by {actor.strip()}: {reason.strip()}", file=out)
    return wait_for_answer(
        conn, plan.action, job_id, command_id, wait_s=wait_s, poll_interval_s=poll_interval_s
    )


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
        plan = plan_one(conn, Action.CANCEL, job_id)
        if plan is None:
            print(f"no job {job_id}", file=out)
            return EXIT_REFUSED
        if plan.refused:
            return _refused(out, plan)
        answer = _request_and_wait(
            conn,
            plan,
            out,
            shown=f"cancel requested for job {job_id} ({plan.job.status})",
            reason=reason,
            actor=actor,
            wait_s=wait_s,
            poll_interval_s=poll_interval_s,
        )
    if answer is None:
        return EXIT_REFUSED
    event = answer.event
    if event is None:
        return _still_pending(out, answer.command_id)
    if event.outcome == CommandOutcome.CANCELLED:
        print(
            f"CANCELLED: job {job_id} by {event.actor} at {when(event.at)}"
            f" ({event.reason or 'no reason given'})",
            file=out,
        )
        return EXIT_DONE
    print(
        f"NOT CANCELLED ({event.outcome}): job {job_id} is {event.to_status}: {event.reason}",
        file=out,
    )
    return EXIT_NOT_DONE


def _warn_one(out: TextIO, risk: DeliveryRisk) -> None:
    print(
        "\n"
        f"!!! WARNING: {risk.explanation}.\n"
        "!!! The gateway may already have DELIVERED this message.\n"
        "!!! Reprocessing may send it TWICE to the recipient.\n"
        "!!! Check with the gateway or the recipient first.\n",
        file=out,
    )


def _show_history(out: TextIO, plan: Plan) -> None:
    print(job_summary(plan.job), file=out)
    if plan.history:
        print("history:", file=out)
        print(events_table(plan.history), file=out)
    else:
        print("history: no transitions recorded", file=out)


def _note_expired(out: TextIO, job: Job) -> None:
    if job.expires_at is not None and job.expires_at <= dt.datetime.now(dt.UTC):
        print(
            f"note: the job expired at {when(job.expires_at)}; "
            "the worker will expire it again instead of sending it",
            file=out,
        )


def _reprocess_outcome(out: TextIO, job_id: int, answer: Answer) -> int:
    followed = answer.followed
    if not followed:
        return _still_pending(out, answer.command_id)
    print(events_table(followed), file=out)
    event = followed[0]
    if event.outcome != CommandOutcome.REPROCESSED:
        print(f"NOT REPROCESSED ({event.outcome}): job {job_id}: {event.reason}", file=out)
        return EXIT_NOT_DONE
    suffix = " (still in progress)" if answer.in_progress else ""
    print(f"job {job_id} is now {answer.status}{suffix}", file=out)
    return EXIT_DONE


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

    Refused (exit 2) unless the job is DEAD, UNCERTAIN or FAILED, and, when it
    may already have been delivered (:mod:`connectors.ops.delivery_risk`),
    unless ``yes`` confirms that a duplicate is acceptable.
    """
    out = out or sys.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = plan_one(conn, Action.REPROCESS, job_id)
        if plan is None:
            print(f"no job {job_id}", file=out)
            return EXIT_REFUSED
        if plan.refused:
            return _refused(out, plan)
        _show_history(out, plan)
        if plan.risk is not None:
            _warn_one(out, plan.risk)
            if not yes:
                print("not reprocessed: re-run with --yes to reprocess anyway", file=out)
                return EXIT_REFUSED
        _note_expired(out, plan.job)
        answer = _request_and_wait(
            conn,
            plan,
            out,
            shown=f"reprocess requested for job {job_id}",
            reason=reason,
            actor=actor,
            wait_s=wait_s,
            poll_interval_s=poll_interval_s,
        )
    if answer is None:
        return EXIT_REFUSED
    return _reprocess_outcome(out, job_id, answer)


# --- jobs reprocess: every job matching filters ---------------------------------------------


def _bulk_arguments_refused(
    out: TextIO, statuses: Sequence[JobStatus], reason: str, actor: str
) -> bool:
    """Print why a bulk reprocess is refused before connecting; False when it is not."""
    if not statuses:
        print("refusing a bulk reprocess without --state", file=out)
        return True
    if not reason.strip() or not actor.strip():
        print("refusing a bulk reprocess without --reason and --by", file=out)
        return True
    refused = bulk_refused(Action.REPROCESS, statuses)
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
        return True
    return False


def _show_bulk_plan(
    conn: psycopg.Connection[Any], out: TextIO, plan: BulkPlan, *, limit: int
) -> None:
    """The count, a few masked examples, the limit, and the duplicate warning."""
    print(f"{plan.total} jobs match ({_describe(plan.job_filter)})", file=out)
    if plan.total == 0:
        return
    now = database_now(conn)
    examples = fetch_page(conn, plan.job_filter, page=1, page_size=BULK_EXAMPLES)
    print(f"newest {len(examples.jobs)} of them:", file=out)
    print(jobs_table(examples.jobs, now=now), file=out)
    if plan.total > limit:
        print(
            f"only the oldest {limit} would be reprocessed now (--limit); run again for the rest",
            file=out,
        )
    if plan.risky:
        shown = ", ".join(str(job_id) for job_id in plan.risky[:BULK_EXAMPLES])
        more = ", ..." if len(plan.risky) > BULK_EXAMPLES else ""
        print(
            "\n"
            f"!!! WARNING: {len(plan.risky)} of these jobs (UNCERTAIN, or with an attempt of "
            f"unknown outcome) may already have been DELIVERED by the gateway: {shown}{more}.\n"
            "!!! Reprocessing them may send those messages TWICE.\n",
            file=out,
        )


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
    for more than :data:`BULK_CONFIRM_ABOVE` jobs or for any that may already
    have been delivered. A dry run prints the count and a few masked examples
    and writes nothing.
    """
    out = out or sys.stdout
    statuses = sorted({JobStatus(s.strip().upper()) for s in states})
    if _bulk_arguments_refused(out, statuses, reason, actor):
        return EXIT_REFUSED
    if limit < 1:
        raise ValueError("limit must be positive")
    job_filter = JobFilter([s.value for s in statuses], instance, since, until)
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = plan_many(conn, Action.REPROCESS, job_filter, limit=limit)
        _show_bulk_plan(conn, out, plan, limit=limit)
        if plan.total == 0:
            print("nothing to reprocess", file=out)
            return EXIT_DONE
        if dry_run:
            print(
                f"dry run: {len(plan.chosen)} jobs would be reprocessed; nothing was requested",
                file=out,
            )
            return EXIT_DONE
        if not yes and plan.needs_confirmation:
            why = "some may be sent twice" if plan.risky else f"more than {BULK_CONFIRM_ABOVE} jobs"
            print(
                f"not reprocessed: {len(plan.chosen)} jobs, {why}; "
                "re-run with --yes to reprocess them",
                file=out,
            )
            return EXIT_REFUSED
        try:
            command_ids = request_many(conn, plan, reason=reason, actor=actor)
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


# --- jobs reschedule ----------------------------------------------------------------------


def reschedule_job(
    dsn: str, job_id: int, send_at: dt.datetime, *, out: TextIO | None = None
) -> int:
    """Move SCHEDULED job ``job_id`` to ``send_at``; 0 done, 2 refused (with the reason)."""
    out = out or sys.stdout
    with psycopg.connect(dsn) as conn, conn.transaction():
        try:
            moved = reschedule(conn, job_id, send_at)
        except NotRescheduled as exc:
            print(f"not rescheduled: {exc}", file=out)
            return EXIT_REFUSED
    print(f"job {job_id} rescheduled: due {when(moved)}", file=out)
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


def _cmd_reschedule(args: argparse.Namespace) -> int:
    send_at: dt.datetime = args.at
    if args.within is not None:
        send_at = dt.datetime.now(dt.UTC) + args.within
    return reschedule_job(_dsn(), args.job_id, send_at)


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
    """Register ``jobs list|show|cancel|reschedule|reprocess``; each sets ``func(args) -> exit
    code``."""
    jobs = subparsers.add_parser("jobs", help="list, show, cancel, reschedule and reprocess jobs")
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
        help="only jobs created in the last DURATION (90s, 15m, 1h30m, 1.5h, 2d, 1w)",
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

    moved = jobs_sub.add_parser(
        "reschedule", help="move a SCHEDULED job (not released yet) to another time"
    )
    moved.add_argument("job_id", metavar="ID", type=_arg(_positive_int), help="the job's id")
    due = moved.add_mutually_exclusive_group(required=True)
    due.add_argument(
        "--at",
        type=_arg(parse_instant),
        metavar="ISO",
        help="the new time (UTC unless an offset is given)",
    )
    due.add_argument(
        "--in",
        dest="within",
        type=_arg(parse_duration),
        metavar="DURATION",
        help="the new time, from now (90s, 15m, 1h30m, 2d)",
    )
    moved.set_defaults(func=_cmd_reschedule)

    reprocess = jobs_sub.add_parser(
        "reprocess",
        help="send a DEAD, UNCERTAIN or FAILED job again, or every job matching filters",
    )
    _add_command_options(reprocess, optional_id=True)
    reprocess.add_argument(
        "--yes",
        action="store_true",
        help="reprocess even if the job may already have been delivered (may send twice), "
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
        help="only jobs created in the last DURATION (2h, 1.5d) or since this time",
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
