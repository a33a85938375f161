"""The console's overview page: the whole pipeline at a glance, the first page an operator sees.

Four sections, each linking to the page with the details:

- jobs by state: every status with its count (0 included, so a newcomer learns the
  states), the ones waiting for an operator (DEAD, UNCERTAIN, REVIEW) marked; each
  links to ``/jobs?state=...``;
- oldest waiting per instance: jobs not settled yet (PENDING, RETRY_WAIT, ATTEMPTING)
  per instance and the age of the oldest, the longest-waiting first, paused ones marked;
- paused instances and campaigns, with who paused them, when and why;
- lag at a glance: the consumer groups' lag summed over their partitions (from the
  lag monitor, like ``/lag``) and the replication slots' lag.

Rendering only, like :mod:`connectors.console.pages` (whose layout and escaping it
uses); the data comes from :mod:`connectors.console.overview_sql`,
:func:`connectors.ops.status.read_consumer_lag` and
:func:`connectors.console.queries.slot_lags`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence
from urllib.parse import urlencode

from connectors.console.overview_sql import Overview
from connectors.console.pages import _layout, _status, e, lag_notice
from connectors.console.queries import SlotLag
from connectors.console.settings import Operator
from connectors.ops.jobs_render import human_age, when
from connectors.ops.status import ATTENTION_STATES, ConsumerLag, PartitionLag

__all__ = ["GroupLag", "MEANINGS", "group_lags", "overview_page"]

MEANINGS: dict[str, str] = {
    "PENDING": "captured, not attempted yet (or held by a pause)",
    "SCHEDULED": "due later (send_at, or quiet hours): waits in PostgreSQL until then",
    "ATTEMPTING": "being sent to the gateway",
    "ACCEPTED": "the gateway took it",
    "DELIVERED": "the phone received it",
    "READ": "the recipient read it",
    "RETRY_WAIT": "a transient failure; the next attempt is scheduled",
    "FAILED": "refused for good (e.g. invalid recipient); reprocess after a fix",
    "DEAD": "gave up after its last attempt; reprocess after a fix",
    "EXPIRED": "its expiry passed before it could be sent",
    "CANCELLED": "cancelled before it was sent",
    "UNCERTAIN": "the gateway may have it; a resend may duplicate it",
    "REVIEW": "needs an operator's decision",
    "INVALID": "the outbox row was malformed; never sent",
    "OPTED_OUT": "the recipient opted out (bulk, or marked respect_opt_out); never sent",
}
"""One line per status, for operators meeting it for the first time."""


@dataclasses.dataclass(frozen=True, slots=True)
class GroupLag:
    """One consumer group's lag on one topic, summed over its partitions."""

    group: str
    topic: str
    partitions: int
    messages: float
    seconds: float | None
    """The largest lag in seconds of its partitions; None when the monitor exports none."""


def group_lags(partitions: Iterable[PartitionLag]) -> list[GroupLag]:
    """Sum the lag monitor's per-partition figures per (group, topic), in name order."""
    found: dict[tuple[str, str], list[PartitionLag]] = {}
    for lag in partitions:
        found.setdefault((lag.group, lag.topic), []).append(lag)
    rows = []
    for (group, topic), lags in sorted(found.items()):
        seconds = [p.seconds for p in lags if p.seconds is not None]
        rows.append(
            GroupLag(
                group=group,
                topic=topic,
                partitions=len(lags),
                messages=sum(p.messages or 0 for p in lags),
                seconds=max(seconds) if seconds else None,
            )
        )
    return rows


def _link(path: str, **query: str) -> str:
    return f"{path}?{urlencode(query)}"


def _meaning(status: str, count: int) -> str:
    urgent = "<strong>needs an operator</strong>: " if status in ATTENTION_STATES and count else ""
    return urgent + e(MEANINGS.get(status, ""))


def _states(overview: Overview) -> str:
    rows = "".join(
        f'<tr class="state" data-status="{e(status)}">'
        f'<td><a href="{e(_link("/jobs", state=status))}">{_status(status)}</a></td>'
        f'<td class="count">{count}</td><td>{_meaning(status, count)}</td></tr>'
        for status, count in overview.jobs.items()
    )
    return (
        f"<p>{overview.total} jobs in the outbox.</p>"
        '<table id="states"><thead><tr><th>State</th><th>Jobs</th><th>Meaning</th></tr>'
        f"</thead><tbody>{rows}</tbody></table>"
    )


def _waiting(overview: Overview, *, limit: int) -> str:
    if not overview.waiting:
        return '<p id="no-waiting">Nothing waiting: every job is settled.</p>'
    paused = overview.paused_instances()
    rows = "".join(
        f'<tr class="waiting" data-instance="{e(w.instance_id)}">'
        f'<td><a href="{e(_link("/jobs", instance=w.instance_id))}">{e(w.instance_id)}</a>'
        f"{' <strong class=paused-mark>paused</strong>' if w.instance_id in paused else ''}</td>"
        f'<td class="count">{w.waiting}</td>'
        f'<td class="oldest" data-age-s="{w.oldest_age_s:.0f}">'
        f"{e(human_age(dt.timedelta(seconds=w.oldest_age_s)))}</td></tr>"
        for w in overview.waiting[:limit]
    )
    more = len(overview.waiting) - limit
    rest = f"<p>and {more} more instance(s) with younger jobs.</p>" if more > 0 else ""
    return (
        '<table id="waiting"><thead><tr><th>Instance</th><th>Waiting jobs</th>'
        "<th>Oldest waiting</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{rest}"
    )


def _paused(overview: Overview) -> str:
    if not overview.paused:
        return '<p id="no-paused">No instance or campaign is paused.</p>'
    waiting = {w.instance_id: w.waiting for w in overview.waiting}
    rows = "".join(
        f'<tr class="paused" data-target="{e(c.target)}"><td>{e(c.kind)}</td>'
        f"<td>{e(c.target)}</td><td>{e(when(c.at))}</td><td>{e(c.actor)}</td>"
        f"<td>{e(c.reason)}</td>"
        f"<td>{waiting.get(c.target, 0) if c.kind == 'instance' else '-'}</td></tr>"
        for c in overview.paused
    )
    return (
        '<table id="paused"><thead><tr><th>Kind</th><th>Target</th><th>Since (UTC)</th>'
        "<th>By</th><th>Why</th><th>Waiting jobs</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _optouts(overview: Overview) -> str:
    jobs = overview.jobs.get("OPTED_OUT", 0)
    link = e(_link("/jobs", state="OPTED_OUT"))
    return (
        f'<p id="optouts"><span class="count">{overview.optouts}</span> recipient(s) opted out '
        f'(<code>zapstream optouts list</code>); <a href="{link}">{jobs} job(s) not sent</a> '
        "because of it.</p>"
    )


def _lag(consumer: ConsumerLag, slots: Sequence[SlotLag]) -> str:
    kafka = lag_notice(consumer)
    if kafka is None:
        rows = "".join(
            f'<tr class="group-lag"><td>{e(g.group)}</td><td>{e(g.topic)}</td>'
            f'<td>{g.partitions}</td><td class="messages">{g.messages:g}</td>'
            f"<td>{'-' if g.seconds is None else f'{g.seconds:.1f}'}</td></tr>"
            for g in group_lags(consumer.partitions)
        )
        kafka = (
            '<table id="lag-glance"><thead><tr><th>Consumer group</th><th>Topic</th>'
            "<th>Partitions</th><th>Records behind</th><th>Seconds behind (max)</th></tr>"
            f"</thead><tbody>{rows}</tbody></table>"
        )
    slot_rows = "".join(
        f"<tr><td>{e(s.slot)}</td><td>{'yes' if s.active else 'no'}</td>"
        f"<td>{e(s.lag_bytes)}</td></tr>"
        for s in slots
    )
    slot_table = (
        '<table id="slot-glance"><thead><tr><th>Replication slot</th><th>Active</th>'
        f"<th>Lag (bytes)</th></tr></thead><tbody>{slot_rows}</tbody></table>"
        if slot_rows
        else "<p>No logical replication slot in this database.</p>"
    )
    return f'{kafka}{slot_table}<p><a href="/lag">Lag per partition</a></p>'


def overview_page(
    overview: Overview,
    *,
    consumer: ConsumerLag,
    slots: Sequence[SlotLag],
    operator: Operator,
    waiting_limit: int = 20,
) -> str:
    """The overview: jobs by state, oldest waiting per instance, pauses, lag."""
    body = (
        f"<p>As of {e(when(overview.at))} (the database's clock).</p>"
        f'<section id="overview-states"><h2>Jobs by state</h2>{_states(overview)}</section>'
        '<section id="overview-waiting"><h2>Oldest waiting per instance</h2>'
        f"{_waiting(overview, limit=waiting_limit)}</section>"
        '<section id="overview-paused"><h2>Paused instances and campaigns</h2>'
        f"{_paused(overview)}</section>"
        f'<section id="overview-optouts"><h2>Opt-outs</h2>{_optouts(overview)}</section>'
        f'<section id="overview-lag"><h2>Lag at a glance</h2>{_lag(consumer, slots)}</section>'
    )
    return _layout("Overview", body, operator)
