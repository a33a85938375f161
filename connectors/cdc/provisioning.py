"""Provisioning for the CDC relay: the publication and the replication slot.

Before streaming, the relay makes sure the publication exists (inserts only, so
state write-back into ``outbox_jobs`` never echoes into the stream) and covers
every table in :data:`PUBLISHED_TABLES`, and that the pgoutput slot exists. It
runs over an ordinary (blocking) psycopg connection: call it in a thread from
async code.
"""

from __future__ import annotations

import contextlib

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from connectors.cdc.lsn import Lsn

OUTBOX_TABLE = "outbox_jobs"
COMMANDS_TABLE = "outbox_commands"
PUBLISHED_TABLES = (OUTBOX_TABLE, COMMANDS_TABLE)


class ProvisioningError(RuntimeError):
    """The slot exists but cannot be used as is (another output plugin). Never retried."""

    retriable = False


def ensure_replication(dsn: str, *, slot: str, publication: str) -> Lsn:
    """Create the insert-only publication and the pgoutput slot if missing.

    The publication covers ``outbox_jobs`` and ``outbox_commands``; a publication
    from an older version gets the missing table added. Returns the slot's
    confirmed position. Safe to run from several relays at once.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)
        ).fetchone()
        if not exists:
            with contextlib.suppress(pg_errors.DuplicateObject):
                conn.execute(
                    sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')").format(
                        sql.Identifier(publication),
                        sql.SQL(", ").join(sql.Identifier(t) for t in PUBLISHED_TABLES),
                    )
                )
        published = {
            str(name)
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (publication,)
            )
        }
        for table in PUBLISHED_TABLES:
            if table not in published:
                with contextlib.suppress(pg_errors.DuplicateObject):
                    conn.execute(
                        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                            sql.Identifier(publication), sql.Identifier(table)
                        )
                    )
        row = conn.execute(
            "SELECT plugin, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        if row is None:
            with contextlib.suppress(pg_errors.DuplicateObject):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            row = conn.execute(
                "SELECT plugin, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            ).fetchone()
        assert row is not None
        plugin, confirmed = row
        if plugin != "pgoutput":
            raise ProvisioningError(f"slot {slot!r} uses plugin {plugin!r}, not pgoutput")
        return Lsn.parse(str(confirmed)) if confirmed else Lsn(0)
