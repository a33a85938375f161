"""Apply the outbox schema: plain SQL files, each once, recorded in ``schema_migrations``.

``zapstream db migrate`` runs :func:`migrate`. Files live in
``connectors/migrations/NNNN_name.sql`` and are applied in order, each in its
own transaction, under an advisory lock so two processes starting at once do
not race. A file already applied is skipped; one whose text changed after it
was applied is an error (edit schemas with a new file, never in place).
"""

from __future__ import annotations

import dataclasses
import hashlib
from importlib import resources

import psycopg

_LOCK_ID = 0x7A617073  # "zaps": one advisory lock for all zapstream migrations


class MigrationError(RuntimeError):
    """A migration's recorded checksum differs from the file shipped now."""


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
