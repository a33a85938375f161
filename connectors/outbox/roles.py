"""One PostgreSQL group role per component, with exactly the privileges its SQL needs.

The owner of the outbox schema (the role ``zapstream db migrate`` connects as) owns the
tables and grants; every other component connects as a login role that is a member of
one NOLOGIN group role below and holds nothing else. :data:`COMPONENT_ROLES` is the
single definition, read from the SQL each component runs:

=========  ====================  ========================================================
component  group role            what it runs
=========  ====================  ========================================================
relay      zapstream_relay       the replication connection (REPLICATION, a login
                                 attribute), catalog reads to check the publication and
                                 slot, the WAL heartbeat; counts PENDING jobs when it
                                 re-creates a dropped slot; releases due SCHEDULED jobs
                                 into ``outbox_replays``; keeps its slot's record and
                                 restreams a slot gap (``outbox_relay_slots``)
worker     zapstream_worker      the job history of late redeliveries (status, version,
                                 attempts of one job; its ATTEMPTING events)
sink       zapstream_sink        states into ``outbox_jobs``, events into
                                 ``outbox_job_events``, the pipeline gauges' counts
webhook    zapstream_webhook     finds the job of a receipt: five columns, no payload
console    zapstream_console     reads jobs and their history, writes cancel/reprocess,
                                 reschedules a SCHEDULED job
operator   zapstream_operator    the CLI: the console's rights plus pause/resume, opt-outs
app        zapstream_app         applications: enqueue, cancel, pause/resume, backlog,
                                 opt-out/opt-in; the outbox article's UPDATEs, which a
                                 trigger turns into a reprocess command or refuses with a
                                 message
prune      zapstream_prune       ``zapstream outbox prune``: redacts settled jobs
=========  ====================  ========================================================

The lag monitor and ``topics ensure`` never connect to PostgreSQL; ``outbox restream``
(recovery after a lost slot, with ``db migrate`` re-creating it) runs as the owner:
it locks job rows (``FOR UPDATE``), which needs UPDATE on ``outbox_jobs``.

Opt-outs learnt from the gateway (Meta's 131050) need no right of the sink's: the trigger
on ``outbox_job_events`` that records them (migration 0010) runs as the tables' owner.

Why the relay gets no SELECT on the published tables: the walsender decodes the rows
under the REPLICATION attribute; table SELECT is only needed to copy a table's existing
rows, which a subscription does and the relay never does. Its scheduled release runs
``zapstream_release_due`` (migration 0008, SECURITY DEFINER), a function it may
EXECUTE, with migration 0011's functions that keep its slot's record in
``outbox_relay_slots`` (which it may read) and restream a gap. The publication (which
only the tables' owner may create or extend) and the slot are created by ``db migrate``;
the relay re-creates a dropped slot itself (REPLICATION allows it).

:func:`roles_sql` is the idempotent SQL (create the group roles if missing, reset and
grant); ``zapstream db roles --print`` prints it for a DBA, and ``zapstream db migrate``
applies it (:func:`apply_roles`), creating the group roles when it may (CREATEROLE) and
otherwise granting to those that exist. Login roles and passwords are never zapstream's:
``CREATE ROLE relay LOGIN REPLICATION PASSWORD '...' IN ROLE zapstream_relay``
(docs/guides/security.md).
"""

from __future__ import annotations

import dataclasses
import logging

import psycopg

log = logging.getLogger(__name__)

JOBS = "outbox_jobs"
EVENTS = "outbox_job_events"
COMMANDS = "outbox_commands"
REPLAYS = "outbox_replays"
CONTROLS = "outbox_controls"
CONTROLS_VIEW = "zapstream_controls"
OPTOUTS = "outbox_optouts"
OPTOUTS_VIEW = "zapstream_optouts"
MIGRATIONS = "schema_migrations"
RELAY_SLOTS = "outbox_relay_slots"
TABLES = (
    JOBS,
    EVENTS,
    COMMANDS,
    REPLAYS,
    CONTROLS,
    CONTROLS_VIEW,
    OPTOUTS,
    OPTOUTS_VIEW,
    MIGRATIONS,
    RELAY_SLOTS,
)
"""Every relation the group roles are granted on (reset on each apply)."""
SEQUENCES = tuple(f"{t}_id_seq" for t in (JOBS, EVENTS, COMMANDS, REPLAYS, CONTROLS, OPTOUTS))
RELEASE_FUNCTION = "zapstream_release_due(integer)"
"""Migration 0008's scheduled release (SECURITY DEFINER), the relay's only write."""
SLOT_CREATED_FUNCTION = "zapstream_relay_slot_created(text, pg_lsn, text)"
SLOT_SETTLED_FUNCTION = "zapstream_relay_slot_settled(text, pg_lsn)"
SLOT_CHECKPOINT_FUNCTION = "zapstream_relay_slot_checkpoint(text)"
RESTREAM_FUNCTION = "zapstream_restream_pending(timestamptz, text, text, integer)"
"""Migration 0011's slot record and restream (SECURITY DEFINER): the relay's gap recovery."""
FUNCTIONS = (
    RELEASE_FUNCTION,
    SLOT_CREATED_FUNCTION,
    SLOT_SETTLED_FUNCTION,
    SLOT_CHECKPOINT_FUNCTION,
    RESTREAM_FUNCTION,
)
"""Functions granted to a group role (EXECUTE; revoked from PUBLIC by their migration)."""
WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
"""Table privileges beyond reading."""


@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """One privilege on one relation, on some columns (empty: the whole relation)."""

    privilege: str
    relation: str
    columns: tuple[str, ...] = ()

    def sql(self, role: str) -> str:
        if self.relation in FUNCTIONS:
            return f"GRANT {self.privilege} ON FUNCTION {self.relation} TO {role};"
        cols = f" ({', '.join(self.columns)})" if self.columns else ""
        return f"GRANT {self.privilege}{cols} ON {self.relation} TO {role};"


@dataclasses.dataclass(frozen=True, slots=True)
class ComponentRole:
    """A component's group role and everything it is granted."""

    component: str
    purpose: str
    grants: tuple[Grant, ...]
    sequences: tuple[str, ...] = ()
    """Sequences it may draw ids from (USAGE): those of the tables it INSERTs into."""
    replication: bool = False
    """Its login role needs the REPLICATION attribute (not grantable through membership)."""

    @property
    def role(self) -> str:
        return f"zapstream_{self.component}"


def _cols(*names: str) -> tuple[str, ...]:
    return names


_VERSIONS = Grant("SELECT", MIGRATIONS)  # lets `zapstream doctor` run as any component
_COMMAND_INSERT = Grant(
    "INSERT", COMMANDS, _cols("job_id", "idempotency_key", "command", "reason", "actor")
)
_CONTROL_INSERT = Grant("INSERT", CONTROLS, _cols("kind", "target", "action", "reason", "actor"))
_RESCHEDULE = Grant("UPDATE", JOBS, _cols("next_retry_at", "updated_at"))
"""Reschedule a job not released yet (connectors/outbox/schedule.py, zapstream_reschedule)."""
# The outbox article's UPDATEs of outbox_jobs (migration 0009): granted so that its
# FAQ reprocess (SET status = 'PENDING', attempts = 0, next_retry_at = NOW()) reaches the
# trigger that turns it into a reprocess command, and its worker's writes get the
# trigger's refusal naming what to do instead of a bare "permission denied". Never
# state_version: a write that leaves it alone is known not to be the sink's. The
# trigger runs as this role and reads the job's moves for the may-be-delivered check.
_ARTICLE_UPDATE = Grant(
    "UPDATE", JOBS, _cols("status", "attempts", "next_retry_at", "last_error", "sent_at")
)
_ARTICLE_RISK_READ = Grant("SELECT", EVENTS, _cols("job_id", "from_status", "to_status", "version"))
_OPTOUT_INSERT = Grant(
    "INSERT", OPTOUTS, _cols("instance_id", "recipient", "action", "source", "reason")
)
_READ_ALL = (
    Grant("SELECT", JOBS),
    Grant("SELECT", EVENTS),
    Grant("SELECT", COMMANDS),
    Grant("SELECT", REPLAYS),
    Grant("SELECT", CONTROLS_VIEW),
    Grant("SELECT", OPTOUTS),
    Grant("SELECT", OPTOUTS_VIEW),
)

COMPONENT_ROLES: tuple[ComponentRole, ...] = (
    ComponentRole(
        "relay",
        "streams outbox inserts (logical replication); re-creates a dropped slot",
        (
            Grant("SELECT", JOBS, _cols("status")),
            # The scheduled release (connectors/cdc/scheduled_release.py), SECURITY DEFINER:
            # no write and no payload read of the relay's own.
            Grant("EXECUTE", RELEASE_FUNCTION),
            # Its slot's record and the restream of a gap (connectors/cdc/slot_gap.py),
            # SECURITY DEFINER: it reads the record, it never reads a payload.
            Grant("SELECT", RELAY_SLOTS),
            Grant("EXECUTE", SLOT_CREATED_FUNCTION),
            Grant("EXECUTE", SLOT_SETTLED_FUNCTION),
            Grant("EXECUTE", SLOT_CHECKPOINT_FUNCTION),
            Grant("EXECUTE", RESTREAM_FUNCTION),
            _VERSIONS,
        ),
        replication=True,
    ),
    ComponentRole(
        "worker",
        "looks up the state of a job a late redelivery names",
        (
            Grant(
                "SELECT", JOBS, _cols("id", "status", "state_version", "attempts", "gateway_job_id")
            ),
            Grant("SELECT", EVENTS, _cols("job_id", "from_status", "to_status")),
            _VERSIONS,
        ),
    ),
    ComponentRole(
        "sink",
        "writes job states and their events; counts jobs for its gauges",
        (
            Grant(
                "SELECT",
                JOBS,
                _cols(
                    "id",
                    "instance_id",
                    "purpose",
                    "status",
                    "attempts",
                    "state_version",
                    "gateway_job_id",
                    "last_error",
                    "sent_at",
                    "created_at",
                    "next_retry_at",
                ),
            ),
            Grant(
                "UPDATE",
                JOBS,
                _cols(
                    "status",
                    "state_version",
                    "attempts",
                    "gateway_job_id",
                    "last_error",
                    "sent_at",
                    "updated_at",
                    "next_retry_at",
                ),
            ),
            Grant(
                "INSERT",
                EVENTS,
                _cols(
                    "job_id",
                    "from_status",
                    "to_status",
                    "version",
                    "actor",
                    "reason",
                    "at",
                    "outcome",
                    "command_id",
                ),
            ),
            # ON CONFLICT (job_id, version) DO NOTHING reads the arbiter index's columns.
            Grant("SELECT", EVENTS, _cols("job_id", "version")),
            _VERSIONS,
        ),
        sequences=(f"{EVENTS}_id_seq",),
    ),
    ComponentRole(
        "webhook",
        "finds the job a receipt names (never its payload)",
        (
            Grant(
                "SELECT",
                JOBS,
                _cols("id", "idempotency_key", "instance_id", "conversation_key", "gateway_job_id"),
            ),
            _VERSIONS,
        ),
    ),
    ComponentRole(
        "console",
        "reads jobs and their history; requests cancel and reprocess",
        (*_READ_ALL, _COMMAND_INSERT, _RESCHEDULE, _VERSIONS),
        sequences=(f"{COMMANDS}_id_seq",),
    ),
    ComponentRole(
        "operator",
        "the zapstream CLI: jobs, status, doctor, cancel/reprocess, pause/resume, opt-outs",
        (
            *_READ_ALL,
            Grant("SELECT", CONTROLS),
            _COMMAND_INSERT,
            _CONTROL_INSERT,
            _RESCHEDULE,
            _OPTOUT_INSERT,
            _VERSIONS,
        ),
        sequences=(f"{COMMANDS}_id_seq", f"{CONTROLS}_id_seq", f"{OPTOUTS}_id_seq"),
    ),
    ComponentRole(
        "app",
        "applications: enqueue, cancel, pause/resume, backlog, should_hold, opt-out/opt-in; "
        "the outbox article's UPDATEs (reprocess by SQL, refused worker writes)",
        (
            Grant("SELECT", JOBS),
            _ARTICLE_UPDATE,
            _ARTICLE_RISK_READ,
            Grant(
                "INSERT",
                JOBS,
                _cols(
                    "instance_id",
                    "payload",
                    "idempotency_key",
                    "conversation_key",
                    "priority",
                    "purpose",
                    "expires_at",
                    "max_attempts",
                    "next_retry_at",
                ),
            ),
            _RESCHEDULE,
            Grant("SELECT", COMMANDS, _cols("id")),
            _COMMAND_INSERT,
            Grant("SELECT", CONTROLS, _cols("id")),
            _CONTROL_INSERT,
            Grant("SELECT", CONTROLS_VIEW),
            # opt_out/opt_in (RETURNING id), opted_out (the person's latest row), optouts.
            Grant("SELECT", OPTOUTS, _cols("id", "instance_id", "recipient", "action")),
            _OPTOUT_INSERT,
            Grant("SELECT", OPTOUTS_VIEW),
            _VERSIONS,
        ),
        sequences=(
            f"{JOBS}_id_seq",
            f"{COMMANDS}_id_seq",
            f"{CONTROLS}_id_seq",
            f"{OPTOUTS}_id_seq",
        ),
    ),
    ComponentRole(
        "prune",
        "zapstream outbox prune: redacts settled jobs, deletes their earlier events",
        (
            Grant("SELECT", JOBS, _cols("id", "status", "updated_at", "payload")),
            Grant("UPDATE", JOBS, _cols("payload", "conversation_key")),
            Grant("SELECT", COMMANDS, _cols("job_id", "payload")),
            Grant("UPDATE", COMMANDS, _cols("payload", "conversation_key")),
            Grant("SELECT", REPLAYS, _cols("job_id", "payload")),
            Grant("UPDATE", REPLAYS, _cols("payload", "conversation_key")),
            Grant("SELECT", EVENTS, _cols("job_id", "version")),
            Grant("DELETE", EVENTS),
            _VERSIONS,
        ),
    ),
)
COMPONENTS = tuple(r.component for r in COMPONENT_ROLES)


def component_role(component: str) -> ComponentRole:
    """The role of ``component`` (one of :data:`COMPONENTS`); ValueError otherwise."""
    for spec in COMPONENT_ROLES:
        if spec.component == component:
            return spec
    raise ValueError(f"unknown component {component!r}: one of {', '.join(COMPONENTS)}")


# --- SQL -------------------------------------------------------------------------------------


def create_role_sql(spec: ComponentRole) -> str:
    """Create the group role unless it exists (two concurrent migrations: one wins)."""
    return (
        f"DO $$ BEGIN CREATE ROLE {spec.role} NOLOGIN; "
        "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;"
    )


def grant_sql(spec: ComponentRole) -> list[str]:
    """Reset the role's privileges on zapstream's objects, then grant what it needs.

    ``REVOKE ALL`` on a table also revokes its column privileges, so a privilege a
    newer version no longer grants goes. Schema USAGE is granted on the current schema
    (the one ``db migrate`` created the tables in).
    """
    role = spec.role
    statements = [
        f"DO $$ BEGIN EXECUTE format('GRANT USAGE ON SCHEMA %I TO {role}', current_schema()); "
        "END $$;",
        f"REVOKE ALL ON {', '.join(TABLES)} FROM {role};",
        f"REVOKE ALL ON SEQUENCE {', '.join(SEQUENCES)} FROM {role};",
        f"REVOKE ALL ON FUNCTION {', '.join(FUNCTIONS)} FROM {role};",
    ]
    statements += [grant.sql(role) for grant in spec.grants]
    if spec.sequences:
        statements.append(f"GRANT USAGE ON SEQUENCE {', '.join(spec.sequences)} TO {role};")
    return statements


def roles_sql() -> str:
    """The whole script: idempotent, for ``psql`` in the outbox's database after migrating."""
    lines = [
        "-- zapstream: one NOLOGIN group role per component (zapstream db roles --print).",
        "-- Run in the outbox's database, after `zapstream db migrate --no-roles`, as the",
        "-- tables' owner with CREATEROLE (or create the roles first, then run it as the owner).",
        "-- Idempotent: each run resets the roles' privileges on zapstream's tables.",
        "BEGIN;",
    ]
    for spec in COMPONENT_ROLES:
        lines.append(f"\n-- {spec.component}: {spec.purpose}")
        if spec.replication:
            lines.append(
                "-- its login role needs REPLICATION: "
                f"CREATE ROLE ... LOGIN REPLICATION IN ROLE {spec.role}"
            )
        lines.append(create_role_sql(spec))
        lines.extend(grant_sql(spec))
    lines.append("\nCOMMIT;")
    return "\n".join(lines) + "\n"


# --- applying --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RolesResult:
    """What :func:`apply_roles` did."""

    created: list[str]
    granted: list[str]
    missing: list[str]
    """Group roles that do not exist and could not be created (no CREATEROLE)."""


def apply_roles(dsn: str) -> RolesResult:
    """Create missing group roles (when this role may) and reset every one's grants.

    Run as the owner of the outbox tables, after the migrations, in one transaction.
    """
    created: list[str] = []
    granted: list[str] = []
    missing: list[str] = []
    with psycopg.connect(dsn) as conn, conn.transaction():
        row = conn.execute(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        may_create = bool(row and row[0])
        existing = {
            str(name)
            for (name,) in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)",
                ([s.role for s in COMPONENT_ROLES],),
            )
        }
        for spec in COMPONENT_ROLES:
            if spec.role not in existing:
                if not may_create:
                    missing.append(spec.role)
                    continue
                conn.execute(create_role_sql(spec).encode())
                created.append(spec.role)
            for statement in grant_sql(spec):
                conn.execute(statement.encode())
            granted.append(spec.role)
    return RolesResult(created, granted, missing)
