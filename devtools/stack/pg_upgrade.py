"""A major-version upgrade of a throwaway :class:`~devtools.stack.devstack.PostgresCluster`.

:class:`UpgradedCluster` is the new cluster ``pg_upgrade`` makes from a stopped cluster's
data directory: it runs the new version's ``initdb`` (with the old cluster's data page
checksum setting, which ``pg_upgrade`` requires to match: PostgreSQL 18's ``initdb``
enables checksums by default, 15's does not), then the new version's ``pg_upgrade`` as the
``postgres`` OS user, then starts like any other cluster (same throwaway settings, same
``stop``). ``pg_upgrade --link`` by default: hard links instead of copies, the fastest
transfer, which leaves the old data directory unusable once the new cluster started; so
the new cluster owns the old cluster's directory and removes it when it stops.

What carries over is what ``pg_upgrade`` carries: the schema and rows (the outbox, the
publication, ``outbox_relay_slots``), roles. Logical replication slots only from an old
cluster of PostgreSQL 17 or later; from 15 the relay finds its slot missing and restreams
(tests/integration/test_pg_upgrade.py, docs/guides/deployment.md).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from devtools.stack.devstack import DevStackError, PostgresCluster, find_free_port
from devtools.stack.postgres_binaries import postgres_major

TRANSFER_MODES = ("link", "copy", "clone")
"""``pg_upgrade``'s ways of moving the relation files (``--link``, ``--copy``, ``--clone``)."""


def checksum_options(controldata: str, new_major: int) -> list[str]:
    """The ``initdb`` options that give the new cluster the old one's data page checksums.

    ``controldata``: the old cluster's ``pg_controldata`` output, whose ``Data page checksum
    version`` is 0 without checksums. ``--no-data-checksums`` exists from PostgreSQL 17 on
    (18 turned checksums on by default); before 17, no option means none.
    """
    found = re.search(r"^Data page checksum version:\s*(\d+)\s*$", controldata, re.M)
    if found is None:
        raise DevStackError("pg_controldata printed no 'Data page checksum version' line")
    if int(found.group(1)) != 0:
        return ["--data-checksums"]
    return ["--no-data-checksums"] if new_major >= 17 else []


class UpgradedCluster(PostgresCluster):
    """A cluster of the binaries in ``bin_dir``, upgraded by ``pg_upgrade`` from another's.

    ``source_dir`` is the old cluster's :attr:`~PostgresCluster.cluster_dir`, kept
    (``keep=True``) and stopped cleanly (``stop()``; ``pg_upgrade`` refuses a crashed
    one); ``source_bin_dir`` its binaries. ``port``: the old cluster's port, so clients
    and services reconnect to the upgraded server where they were. :meth:`stop` removes
    the source directory too (after ``--link`` it is the new cluster's files).
    """

    def __init__(
        self,
        source_dir: Path,
        source_bin_dir: Path,
        *,
        bin_dir: Path,
        port: int | None = None,
        transfer: str = "link",
        base_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        if transfer not in TRANSFER_MODES:
            raise ValueError(f"transfer={transfer!r}: expected one of {', '.join(TRANSFER_MODES)}")
        super().__init__(
            base_dir, port, settings=settings, start_timeout_s=start_timeout_s, bin_dir=bin_dir
        )
        self.source_dir = source_dir
        self.source_bin_dir = source_bin_dir
        self.transfer = transfer

    def __repr__(self) -> str:
        return f"<UpgradedCluster port={self.port} from {self.source_dir}>"

    @property
    def source_data_dir(self) -> Path:
        return self.source_dir / "data"

    def _create_data_dir(self) -> None:
        if (self.source_data_dir / "postmaster.pid").exists():
            raise DevStackError(f"{self.source_data_dir} is in use: stop its server first")
        controldata = self._exec(
            [str(self.source_bin_dir / "pg_controldata"), str(self.source_data_dir)],
            timeout_s=30,
        )
        if controldata is None or controldata.returncode != 0:
            raise DevStackError(
                f"pg_controldata {self.source_data_dir} failed: "
                + ("timed out" if controldata is None else controldata.stderr.strip())
            )
        new_major = postgres_major(self.bin_dir)
        self._initdb(*checksum_options(controldata.stdout, new_major))
        self._run(
            [
                str(self.bin_dir / "pg_upgrade"),
                "--old-bindir",
                str(self.source_bin_dir),
                "--new-bindir",
                str(self.bin_dir),
                "--old-datadir",
                str(self.source_data_dir),
                "--new-datadir",
                str(self.data_dir),
                "--username",
                "postgres",
                # pg_upgrade runs both servers on Unix sockets only, in --socketdir.
                "--old-port",
                str(find_free_port()),
                "--new-port",
                str(find_free_port()),
                "--socketdir",
                str(self.cluster_dir),
                # PostgresCluster sets wal_level on the command line, not in postgresql.conf;
                # an old server with a logical slot refuses to start below logical.
                "--old-options=-c wal_level=logical",
                f"--{self.transfer}",
                "--no-sync",  # throwaway cluster, as initdb's --no-sync
            ],
            what="pg_upgrade",
            timeout_s=self._start_timeout_s,
        )

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            shutil.rmtree(self.source_dir, ignore_errors=True)
