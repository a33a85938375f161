"""The overview page's reading of PostgreSQL: jobs by state, what waits per instance, pauses.

One async connection, three reads, each the one another tool already trusts, so the
overview and ``zapstream status`` never disagree:

- jobs per status: :func:`connectors.sink.pipeline_sql.job_counts` (the sink's
  ``zapstream_jobs`` gauge and ``status``'s numbers; every status, 0 included);
- what waits: ``zapstream_backlog()`` through
  :func:`connectors.outbox.controls.backlog_async` (PENDING, RETRY_WAIT and ATTEMPTING,
  per instance, purpose and priority), folded here into one line per instance;
- paused instances and campaigns: the ``zapstream_controls`` view, the latest action
  per target;
- how many recipients are opted out now: the ``zapstream_optouts`` view's count.

Only instance ids, counts, ages and the operators' own reasons leave here: never a
recipient, a text or an idempotency key.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

import psycopg

from connectors.outbox.controls import Backlog, Control, backlog_async
from connectors.sink.pipeline_sql import job_counts

__all__ = [
    "InstanceWaiting",
    "Overview",
    "fetch_overview",
    "read_overview",
    "waiting_per_instance",
]

_PAUSED = """
    SELECT kind, target, action, reason, actor, at, control_id
    FROM zapstream_controls WHERE paused ORDER BY kind, target
"""

_OPTOUTS = "SELECT count(*) FROM zapstream_optouts"


@dataclasses.dataclass(frozen=True, slots=True)
class InstanceWaiting:
    """The jobs of one instance not settled yet, and how long the oldest has waited."""

    instance_id: str
    waiting: int
    oldest_age_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class Overview:
    """What the overview page shows from PostgreSQL, read at ``at`` (the database's clock)."""

    at: dt.datetime
    jobs: dict[str, int]
    """Jobs per status, every status present."""
    waiting: list[InstanceWaiting]
    """Instances with waiting jobs, the longest-waiting first."""
    paused: list[Control]
    optouts: int = 0
    """(Instance, recipient) pairs opted out now (``zapstream_optouts``)."""

    @property
    def total(self) -> int:
        return sum(self.jobs.values())

    def paused_instances(self) -> frozenset[str]:
        return frozenset(c.target for c in self.paused if c.kind == "instance")


def waiting_per_instance(rows: Iterable[Backlog]) -> list[InstanceWaiting]:
    """Fold the backlog's (instance, purpose, priority) lines into one per instance.

    Sorted by the oldest waiting job, oldest first, then by instance id, so the
    instance an operator should look at first is on top.
    """
    counts: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for row in rows:
        counts[row.instance_id] = counts.get(row.instance_id, 0) + row.waiting
        oldest[row.instance_id] = max(oldest.get(row.instance_id, 0.0), row.oldest_waiting_age_s)
    return sorted(
        (InstanceWaiting(i, counts[i], max(0.0, oldest[i])) for i in counts),
        key=lambda w: (-w.oldest_age_s, w.instance_id),
    )


async def fetch_overview(conn: psycopg.AsyncConnection[Any]) -> Overview:
    """Read the overview on ``conn`` (autocommit; the caller opens and closes it)."""
    cur = await conn.execute("SELECT now()")
    row = await cur.fetchone()
    assert row is not None, "SELECT now() returned no row"
    jobs = await job_counts(conn)
    waiting = waiting_per_instance(await backlog_async(conn))
    cur = await conn.execute(_PAUSED)
    paused = [
        Control(str(k), str(t), str(a), str(r), str(by), at, int(cid))
        for k, t, a, r, by, at, cid in await cur.fetchall()
    ]
    cur = await conn.execute(_OPTOUTS)
    counted = await cur.fetchone()
    optouts = int(counted[0]) if counted else 0
    return Overview(at=row[0], jobs=jobs, waiting=waiting, paused=paused, optouts=optouts)


async def read_overview(dsn: str, *, connect_timeout_s: int = 5) -> Overview:
    """Open a connection, read the overview, close it.

    Async, unlike the console's other pages (sync psycopg in a thread): the counts are
    ``zapstream status``'s own async query, reused rather than written a second time.
    An unreachable database raises :class:`psycopg.OperationalError` (the console's
    guard answers 503).
    """
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, connect_timeout=connect_timeout_s
    ) as conn:
        return await fetch_overview(conn)
