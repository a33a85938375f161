"""What the connected PostgreSQL role may do, against what its component needs.

``zapstream doctor`` (:mod:`connectors.ops.doctor`) reads the role's attributes
(SUPERUSER, REPLICATION, CREATEROLE, CREATEDB, BYPASSRLS), whether it owns the schema or
the outbox tables, its group roles, and every privilege it holds on zapstream's tables
and sequences (column by column, as ``has_column_privilege`` sees it: directly, through
a group role or PUBLIC). :func:`role_problems` compares that with the component's
:class:`~connectors.outbox.roles.ComponentRole` and returns one problem per finding,
each with the statement to run. Pure: unit-tested without a database.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import psycopg

from connectors.outbox.roles import (
    COMPONENT_ROLES,
    FUNCTIONS,
    SEQUENCES,
    TABLES,
    WRITES,
    ComponentRole,
    component_role,
)

COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")
TABLE_PRIVILEGES = ("DELETE", "TRUNCATE", "TRIGGER")
SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")

Privilege = tuple[str, str, str | None]
"""(relation, privilege, column or None for a table- or sequence-wide privilege)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RoleFacts:
    """The connected role as PostgreSQL describes it."""

    user: str
    superuser: bool
    replication: bool
    createrole: bool
    createdb: bool
    bypassrls: bool
    owns: tuple[str, ...]
    """The schema (``schema <name>``) and outbox tables it owns, or is a member of the owner of."""
    schema_create: bool
    """It may CREATE in the outbox's schema (PUBLIC may, before PostgreSQL 15)."""
    groups: tuple[str, ...]
    """The ``zapstream_*`` group roles it is a member of."""
    columns: dict[str, tuple[str, ...]]
    """Each zapstream relation's columns."""
    held: frozenset[Privilege]


@dataclasses.dataclass(frozen=True, slots=True)
class RoleProblem:
    """One finding: what is wrong and what to run."""

    detail: str
    remedy: str


_ATTRIBUTES = """
    SELECT current_user, rolsuper, rolreplication, rolcreaterole, rolcreatedb, rolbypassrls,
           has_schema_privilege(current_schema(), 'CREATE'),
           pg_has_role((SELECT nspowner FROM pg_namespace WHERE nspname = current_schema()),
                       'USAGE'),
           current_schema()
    FROM pg_roles WHERE rolname = current_user
"""
_GROUPS = """
    SELECT rolname FROM pg_roles
    WHERE rolname = ANY(%s) AND pg_has_role(current_user, oid, 'MEMBER') ORDER BY rolname
"""
_RELATIONS = """
    SELECT c.oid, c.relname, c.relkind, pg_has_role(c.relowner, 'USAGE')
    FROM pg_class c WHERE c.relname = ANY(%s) AND pg_table_is_visible(c.oid)
"""
_COLUMNS = """
    SELECT c.relname, a.attname, p.priv, has_column_privilege(c.oid, a.attnum, p.priv)
    FROM pg_class c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    CROSS JOIN unnest(%s::text[]) AS p(priv)
    WHERE c.oid = ANY(%s)
    ORDER BY c.relname, a.attnum
"""
_TABLES = """
    SELECT c.relname, p.priv FROM pg_class c CROSS JOIN unnest(%s::text[]) AS p(priv)
    WHERE c.oid = ANY(%s) AND has_table_privilege(c.oid, p.priv)
"""
_SEQUENCES = """
    SELECT c.relname, p.priv FROM pg_class c CROSS JOIN unnest(%s::text[]) AS p(priv)
    WHERE c.oid = ANY(%s) AND has_sequence_privilege(c.oid, p.priv)
"""
# Functions that exist (a schema not migrated yet has none) and that the role may run.
_FUNCTIONS = """
    SELECT f FROM unnest(%s::text[]) AS f
    WHERE to_regprocedure(f) IS NOT NULL AND has_function_privilege(to_regprocedure(f), 'EXECUTE')
"""


async def read_role_facts(conn: psycopg.AsyncConnection[Any]) -> RoleFacts:
    """Everything :func:`role_problems` needs, for the connection's role."""
    cur = await conn.execute(_ATTRIBUTES)
    row = await cur.fetchone()
    assert row is not None, "current_user is always in pg_roles"
    user, sup, repl, createrole, createdb, bypass, schema_create, owns_schema, schema = row
    cur = await conn.execute(_GROUPS, ([r.role for r in COMPONENT_ROLES],))
    groups = tuple(str(g) for (g,) in await cur.fetchall())
    cur = await conn.execute(_RELATIONS, ([*TABLES, *SEQUENCES],))
    relations = await cur.fetchall()
    owns = [f"schema {schema}"] if owns_schema else []
    owns += [str(name) for _, name, _, owner in relations if owner]
    tables = [oid for oid, _, kind, _ in relations if kind != "S"]
    sequences = [oid for oid, _, kind, _ in relations if kind == "S"]
    held: set[Privilege] = set()
    columns: dict[str, list[str]] = defaultdict(list)
    cur = await conn.execute(_COLUMNS, (list(COLUMN_PRIVILEGES), tables))
    for relation, column, privilege, has in await cur.fetchall():
        if privilege == COLUMN_PRIVILEGES[0]:
            columns[str(relation)].append(str(column))
        if has:
            held.add((str(relation), str(privilege), str(column)))
    cur = await conn.execute(_TABLES, (list(TABLE_PRIVILEGES), tables))
    held |= {(str(r), str(p), None) for r, p in await cur.fetchall()}
    cur = await conn.execute(_SEQUENCES, (list(SEQUENCE_PRIVILEGES), sequences))
    held |= {(str(r), str(p), None) for r, p in await cur.fetchall()}
    cur = await conn.execute(_FUNCTIONS, (list(FUNCTIONS),))
    held |= {(str(f), "EXECUTE", None) for (f,) in await cur.fetchall()}
    return RoleFacts(
        str(user),
        bool(sup),
        bool(repl),
        bool(createrole),
        bool(createdb),
        bool(bypass),
        tuple(owns),
        bool(schema_create),
        groups,
        {name: tuple(cols) for name, cols in columns.items()},
        frozenset(held),
    )


def needed(spec: ComponentRole, columns: dict[str, tuple[str, ...]]) -> frozenset[Privilege]:
    """The privileges ``spec`` grants, column by column where PostgreSQL has columns."""
    out: set[Privilege] = set()
    for grant in spec.grants:
        if grant.privilege in COLUMN_PRIVILEGES:
            cols = grant.columns or columns.get(grant.relation, ())
            out |= {(grant.relation, grant.privilege, c) for c in cols}
        else:
            out.add((grant.relation, grant.privilege, None))
    out |= {(seq, "USAGE", None) for seq in spec.sequences}
    return frozenset(out)


def infer_component(facts: RoleFacts) -> str | None:
    """The component whose group role the role is a member of, if exactly one."""
    if len(facts.groups) != 1:
        return None
    return facts.groups[0].removeprefix("zapstream_")


def role_problems(facts: RoleFacts, component: str) -> list[RoleProblem]:
    """What ``facts``'s role holds beyond, or lacks of, what ``component`` needs."""
    spec = component_role(component)
    user = facts.user
    problems: list[RoleProblem] = []
    if facts.superuser:
        replication = " REPLICATION" if spec.replication else ""
        problems.append(
            RoleProblem(
                f"{user} is a SUPERUSER; the {component} needs only {spec.role}",
                "connect as a login role without SUPERUSER: CREATE ROLE <name> LOGIN"
                f"{replication} IN ROLE {spec.role}",
            )
        )
    if facts.replication and not spec.replication and not facts.superuser:
        problems.append(
            RoleProblem(
                f"{user} has REPLICATION, which only the relay needs",
                f"ALTER ROLE {user} NOREPLICATION",
            )
        )
    if spec.replication and not facts.replication and not facts.superuser:
        problems.append(
            RoleProblem(
                f"{user} lacks REPLICATION, which the relay's replication connection needs",
                f"as a superuser: ALTER ROLE {user} REPLICATION (Amazon RDS: GRANT "
                f"rds_replication TO {user})",
            )
        )
    for attribute, has in (
        ("CREATEROLE", facts.createrole),
        ("CREATEDB", facts.createdb),
        ("BYPASSRLS", facts.bypassrls),
    ):
        if has and not facts.superuser:
            problems.append(
                RoleProblem(
                    f"{user} has {attribute}, which the {component} never needs",
                    f"ALTER ROLE {user} NO{attribute}",
                )
            )
    if facts.owns:
        problems.append(
            RoleProblem(
                f"{user} owns {', '.join(facts.owns[:3])}"
                f"{' and more' if len(facts.owns) > 3 else ''}: the owner may do anything "
                "to the outbox, which only `db migrate` needs",
                f"connect the {component} as its own login role: CREATE ROLE <name> LOGIN "
                f"IN ROLE {spec.role} (docs/guides/security.md)",
            )
        )
    if facts.superuser or facts.owns:
        return problems  # every privilege check below would only repeat these
    if facts.schema_create:
        problems.append(
            RoleProblem(
                f"{user} may CREATE objects in the outbox's schema",
                "REVOKE CREATE ON SCHEMA <schema> FROM PUBLIC (and from the role granting it)",
            )
        )
    want = needed(spec, facts.columns)
    problems += _grouped(facts.held - want, facts, component, extra=True)
    problems += _grouped(want - facts.held, facts, component, extra=False)
    return problems


def _grouped(
    privileges: frozenset[Privilege], facts: RoleFacts, component: str, *, extra: bool
) -> list[RoleProblem]:
    by_grant: dict[tuple[str, str], list[str]] = defaultdict(list)
    for relation, privilege, column in privileges:
        by_grant[(relation, privilege)].append(column or "")
    spec = component_role(component)
    out = []
    for (relation, privilege), cols in sorted(by_grant.items()):
        all_cols = facts.columns.get(relation, ())
        named = [c for c in all_cols if c in cols] if all(cols) else []
        what = f"{privilege} on {relation}"
        if named and len(named) < len(all_cols):
            what = f"{privilege} ({', '.join(named)}) on {relation}"
        if extra:
            kind = (
                "write"
                if privilege in WRITES or relation in SEQUENCES or relation in FUNCTIONS
                else "read"
            )
            out.append(
                RoleProblem(
                    f"{facts.user} may {what}, a {kind} the {component} never does",
                    f"REVOKE {privilege} ON {relation} FROM {facts.user} (or from the role "
                    "or PUBLIC it holds it through)",
                )
            )
        else:
            out.append(
                RoleProblem(
                    f"{facts.user} may not {what}, which the {component} needs",
                    f"run `zapstream db migrate` (it grants {spec.role}) and GRANT "
                    f"{spec.role} TO {facts.user}",
                )
            )
    return out
