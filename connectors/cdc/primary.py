"""The relay works on the primary only: a standby is waited out, never streamed from.

On a standby the relay could neither create its publication, nor keep its slot's record
(``outbox_relay_slots``), nor write its heartbeat; and since PostgreSQL 16 it could even
create and stream a slot there, one the primary never hears of. So provisioning and the
gap check, which run before every replication session, first ask ``pg_is_in_recovery()``
and raise :class:`StandbyServer`: transient (logged once per outage, retried with
backoff), since a promotion ends it, with a line naming ``target_session_attrs``.
"""

from __future__ import annotations

from typing import Any

import psycopg


class StandbyServer(psycopg.OperationalError):
    """The DSN reached a standby (in recovery): the relay waits for a primary (transient).

    After a failover a multi-host DSN without ``target_session_attrs=read-write`` may reach
    the old primary's standby, or a single host may still be recovering; a promotion ends it.
    """


STANDBY_HINT = (
    "is a standby (in recovery), where the relay can neither keep its slot nor its record: "
    "waiting for it to be promoted; list every node in ZAPSTREAM_DATABASE_URL with "
    "target_session_attrs=read-write so the relay follows the primary"
)


def refuse_standby(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`StandbyServer` if ``conn`` reached a server in recovery."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    if row is not None and row[0]:
        info = conn.info
        raise StandbyServer(f"PostgreSQL at {info.host}:{info.port} {STANDBY_HINT}")
