"""A throwaway PgBouncer in transaction pooling mode, in front of a throwaway PostgreSQL.

Applications often reach PostgreSQL through PgBouncer with ``pool_mode=transaction``:
each transaction may run on another server connection, so nothing may outlive a
transaction on the server (session settings, advisory locks, server-side prepared
statements; Debian's PgBouncer 1.18 does not track prepared statements). The tests run
the application API through this one to prove it keeps to that
(docs/guides/application.md, "Through PgBouncer").

Debian's ``pgbouncer`` package (``make setup`` installs it) brings the binary; its
system service is not used. PgBouncer refuses to run as root, so when we are root it
runs as the ``postgres`` OS user (``-u postgres``), like the clusters. Authentication is
``trust`` for the roles named in ``users`` (PgBouncer still requires each to be in its
``auth_file``); the cluster trusts 127.0.0.1 too.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psycopg

from devtools.stack.devstack import DevStackError, ManagedProcess, find_free_port
from devtools.stack.lifecycle import StartStop

__all__ = ["PgBouncer", "pgbouncer_binary"]

_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> Path:
    """Debian's ``pgbouncer`` (``make setup`` installs the package)."""
    found = shutil.which("pgbouncer")
    if found:
        return Path(found)
    for candidate in _CANDIDATES:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    raise DevStackError("no pgbouncer binary: install Debian's pgbouncer package (make setup)")


class PgBouncer(StartStop):
    """PgBouncer on a free 127.0.0.1 port, ``pool_mode=transaction``, forwarding every
    database name to the PostgreSQL on ``postgres_port``.

    ``pool_size`` server connections per (database, user) pair serve any number of
    clients: with fewer server connections than clients, consecutive transactions of one
    client land on different server connections, which is what makes session state or a
    prepared statement fail.
    """

    def __init__(
        self,
        postgres_port: int,
        *,
        users: Sequence[str] = ("postgres",),
        pool_size: int = 5,
        port: int | None = None,
        base_dir: Path | None = None,
    ) -> None:
        self.postgres_port = postgres_port
        self.users = tuple(users)
        self.pool_size = pool_size
        self._port = port if port is not None else find_free_port()
        self._parent_dir = base_dir
        self._dir: Path | None = None
        self._process: ManagedProcess | None = None

    def __repr__(self) -> str:
        return f"<PgBouncer port={self._port} -> {self.postgres_port}>"

    @property
    def port(self) -> int:
        return self._port

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self._port}/{dbname}"

    @property
    def log_path(self) -> Path:
        if self._dir is None:
            raise DevStackError("PgBouncer is not started")
        return self._dir / "pgbouncer.log"

    def start(self) -> None:
        """Write the configuration, start PgBouncer and wait until a query goes through it."""
        if self._dir is not None:
            raise DevStackError(f"{self!r} is already started")
        binary = pgbouncer_binary()
        self._dir = Path(tempfile.mkdtemp(prefix="zapstream-pgbouncer-", dir=self._parent_dir))
        try:
            config = self._write_config(self._dir)
            args = [str(binary)]
            if os.geteuid() == 0:
                args += ["-u", "postgres"]  # "PgBouncer should not run as root"
                user = pwd.getpwnam("postgres")
                for path in (self._dir, *self._dir.iterdir()):
                    os.chown(path, user.pw_uid, user.pw_gid)
            self._process = ManagedProcess(
                [*args, str(config)], log_path=self._dir / "pgbouncer.log", name="pgbouncer"
            )
            self._process.start()
            self._process.wait_for_log(r"listening on 127\.0\.0\.1:\d+", timeout_s=15)
            with psycopg.connect(self.dsn(), connect_timeout=10) as conn:
                conn.execute("SELECT 1")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop PgBouncer (idempotent) and remove its directory."""
        if self._process is not None:
            self._process.stop()
            self._process = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def log_tail(self, n: int = 40) -> str:
        return self._process.log_tail(n) if self._process is not None else ""

    def _write_config(self, directory: Path) -> Path:
        userlist = directory / "userlist.txt"
        userlist.write_text("".join(f'"{user}" ""\n' for user in self.users))
        config = directory / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host=127.0.0.1 port={self.postgres_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self._port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {userlist}",
                    "pool_mode = transaction",
                    f"default_pool_size = {self.pool_size}",
                    "max_client_conn = 500",
                    "server_reset_query =",
                    "ignore_startup_parameters = extra_float_digits",
                    "",
                ]
            )
        )
        return config
