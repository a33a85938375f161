"""What ships: the wheel holds the product only, and the base install is what enqueue needs.

Builds the wheel from a copy of the source tree (so the build leaves nothing in
the checkout), reads its file list, and installs it without extras into a fresh
virtual environment: an application that only enqueues gets psycopg and orjson,
not Faust, aiokafka or an HTTP client, and a service command run there says
which extra to install instead of printing a traceback.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEV_ONLY_MODULES = ("gateway_sim", "devstack", "local_pipeline", "dev_runner", "delivery_audit")
SERVICE_ONLY_DISTRIBUTIONS = ("faust-streaming", "aiokafka", "httpx", "aiohttp", "httpcore")


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "zapstream"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", ".*_cache", ".dev"
        ),
    )
    out = tmp_path_factory.mktemp("dist")
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source)
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = out.glob("zapstream-*.whl")
    return found


@pytest.fixture(scope="module")
def base_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the wheel installed without extras; yields its bin directory."""
    env_dir = tmp_path_factory.mktemp("base-venv")
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    installed = _run(bin_dir / "python", "-m", "pip", "install", "-q", wheel)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    yield bin_dir


def test_wheel_ships_the_product_and_no_dev_tooling(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for expected in (
        "connectors/outbox/enqueue.py",
        "connectors/outbox/migrations/0001_outbox.sql",
        "connectors/cdc/relay.py",
        "connectors/sink/state_sink.py",
        "streams/kernel/contract.py",
        "streams/py.typed",
        "connectors/py.typed",
    ):
        assert expected in names, f"{expected} missing from {wheel.name}"
    shipped_dev = [
        n for n in names if n.startswith(("devtools/", "tests/")) or n.endswith(DEV_ONLY_MODULES)
    ]
    shipped_dev += [n for n in names for m in DEV_ONLY_MODULES if f"/{m}.py" in n]
    assert not shipped_dev, f"development tooling in the wheel: {sorted(set(shipped_dev))}"


def test_base_install_enqueues_without_service_dependencies(base_install: Path) -> None:
    imported = _run(
        base_install / "python",
        "-c",
        "from connectors.outbox import enqueue; from connectors.outbox.enqueue import "
        "enqueue as f, enqueue_async, InvalidIntent; from connectors.outbox.commands import "
        "cancel; from connectors.outbox.migrate import migrate; print(f.__name__)",
        cwd=base_install,  # not the checkout: import what is installed
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "enqueue"

    listed = _run(base_install / "python", "-m", "pip", "list", "--format=freeze")
    assert listed.returncode == 0, listed.stderr
    installed = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert {"psycopg", "orjson"} <= installed
    unwanted = installed.intersection(SERVICE_ONLY_DISTRIBUTIONS)
    assert not unwanted, f"the base install pulls service dependencies: {sorted(unwanted)}"


def test_service_command_in_base_install_names_the_extra(base_install: Path) -> None:
    ran = _run(base_install / "zapstream", "relay", cwd=base_install)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{ran.stderr}"
    assert "zapstream[service]" in lines[0] and "Traceback" not in ran.stderr
