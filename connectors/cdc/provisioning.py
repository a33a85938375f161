"""Provisioning for the CDC relay: the publication and the replication slot.

Before streaming, the relay makes sure the publication exists (inserts only, so
state write-back into ``outbox_jobs`` never echoes into the stream) and covers
every table in :data:`PUBLISHED_TABLES`, and that the pgoutput slot exists. It
runs over an ordinary (blocking) psycopg connection: call it in a thread from
async code.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq, sql

from connectors.cdc.lsn import Lsn
from connectors.cdc.primary import refuse_standby
from connectors.cdc.slot_gap import has_slot_record, record_created

OUTBOX_TABLE = "outbox_jobs"
COMMANDS_TABLE = "outbox_commands"
REPLAYS_TABLE = "outbox_replays"
CONTROLS_TABLE = "outbox_controls"
OPTOUTS_TABLE = "outbox_optouts"
PUBLISHED_TABLES = (OUTBOX_TABLE, COMMANDS_TABLE, REPLAYS_TABLE, CONTROLS_TABLE, OPTOUTS_TABLE)
log = logging.getLogger(__name__)

WAL_LEVEL_HINT = "set wal_level=logical in postgresql.conf and restart PostgreSQL"


class ProvisioningError(RuntimeError):
    """The database cannot be streamed as it is (wal_level, slot plugin, schema). Never retried."""

    retriable = False


def ensure_replication(dsn: str, *, slot: str, publication: str, failover: bool = True) -> Lsn:
    """Create the insert-only publication and the pgoutput slot if missing.

    The publication covers every table of :data:`PUBLISHED_TABLES` that exists
    (``outbox_replays``, ``outbox_controls`` and ``outbox_optouts`` came with later migrations); a
    publication from an older version gets the missing tables added. On PostgreSQL 17 and
    later, with ``failover``, the slot is a failover slot (created so, or altered at start when
    it predates the setting): standbys with ``sync_replication_slots`` keep a copy of it.
    Returns the slot's confirmed position. Safe to run from several relays at once.

    Raises :class:`StandbyServer` (transient) when ``dsn`` reaches a standby.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        refuse_standby(conn)
        wal_level = conn.execute("SHOW wal_level").fetchone()
        if wal_level is None or wal_level[0] != "logical":
            level = wal_level[0] if wal_level else "unknown"
            raise ProvisioningError(f"wal_level is {level!r}, not 'logical': {WAL_LEVEL_HINT}")
        present = {
            str(name)
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_class c WHERE c.relkind IN ('r', 'p') "
                "AND c.relname = ANY(%s) AND pg_table_is_visible(c.oid)",
                (list(PUBLISHED_TABLES),),
            )
        }
        missing = [t for t in (OUTBOX_TABLE, COMMANDS_TABLE) if t not in present]
        if missing:
            raise ProvisioningError(
                f"table {missing[0]} does not exist: run `zapstream db migrate` first"
            )
        # outbox_replays (0005), outbox_controls (0006) and outbox_optouts (0010) came
        # later: a schema from before them streams without them.
        tables = [t for t in PUBLISHED_TABLES if t in present]
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)
        ).fetchone()
        if not exists:
            with contextlib.suppress(pg_errors.DuplicateObject), _owner_only(publication):
                conn.execute(
                    sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')").format(
                        sql.Identifier(publication),
                        sql.SQL(", ").join(sql.Identifier(t) for t in tables),
                    )
                )
        published = {
            str(name)
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (publication,)
            )
        }
        for table in tables:
            if table not in published:
                with contextlib.suppress(pg_errors.DuplicateObject), _owner_only(publication):
                    conn.execute(
                        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                            sql.Identifier(publication), sql.Identifier(table)
                        )
                    )
        row = conn.execute(
            "SELECT plugin, confirmed_flush_lsn, database, current_database() "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        with_failover = failover and _supports_failover(conn)
        if row is None:
            with contextlib.suppress(pg_errors.DuplicateObject):
                created = conn.execute(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot"
                    "(%s, 'pgoutput', false, false, true)"
                    if with_failover
                    else "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
                    (slot,),
                ).fetchone()
                assert created is not None
                _record_created(conn, slot, Lsn.parse(str(created[0])))
            row = conn.execute(
                "SELECT plugin, confirmed_flush_lsn, database, current_database() "
                "FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            ).fetchone()
        assert row is not None
        plugin, confirmed, database, current = row
        if database != current:
            raise ProvisioningError(
                f"slot {slot!r} belongs to database {database!r}, not {current!r}: slots are "
                "per cluster, set ZAPSTREAM_RELAY_SLOT to a name unique in the cluster"
            )
        if plugin != "pgoutput":
            raise ProvisioningError(
                f"slot {slot!r} uses plugin {plugin!r}, not pgoutput: drop it or choose another "
                "name with ZAPSTREAM_RELAY_SLOT"
            )
        if with_failover:
            _enable_failover(conn, dsn, slot)
        return Lsn.parse(str(confirmed)) if confirmed else Lsn(0)


def _supports_failover(conn: psycopg.Connection[Any]) -> bool:
    """Failover slots (``pg_replication_slots.failover``) came with PostgreSQL 17."""
    return conn.info.server_version >= 170000


def _enable_failover(conn: psycopg.Connection[Any], dsn: str, slot: str) -> None:
    """Turn ``failover`` on for a slot created without it (by an older zapstream, by hand).

    ``ALTER_REPLICATION_SLOT`` is a replication command: it needs a replication connection,
    and a slot no relay streams (an active one is altered by the next relay to start).
    """
    row = conn.execute(
        "SELECT failover, active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    if row is None or row[0] or row[1]:
        return
    command = sql.SQL("ALTER_REPLICATION_SLOT {} ( FAILOVER true )").format(sql.Identifier(slot))
    try:
        with psycopg.connect(dsn, autocommit=True, replication="database") as replication:
            result = replication.pgconn.exec_(command.as_bytes(replication))
            message = (result.error_message or b"").decode(errors="replace").strip()
            altered = result.status == pq.ExecStatus.COMMAND_OK
    except psycopg.Error as exc:  # e.g. `db migrate` as an owner without REPLICATION
        altered, message = False, str(exc).strip()
    if not altered:
        log.warning(
            "could not make slot %s a failover slot (%s); the relay tries again at its next "
            "start (`zapstream doctor` shows the slot's failover flag)",
            slot,
            message.splitlines()[0] if message else "no reason given",
        )
        return
    log.info("slot %s is now a failover slot (standbys with sync_replication_slots copy it)", slot)


@contextlib.contextmanager
def _owner_only(publication: str) -> Iterator[None]:
    """Only the tables' owner may create or extend the publication: a relay on a role of
    its own (zapstream_relay) relies on `zapstream db migrate` to have done it."""
    try:
        yield
    except pg_errors.InsufficientPrivilege as exc:
        raise ProvisioningError(
            f"publication {publication} is missing or lacks an outbox table, and this role may "
            "not create it (only the tables' owner may): run `zapstream db migrate` as the owner"
        ) from exc


def _record_created(conn: psycopg.Connection[tuple[object, ...]], slot: str, at: Lsn) -> None:
    """A new slot starts at the current WAL: PENDING rows committed before it are never streamed.

    With migration 0011 the slot's record says a restream is owed; the relay settles it
    before it streams (:mod:`connectors.cdc.slot_gap`). Without it, an operator must.
    """
    row = conn.execute("SELECT count(*) FROM outbox_jobs WHERE status = 'PENDING'").fetchone()
    pending = int(str(row[0])) if row else 0
    if has_slot_record(conn):
        # Creating the slot waited for the transactions running then: one committing after
        # it is streamed by it. So with no PENDING row now, no row can be missing.
        record_created(conn, slot, at, f"zapstream created the slot at {at}" if pending else None)
        log.info(
            "created replication slot %s at %s; %d PENDING outbox rows committed before it "
            "will be restreamed by the relay",
            slot,
            at,
            pending,
        )
    elif pending:
        log.warning(
            "created replication slot %s; %d PENDING outbox rows committed before it will not "
            "be streamed unless you run `zapstream outbox restream --older-than <age>` "
            "(or `zapstream db migrate`, after which the relay restreams them itself)",
            slot,
            pending,
        )
    else:
        log.info("created replication slot %s", slot)
