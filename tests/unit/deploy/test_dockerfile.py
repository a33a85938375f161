"""The Dockerfile passes hadolint, runs as a numeric non-root user, installs what
constraints.txt pins, and its build context holds what it copies; all without a Docker engine.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.deploy import dockerfile_check as dc

ROOT = dc.ROOT
TEXT = dc.DOCKERFILE.read_text()
STAGES = dc.stages(TEXT)
TARGETS = ("zapstream", "simulator")


def _hadolint(tool: Callable[[str], str], path: Path) -> subprocess.CompletedProcess[str]:
    # No --ignore and no config file: the only exceptions allowed are inline
    # `# hadolint ignore=DLxxxx` comments with their reason, in the Dockerfile itself.
    return subprocess.run(
        [tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )


def test_hadolint_passes(deploy_tool: Callable[[str], str]) -> None:
    result = _hadolint(deploy_tool, dc.DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_hadolint_exception_says_why() -> None:
    lines = TEXT.splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore=" in line:
            assert number > 0 and lines[number - 1].strip().startswith("#"), line


BROKEN = [
    ("latest base", ("FROM python:3.11-slim-bookworm AS builder", "FROM python:latest AS builder"),
     "DL3007"),
    ("root last", ('ENTRYPOINT ["zapstream"]', 'USER root\nENTRYPOINT ["zapstream"]'), "DL3002"),
    ("apt-get unpinned",
     ("WORKDIR /app\n", "WORKDIR /app\nRUN apt-get update && apt-get install -y curl\n"),
     "DL3008"),
    ("pip unpinned", ("setuptools==80.9.0", "setuptools"), "DL3013"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "change", "rule"), BROKEN, ids=[b[0] for b in BROKEN])
def test_hadolint_refuses_a_broken_copy(
    deploy_tool: Callable[[str], str], tmp_path: Path, what: str, change: tuple[str, str], rule: str
) -> None:
    old, new = change
    assert old in TEXT, what
    broken = tmp_path / "Dockerfile"
    broken.write_text(TEXT.replace(old, new, 1))
    result = _hadolint(deploy_tool, broken)
    assert result.returncode != 0
    assert rule in result.stdout, result.stdout


def test_the_default_target_is_zapstream_as_its_entrypoint() -> None:
    assert STAGES[-1].name == "zapstream"
    assert dc.exec_form(dc.effective(STAGES, "zapstream", "ENTRYPOINT")) == ["zapstream"]
    simulator = dc.exec_form(dc.effective(STAGES, "simulator", "ENTRYPOINT"))
    assert simulator == ["python", "-m", "devtools.simulator.gateway_sim"]


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_runs_as_a_numeric_non_root_user(target: str) -> None:
    user = dc.effective(STAGES, target, "USER")
    assert not dc.runs_as_root(user), user
    assert user is not None and all(part.isdigit() for part in user.split(":")), user


@pytest.mark.parametrize(
    ("user", "root"),
    [(None, True), ("root", True), ("0", True), ("0:0", True), ("root:staff", True),
     ("10001", False), ("10001:10001", False), ("zapstream", False)],
)  # fmt: skip
def test_root_is_recognised(user: str | None, root: bool) -> None:
    assert dc.runs_as_root(user) is root


def test_a_user_is_inherited_from_the_stage_built_from() -> None:
    stages = dc.stages("FROM a AS base\nUSER 10001\nFROM base AS app\nRUN true\nFROM a AS other\n")
    assert dc.effective(stages, "app", "USER") == "10001"
    assert dc.effective(stages, "other", "USER") is None


def test_the_runtime_base_is_pinned_slim_python_3_11() -> None:
    for stage in STAGES:
        if stage.base not in {s.name for s in STAGES}:
            assert stage.base.startswith("python:3.11-slim"), stage.base


def test_the_dependencies_come_from_constraints_txt() -> None:
    """Every pip install into the venv installs constraints.txt's pins or is bound by them;
    the only other install is the pinned build backend, in the builder's own Python."""
    builder = next(stage for stage in STAGES if stage.name == "builder")
    copies = builder.all("COPY")
    assert any(c.split()[0] == "constraints.txt" for c in copies)
    installs = dc.pip_installs(builder)
    into_venv = [words for words in installs if words[0].startswith("/opt/venv/")]
    assert len(into_venv) >= 2
    for words in into_venv:
        pairs = set(zip(words, words[1:], strict=False))
        assert {
            ("--constraint", "constraints.txt"),
            ("--requirement", "constraints.txt"),
        } & pairs, words
    assert any("zapstream[service]" in words for words in into_venv)
    for words in installs:
        if words not in into_venv:
            packages = [w for w in words[2:] if not w.startswith("-")]
            assert packages and all("==" in p for p in packages), words
    assert "pip check" in " ".join(builder.all("RUN"))
    runtime = next(stage for stage in STAGES if stage.name == "runtime")
    assert any("--from=builder /opt/venv /opt/venv" in c for c in runtime.all("COPY"))


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last matching pattern wins; ``!`` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        bare = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
            ignored = not negate
    return ignored


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for stage in STAGES:
        for args in stage.all("COPY"):
            if args.startswith("--from"):
                continue
            sources.extend(args.split()[:-1])
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source.rstrip("/"), patterns), source
    for secretish in (".env", ".env.example", ".venv/bin/python", ".git/config", "tests/x.py"):
        assert _ignored(secretish, patterns), secretish


def test_the_simulator_needs_no_other_devtools_module() -> None:
    """The simulator image copies devtools/simulator/gateway_sim.py alone: it imports no sibling."""
    tree = ast.parse((ROOT / "devtools" / "simulator" / "gateway_sim.py").read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, "relative import"
            imported.add(node.module)
    assert imported and not any(name.split(".")[0] == "devtools" for name in imported), imported
    simulator = next(stage for stage in STAGES if stage.name == "simulator")
    assert any("devtools/simulator/gateway_sim.py" in c for c in simulator.all("COPY"))
