"""A streaming standby of a throwaway :class:`~devtools.stack.devstack.PostgresCluster`.

``pg_basebackup`` clones the running primary (``-R`` writes ``standby.signal`` and
``primary_conninfo``, with the database name so PostgreSQL 17+ can synchronise logical
slots; ``-C -S`` creates the physical slot it streams from), then the standby starts on a
port of its own with the same throwaway settings plus ``settings``. :meth:`promote` makes
it a primary (``pg_ctl promote``), as Patroni, CloudNativePG or a managed service would
after the primary died (:meth:`PostgresCluster.crash`).

For the failover tests (tests/integration/test_failover.py), the doctor's standby checks,
and anyone who wants to try a failover by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import psycopg

from devtools.stack.devstack import PostgresCluster

PHYSICAL_SLOT = "zapstream_standby"
"""The physical slot the standby streams from (``primary_slot_name``)."""


class StandbyCluster(PostgresCluster):
    """A hot standby of ``primary``, cloned with ``pg_basebackup`` and streaming from it.

    ``dbname`` goes into ``primary_conninfo`` (the slot synchronisation worker of
    PostgreSQL 17+ connects to that database). ``settings`` are added to the server's
    command line (e.g. ``sync_replication_slots=on``, ``hot_standby_feedback=on``).
    """

    def __init__(
        self,
        primary: PostgresCluster,
        *,
        dbname: str = "postgres",
        physical_slot: str = PHYSICAL_SLOT,
        base_dir: Path | None = None,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(
            base_dir, port, settings=settings, start_timeout_s=start_timeout_s, keep=False
        )
        self.primary = primary
        self.dbname = dbname
        self.physical_slot = physical_slot

    def __repr__(self) -> str:
        return f"<StandbyCluster port={self.port} of {self.primary!r}>"

    def _create_data_dir(self) -> None:
        conninfo = (
            f"host=127.0.0.1 port={self.primary.port} user=postgres dbname={self.dbname} "
            "application_name=" + self.physical_slot
        )
        with psycopg.connect(self.primary.dsn(), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s AND NOT active",
                (self.physical_slot,),
            )
        self._run(
            [
                str(self._bin / "pg_basebackup"),
                "-D",
                str(self.data_dir),
                "-d",
                conninfo,
                "-X",
                "stream",
                "-R",
                "-C",
                "-S",
                self.physical_slot,
                "-c",
                "fast",
                "--no-sync",
            ],
            what="pg_basebackup",
            timeout_s=self._start_timeout_s,
        )

    def promote(self, timeout_s: float = 60.0) -> None:
        """``pg_ctl promote -w``: the standby ends recovery and accepts writes."""
        self._run(
            [
                str(self._bin / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-w",
                "-t",
                str(max(1, round(timeout_s))),
                "promote",
            ],
            what="pg_ctl promote",
            timeout_s=timeout_s + 5,
        )


def failover_dsn(dbname: str, *clusters: PostgresCluster, **params: str) -> str:
    """A multi-host libpq DSN over ``clusters`` that reaches whichever accepts writes."""
    hosts = ",".join(f"127.0.0.1:{cluster.port}" for cluster in clusters)
    query = "&".join(
        f"{key}={value}" for key, value in {"target_session_attrs": "read-write", **params}.items()
    )
    return f"postgresql://postgres@{hosts}/{dbname}?{query}"
