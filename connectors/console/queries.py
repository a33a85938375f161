"""The console's own SQL: a message's text (admins) and the replication slots' lag.

Sync psycopg on a connection the caller opens (the web handlers run these in a
thread). Jobs are read like ``zapstream jobs`` reads them: the filter is
:class:`connectors.ops.job_filter.JobFilter`, a page and a job's story come from
:mod:`connectors.ops.jobs_sql`, and actions go through :mod:`connectors.ops.actions`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

__all__ = ["SlotLag", "fetch_text", "slot_lags"]


def fetch_text(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    """The message's text (admins only: the caller checks the role before asking)."""
    row = conn.execute("SELECT payload ->> 'text' FROM outbox_jobs WHERE id = %s", (job_id,))
    found = row.fetchone()
    return None if found is None else found[0]


@dataclasses.dataclass(frozen=True, slots=True)
class SlotLag:
    """A logical replication slot and the WAL it holds back, in bytes."""

    slot: str
    active: bool
    lag_bytes: int | None


# The same measure as `zapstream doctor`'s slot check (connectors/ops/doctor.py), for
# every logical slot of the database rather than the relay's one.
_SLOT_LAGS = """
    SELECT slot_name, active,
           pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
    FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database()
    ORDER BY slot_name
"""


def slot_lags(conn: psycopg.Connection[Any]) -> list[SlotLag]:
    """Every logical slot of this database with its lag in bytes."""
    return [
        SlotLag(str(name), bool(active), None if lag is None else int(lag))
        for name, active, lag in conn.execute(_SLOT_LAGS)
    ]
