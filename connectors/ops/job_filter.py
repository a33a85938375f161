"""Which jobs an operator means: one filter for ``jobs list``, bulk reprocess and the console.

A :class:`JobFilter` renders its own ``WHERE`` clause with parameters (values
never enter the SQL text), so the unit tests check the SQL a filter produces
without a database, and the CLI and the console can never disagree on what a
filter matches.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from psycopg import sql

__all__ = ["NO_STATUS", "JobFilter"]

NO_STATUS = "-none-"
"""A status no job has: a filter narrowed to no allowed status matches nothing."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobFilter:
    """The jobs an operator means; every field optional, an empty filter matches every job.

    ``statuses`` are status values (``"DEAD"``); ``since``/``until`` bound the
    jobs' creation time, ``since`` inclusive; ``search`` is a job id (digits) or
    an exact idempotency key.
    """

    statuses: Sequence[str] = ()
    instance: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    priority: str | None = None
    purpose: str | None = None
    search: str | None = None

    def where(self) -> tuple[sql.Composable, list[Any]]:
        """`` WHERE ...`` (or nothing) and its parameters, in order."""
        conditions: list[sql.Composable] = []
        params: list[Any] = []
        if self.statuses:
            conditions.append(sql.SQL("status = ANY(%s)"))
            params.append(list(self.statuses))
        for column, value in (
            ("instance_id", self.instance),
            ("priority", self.priority),
            ("purpose", self.purpose),
        ):
            if value is not None:
                conditions.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
                params.append(value)
        if self.since is not None:
            conditions.append(sql.SQL("created_at >= %s"))
            params.append(self.since)
        if self.until is not None:
            conditions.append(sql.SQL("created_at < %s"))
            params.append(self.until)
        if self.search is not None:
            conditions.append(self._search(params))
        if not conditions:
            return sql.SQL(""), params
        return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions), params

    def _search(self, params: list[Any]) -> sql.Composable:
        term = (self.search or "").strip()
        if term.isdigit() and len(term) < 19:
            # A number may be a job id or a key made of digits (19 digits overflow a bigint).
            params.extend([int(term), term])
            return sql.SQL("(id = %s OR idempotency_key = %s)")
        params.append(term)
        return sql.SQL("idempotency_key = %s")

    def with_statuses(self, allowed: frozenset[str]) -> JobFilter:
        """The same filter narrowed to ``allowed`` statuses (for a bulk action)."""
        chosen = [s for s in self.statuses if s in allowed] if self.statuses else sorted(allowed)
        return dataclasses.replace(self, statuses=chosen or [NO_STATUS])
