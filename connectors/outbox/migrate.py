"""Apply the outbox schema: plain SQL files, each once, recorded in ``schema_migrations``.

``zapstream db migrate`` runs :func:`migrate`. Files live in
``connectors/migrations/NNNN_name.sql`` and are applied in order, each in its
own transaction, under an advisory lock so two processes starting at once do
not race. A file already applied is skipped; one whose text changed after it
was applied is an error (edit schemas with a new file, never in place).

A database that already has an ``outbox_jobs`` of its own (the outbox article's
``CREATE TABLE``: VARCHAR columns, no ``state_version``, no ``conversation_key``)
is refused before anything is written, with the two statements that move it
aside (:class:`ForeignOutboxTable`); docs/guides/application.md says how to copy
its PENDING rows in afterwards.
"""

from __future__ import annotations

import dataclasses
import hashlib
from importlib import resources
from typing import Any

import psycopg

from streams.kernel.errors import Failure

_LOCK_ID = 0x7A617073  # "zaps": one advisory lock for all zapstream migrations


class MigrationError(RuntimeError):
    """A migration's recorded checksum differs from the file shipped now."""


class ForeignOutboxTable(Failure):
    """``outbox_jobs`` exists and is not zapstream's: permanent, one line naming what to do."""

    dependency = "postgres"


_FOREIGN_TABLE = """
    SELECT count(*) FILTER (WHERE a.attname = 'state_version')
    FROM pg_class c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE c.relname = 'outbox_jobs' AND c.relnamespace = current_schema()::regnamespace
    HAVING count(*) > 0
"""
FOREIGN_TABLE_HINT = (
    "move it aside with `CREATE SCHEMA article_outbox; ALTER TABLE outbox_jobs SET SCHEMA "
    "article_outbox;`, run `zapstream db migrate` again, then copy its PENDING rows into "
    'zapstream\'s outbox_jobs (docs/guides/application.md, "Coming from the outbox article")'
)


def _refuse_foreign_outbox(conn: psycopg.Connection[Any]) -> None:
    """Before the first migration: an ``outbox_jobs`` without ``state_version`` is not ours.

    ``CREATE TABLE IF NOT EXISTS`` would keep it and the next statement fail on a
    missing column, leaving the application's table half-adopted.
    """
    row = conn.execute(_FOREIGN_TABLE).fetchone()
    if row is not None and row[0] == 0:
        raise ForeignOutboxTable(
            "outbox_jobs already exists and is not zapstream's (no state_version column: "
            "the outbox article's own table?)",
            hint=FOREIGN_TABLE_HINT,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def shipped_migrations() -> list[Migration]:
    """The SQL files in ``connectors/migrations``, ordered by their number."""
    found = []
    for entry in resources.files("connectors.outbox.migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        number, _, rest = entry.name.partition("_")
        found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text("utf-8")))
    return sorted(found, key=lambda m: m.version)


def migrate(dsn: str) -> list[str]:
    """Apply every migration not applied yet; return the names applied now."""
    applied_now: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_ID,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version    INTEGER PRIMARY KEY,
                       name       TEXT NOT NULL,
                       checksum   TEXT NOT NULL,
                       applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
            )
            recorded: dict[int, str] = dict(
                conn.execute("SELECT version, checksum FROM schema_migrations")
            )
            if 1 not in recorded:
                _refuse_foreign_outbox(conn)
            for migration in shipped_migrations():
                seen = recorded.get(migration.version)
                if seen is not None:
                    if seen != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version}_{migration.name} changed after it "
                            "was applied; add a new migration instead"
                        )
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) "
                        "VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                applied_now.append(f"{migration.version:04d}_{migration.name}")
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_ID,))
    return applied_now
