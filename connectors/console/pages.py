"""The console's HTML: small functions from rows to escaped markup, no template engine.

Everything the page shows goes through :func:`html.escape`; recipients only
ever leave here masked (:func:`connectors.ops.jobs_render.masked`), and a
message's text is rendered only when the caller passes it (admins). A gateway's
error message reaches non-admins only as its summary
(:func:`connectors.console.error_summary.error_summary`): it may echo a text. No
script, no external stylesheet or font: the process serves every byte of the page.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlencode

from connectors.console.error_summary import error_summary
from connectors.console.queries import SlotLag
from connectors.console.settings import Operator
from connectors.ops.actions import Action, offered
from connectors.ops.delivery_risk import DeliveryRisk, delivery_risk
from connectors.ops.jobs_render import cut, human_age, masked, when
from connectors.ops.jobs_sql import JobHistory, PageOfJobs
from connectors.ops.status import ConsumerLag, PartitionLag
from connectors.outbox.schedule import RELEASE_ACTOR
from streams.kernel.contract import JobStatus

__all__ = [
    "PERIODS",
    "bulk_preview_page",
    "duplicate_warning",
    "jobs_page",
    "job_page",
    "lag_page",
    "login_page",
    "message_page",
]

PERIODS = ("", "15m", "1h", "24h", "7d", "30d")
"""The periods the list offers (created in the last ...); empty is any time."""

_STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:.6em 1em;display:flex;gap:1.5em;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}header .who{margin-left:auto}
main{padding:1em}table{border-collapse:collapse;width:100%;background:#fff}
th,td{border:1px solid #d0d7de;padding:.3em .5em;text-align:left;font-size:.9em}
th{background:#eaeef2}form.filters{display:flex;flex-wrap:wrap;gap:.6em;margin-bottom:1em}
label{font-size:.85em}.notice{background:#ddf4ff;border:1px solid #54aeff;padding:.5em}
.warning{background:#fff8c5;border:2px solid #bf8700;padding:.6em;font-weight:600}
.error{background:#ffebe9;border:1px solid #ff8182;padding:.5em}
.st{font-weight:600;padding:0 .3em;border-radius:3px}
.st-ACCEPTED,.st-DELIVERED,.st-READ{background:#dafbe1}.st-FAILED,.st-DEAD,.st-INVALID{background:#ffebe9}
.st-PENDING,.st-SCHEDULED,.st-ATTEMPTING,.st-RETRY_WAIT{background:#ddf4ff}.st-CANCELLED,.st-EXPIRED,.st-OPTED_OUT{background:#eaeef2}
.st-UNCERTAIN,.st-REVIEW{background:#fff8c5}section{margin:1.2em 0}
.pager a{margin-right:.8em}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dt{font-weight:600}
.actions form{margin:.5em 0;padding:.5em;background:#fff;border:1px solid #d0d7de}
"""


def e(value: object) -> str:
    """Escaped text; None is ``-``."""
    return "-" if value is None else html.escape(str(value), quote=True)


def _layout(title: str, body: str, operator: Operator | None, notice: str | None = None) -> str:
    nav = ""
    if operator is not None:
        nav = (
            '<a href="/overview">Overview</a><a href="/jobs">Jobs</a><a href="/lag">Lag</a>'
            f'<span class="who">{e(operator.name)} ({e(operator.role.value)})</span>'
            '<form method="post" action="/logout"><button>Log out</button></form>'
        )
    shown = f'<p class="notice" id="notice">{e(notice)}</p>' if notice else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)} - zapstream console</title><style>{_STYLE}</style></head>"
        f"<body><header><strong>zapstream console</strong>{nav}</header>"
        f"<main><h1>{e(title)}</h1>{shown}{body}</main></body></html>"
    )


def _error(text: str | None, operator: Operator) -> str | None:
    """An error or a reason as ``operator`` may see it: whole for admins, else summarised."""
    return text if operator.role.sees_text else error_summary(text)


def _status(value: str) -> str:
    return f'<span class="st st-{e(value)}">{e(value)}</span>'


def _hidden(fields: Mapping[str, str]) -> str:
    return "".join(
        f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in fields.items() if v
    )


def login_page(*, failed: bool, why: str | None = None) -> str:
    """The token form; ``failed`` says the last token was not accepted, ``why`` says why
    the operator is here (a session that ended, logins throttled)."""
    if why is not None:
        why = f'<p class="error" id="login-why">{e(why)}</p>'
    elif failed:
        why = '<p class="error">Unknown token.</p>'
    else:
        why = "<p>Log in with your token.</p>"
    body = (
        f'{why}<form method="post" action="/login">'
        '<label>Token <input type="password" name="token" id="token" autocomplete="off" '
        'required></label> <button id="login">Log in</button></form>'
    )
    return _layout("Log in", body, None)


def message_page(title: str, text: str, operator: Operator | None, back: str = "/jobs") -> str:
    """A short page saying why something was refused or failed."""
    return _layout(
        title, f'<p class="error">{e(text)}</p><p><a href="{e(back)}">Back</a></p>', operator
    )


def _filter_form(form: Mapping[str, str]) -> str:
    states = "".join(
        f'<option value="{s.value}"{" selected" if form.get("state") == s.value else ""}>'
        f"{s.value}</option>"
        for s in JobStatus
    )
    periods = "".join(
        f'<option value="{p}"{" selected" if form.get("period", "") == p else ""}>'
        f"{'any time' if not p else 'last ' + p}</option>"
        for p in PERIODS
    )

    def text(name: str, label: str) -> str:
        return (
            f'<label>{label} <input name="{name}" id="f-{name}" '
            f'value="{e(form.get(name, ""))}" size="12"></label>'
        )

    return (
        '<form class="filters" method="get" action="/jobs" id="filters">'
        f'<label>State <select name="state" id="f-state"><option value="">any</option>'
        f"{states}</select></label>"
        f"{text('instance', 'Instance')}{text('priority', 'Priority')}"
        f"{text('purpose', 'Purpose')}"
        f'<label>Created <select name="period" id="f-period">{periods}</select></label>'
        f"{text('q', 'Job id or idempotency key')}"
        '<button id="apply">Filter</button> <a href="/jobs">clear</a></form>'
    )


def _pager(page: PageOfJobs, form: Mapping[str, str]) -> str:
    def link(number: int, label: str) -> str:
        query = urlencode({**{k: v for k, v in form.items() if v}, "page": str(number)})
        return f'<a href="/jobs?{e(query)}">{label}</a>'

    parts = []
    if page.page > 1:
        parts.append(link(page.page - 1, "&larr; newer"))
    parts.append(f"page {page.page} of {page.pages}, {page.total} jobs")
    if page.page < page.pages:
        parts.append(link(page.page + 1, "older &rarr;"))
    return f'<p class="pager">{" ".join(parts)}</p>'


def jobs_page(
    page: PageOfJobs,
    form: Mapping[str, str],
    operator: Operator,
    *,
    now: dt.datetime,
    notice: str | None = None,
) -> str:
    """The jobs list: filters, one page of jobs (recipients masked), and the bulk actions."""
    rows = "".join(
        f'<tr class="job" data-status="{e(job.status)}">'
        f'<td><a href="/jobs/{job.id}" class="job-link">{job.id}</a></td>'
        f'<td>{e(job.instance_id)}</td><td class="recipient">{e(masked(job.recipient))}</td>'
        f"<td>{_status(job.status)}</td><td>{job.attempts}</td>"
        f"<td>{e(human_age(now - job.created_at))}</td>"
        f"<td>{e(cut(_error(job.last_error, operator), 60))}</td>"
        f"<td>{e(when(job.updated_at))}</td></tr>"
        for job in page.jobs
    )
    table = (
        '<table id="jobs"><thead><tr><th>ID</th><th>Instance</th><th>Recipient</th>'
        "<th>Status</th><th>Attempts</th><th>Age</th><th>Last error</th>"
        f"<th>Updated (UTC)</th></tr></thead><tbody>{rows}</tbody></table>"
        if page.jobs
        else '<p id="no-jobs">No jobs match.</p>'
    )
    bulk = ""
    if operator.role.can_act and page.total:
        bulk = (
            '<section class="actions"><h2>Act on every job matching this filter</h2>'
            '<form method="post" action="/jobs/bulk" id="bulk">'
            f"{_hidden(form)}"
            '<label>Action <select name="action"><option value="cancel">cancel (PENDING, '
            'RETRY_WAIT)</option><option value="reprocess">reprocess (DEAD, FAILED, '
            "UNCERTAIN)</option></select></label> "
            '<label>Reason <input name="reason" required size="40"></label> '
            "<button>Preview</button></form></section>"
        )
    body = _filter_form(form) + _pager(page, form) + table + bulk
    return _layout("Jobs", body, operator, notice)


def _events(story: JobHistory, operator: Operator) -> str:
    if not story.events:
        return "<p>No transitions recorded yet.</p>"
    rows = "".join(
        f"<tr><td>v{ev.version}</td><td>{e(ev.from_status)} &rarr; {_status(ev.to_status)}</td>"
        f"<td>{e(ev.outcome)}</td><td>{e(ev.actor)}</td><td>{e(_error(ev.reason, operator))}</td>"
        f"<td>{e(ev.command_id)}</td><td>{e(when(ev.at))}</td></tr>"
        for ev in story.events
    )
    return (
        '<table id="events"><thead><tr><th>Version</th><th>Transition</th><th>Outcome</th>'
        "<th>Actor</th><th>Reason / error</th><th>Command</th><th>At (UTC)</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _attempts(story: JobHistory, operator: Operator) -> str:
    attempts = story.attempts
    if not attempts:
        return "<p>No attempt yet.</p>"
    rows = "".join(
        f"<tr><td>{e(a.reference(story.job.id))}</td><td>{e(when(a.started_at))}</td>"
        f"<td>{_status(a.outcome) if a.outcome else 'in progress'}</td>"
        f"<td>{e(_error(a.reason, operator))}</td>"
        f"<td>{e(when(a.ended_at))}</td></tr>"
        for a in attempts
    )
    return (
        '<table id="attempts"><thead><tr><th>Attempt</th><th>Started (UTC)</th><th>Outcome</th>'
        f"<th>Reason / error</th><th>Ended (UTC)</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _replay_kind(actor: str) -> str:
    """A scheduled job's release or an operator's restream (both are ``outbox_replays``)."""
    return "release" if actor == RELEASE_ACTOR else "restream"


def _commands(story: JobHistory) -> str:
    asked = [(c.id, c.command, c.actor, c.reason, c.created_at) for c in story.commands]
    asked += [(r.id, _replay_kind(r.actor), r.actor, r.reason, r.created_at) for r in story.replays]
    if not asked:
        return "<p>No operator actions.</p>"
    rows = "".join(
        f"<tr><td>{i}</td><td>{e(what)}</td><td>{e(actor)}</td>"
        f"<td>{e(reason)}</td><td>{e(when(at))}</td></tr>"
        for i, what, actor, reason, at in sorted(asked, key=lambda c: c[4])
    )
    return (
        '<table id="commands"><thead><tr><th>Id</th><th>Action</th><th>By</th><th>Why</th>'
        f"<th>At (UTC)</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def duplicate_warning(risk: DeliveryRisk) -> str:
    """Why a reprocess of this job may send it twice, for the page and a refusal."""
    because = risk.explanation[0].upper() + risk.explanation[1:]
    return (
        f"{because}: the gateway may already have delivered it. "
        "Reprocessing may send it TWICE to the recipient."
    )


def _actions(story: JobHistory, operator: Operator) -> str:
    """The cancel, reschedule and reprocess forms the job's status allows, for an operator
    who may act."""
    status = story.job.status
    cancellable = offered(Action.CANCEL, status)
    reprocessable = offered(Action.REPROCESS, status)
    if not operator.role.can_act or not (
        cancellable or reprocessable or status == JobStatus.SCHEDULED
    ):
        return ""
    job_id = story.job.id
    actions = '<section class="actions"><h2>Actions</h2>'
    if cancellable:
        actions += (
            f'<form method="post" action="/jobs/{job_id}/cancel" id="cancel">'
            '<label>Reason <input name="reason" id="cancel-reason" required size="40">'
            '</label> <button id="cancel-button">Cancel job</button></form>'
        )
    if status == JobStatus.SCHEDULED:
        due = job_due.isoformat(timespec="seconds") if (job_due := story.job.next_retry_at) else ""
        actions += (
            f'<form method="post" action="/jobs/{job_id}/reschedule" id="reschedule">'
            '<label>Send at <input name="send_at" id="reschedule-at" required size="28" '
            f'value="{e(due)}"></label> <small>ISO 8601; UTC unless an offset is given</small> '
            '<button id="reschedule-button">Reschedule</button></form>'
        )
    if reprocessable:
        risk = delivery_risk(status, story.events)
        warning = (
            f'<p class="warning" id="uncertain-warning">{e(duplicate_warning(risk))}</p>'
            '<label><input type="checkbox" name="accept_duplicate" value="yes" required> '
            "I accept that it may be sent twice</label><br>"
            if risk is not None
            else ""
        )
        actions += (
            f'<form method="post" action="/jobs/{job_id}/reprocess" id="reprocess">'
            f"{warning}"
            '<label>Reason <input name="reason" required size="40"></label> '
            "<button>Reprocess (send again)</button></form>"
        )
    return actions + "</section>"


def job_page(
    story: JobHistory, operator: Operator, *, text: str | None, notice: str | None = None
) -> str:
    """One job: its columns, its text (admins), its events and the actions asked for it."""
    job = story.job
    facts: Sequence[tuple[str, str]] = [
        ("Status", _status(job.status)),
        ("Instance", e(job.instance_id)),
        ("Recipient", e(masked(job.recipient))),
        ("Priority", e(job.priority)),
        ("Purpose", e(job.purpose)),
        ("Attempts", f"{job.attempts} of {job.max_attempts}"),
        ("Created", e(when(job.created_at))),
        ("Updated", e(when(job.updated_at))),
        ("Sent", e(when(job.sent_at))),
        ("Expires", e(when(job.expires_at))),
        *([("Due", e(when(job.next_retry_at)))] if job.status == JobStatus.SCHEDULED else []),
        ("Gateway job", e(job.gateway_job_id)),
        ("Last error", e(_error(job.last_error, operator))),
    ]
    for kind, target, actor, reason, since in story.paused_by:
        held = f"{kind} {target} paused by {actor} since {when(since)}: {reason}"
        facts = [*facts, ("Held", e(held))]
    if operator.role.sees_text:
        facts = [*facts, ("Text", f'<span id="text">{e(text)}</span>')]
    details = "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    actions = _actions(story, operator)
    body = (
        f"{details}{actions}<section><h2>Attempts</h2>{_attempts(story, operator)}</section>"
        f"<section><h2>History</h2>{_events(story, operator)}</section>"
        f"<section><h2>Operator actions</h2>{_commands(story)}</section>"
    )
    return _layout(f"Job {job.id}", body, operator, notice)


def bulk_preview_page(
    *,
    action: str,
    count: int,
    risky: int,
    limit: int,
    fields: Mapping[str, str],
    operator: Operator,
    refused: str | None = None,
) -> str:
    """What a bulk action would do, and the button that does it.

    When some jobs may be sent twice, the button needs the same box ticked as a single
    job's reprocess; ``refused`` says why the last confirmation did nothing.
    """
    acted = min(count, limit)
    lines = [f"{count} matching job(s) can be asked to {action}."]
    if count > limit:
        lines.append(f"Only the oldest {limit} will be, this time.")
    warning = accept = ""
    if risky:
        warning = (
            f'<p class="warning" id="uncertain-warning">{risky} of them may already have been '
            "delivered (UNCERTAIN, or an attempt of unknown outcome): reprocessing may send "
            "them TWICE.</p>"
        )
        accept = (
            '<label><input type="checkbox" name="accept_duplicate" value="yes" '
            'id="accept-duplicate" required> I accept that some may be sent twice</label><br>'
        )
    confirm = ""
    if acted:
        confirm = (
            f'<form method="post" action="/jobs/bulk" id="bulk-confirm">{_hidden(fields)}'
            f'<input type="hidden" name="confirm" value="yes">{accept}'
            f"<button>{e(action.capitalize())} {acted} job(s)</button></form>"
        )
    body = (
        "".join(f'<p id="preview">{e(line)}</p>' for line in lines[:1])
        + "".join(f"<p>{e(line)}</p>" for line in lines[1:])
        + f"<p>Reason: {e(fields.get('reason'))}</p>{warning}{confirm}"
        + '<p><a href="/jobs">Back to the jobs</a></p>'
    )
    return _layout(f"Bulk {action}", body, operator, refused)


def _lag_chart(lags: Sequence[PartitionLag]) -> str:
    """Horizontal bars, one per group/topic/partition, as inline SVG."""
    bar_h, label_w, width = 18, 340, 360
    top = max((lag.messages or 0 for lag in lags), default=0) or 1
    height = bar_h * len(lags) + 4
    bars = []
    for i, lag in enumerate(lags):
        y = i * bar_h + 2
        records = lag.messages or 0
        w = max(1.0, width * records / top) if records else 0
        label = f"{lag.group} {lag.topic}[{lag.partition or '*'}]"
        bars.append(
            f'<text x="0" y="{y + 13}" font-size="12">{e(label)}</text>'
            f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{bar_h - 5}" '
            'fill="#0969da"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + 13}" font-size="12">{records:g}</text>'
        )
    return (
        f'<svg id="lag-chart" xmlns="http://www.w3.org/2000/svg" width="{label_w + width + 80}" '
        f'height="{height}" role="img" aria-label="consumer lag per partition">'
        f"{''.join(bars)}</svg>"
    )


def lag_notice(consumer: ConsumerLag) -> str | None:
    """Why there is no consumer lag to show (not configured, unreadable), or None."""
    if not consumer.configured:
        return (
            '<p id="lag-not-configured">Consumer lag: not configured (set '
            "ZAPSTREAM_CONSOLE_LAG_URL to the lag monitor's metrics URL).</p>"
        )
    if consumer.error is not None:
        return f'<p class="error" id="lag-error">Consumer lag unavailable: {e(consumer.error)}</p>'
    return None


def lag_page(*, consumer: ConsumerLag, slots: Iterable[SlotLag], operator: Operator) -> str:
    """Consumer lag per partition (from the lag monitor) and the replication slots' lag."""
    kafka = lag_notice(consumer) or _lag_chart(consumer.partitions)
    rows = "".join(
        f"<tr><td>{e(s.slot)}</td><td>{'yes' if s.active else 'no'}</td>"
        f"<td>{e(s.lag_bytes)}</td></tr>"
        for s in slots
    )
    slot_table = (
        '<table id="slots"><thead><tr><th>Slot</th><th>Active</th><th>Lag (bytes)</th></tr>'
        f"</thead><tbody>{rows}</tbody></table>"
        if rows
        else "<p>No logical replication slot in this database.</p>"
    )
    body = (
        f"<section><h2>Consumer lag (records, per partition)</h2>{kafka}</section>"
        f"<section><h2>Replication slots</h2>{slot_table}</section>"
    )
    return _layout("Lag", body, operator)
