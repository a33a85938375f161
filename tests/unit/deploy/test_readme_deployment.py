"""The README's Deployment section names only things that exist.

Every `zapstream ...` command it shows parses and prints its help; every `python -m
devtools...` tool prints its help; every repository path it names exists; every compose
service and Dockerfile target it runs exists. A renamed command or file breaks this test
before it breaks a user's upgrade.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.cli import build_parser, main
from devtools import compose_check as cc

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


DEPLOYMENT = _section("Deployment")


def _subcommand_paths() -> set[tuple[str, ...]]:
    """Every path of subcommands the CLI knows: ("relay",), ("outbox", "prune"), ..."""
    import argparse

    paths: set[tuple[str, ...]] = set()

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    paths.add((*prefix, name))
                    walk(sub, (*prefix, name))

    walk(build_parser(), ())
    return paths


KNOWN = _subcommand_paths()


def _named_commands() -> set[tuple[str, ...]]:
    """The longest known subcommand path after each ``zapstream `` in the section."""
    found = set()
    for match in re.finditer(r"(?<![\w./-])zapstream ((?:[a-z][a-z-]* ?){1,3})", DEPLOYMENT):
        words = tuple(match.group(1).split())
        known = [words[:n] for n in range(len(words), 0, -1) if words[:n] in KNOWN]
        if known:
            found.add(known[0])
    return found


NAMED = sorted(_named_commands())


def test_the_section_names_the_deployment_commands() -> None:
    expected = {
        ("db", "migrate"),
        ("topics", "ensure"),
        ("outbox", "prune"),
        ("outbox", "restream"),
        ("status",),
        ("doctor",),
    }
    assert expected <= set(NAMED), sorted(expected - set(NAMED))


@pytest.mark.parametrize("path", NAMED, ids=" ".join)
def test_each_named_command_prints_its_help(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*path, "--help"])
    assert exited.value.code == 0
    assert f"usage: zapstream {' '.join(path)}" in capsys.readouterr().out


TOOLS = sorted(set(re.findall(r"python -m (devtools\.[a-z0-9_]+)", DEPLOYMENT)))


def test_the_section_names_its_tools() -> None:
    assert {"devtools.lock_constraints", "devtools.k8s_rules"} <= set(TOOLS)


@pytest.mark.parametrize("module", TOOLS)
def test_each_named_tool_prints_its_help(module: str) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage:")


PATHS = sorted(
    {
        p.rstrip("/.,")
        for p in re.findall(
            r"`((?:k8s|devtools|\.env\.example|Dockerfile|constraints\.txt|docker-compose\.yml)[^`\s]*)`",
            DEPLOYMENT,
        )
    }
)


@pytest.mark.parametrize("path", PATHS)
def test_each_named_path_exists(path: str) -> None:
    assert (ROOT / path).exists(), path


def test_the_compose_services_and_image_targets_it_runs_exist() -> None:
    services = cc.services(cc.load())
    for name in re.findall(r"docker compose (?:exec|run --rm) ([a-z-]+)", DEPLOYMENT):
        assert name in services, name
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.M))
    for target in re.findall(r"--target ([a-z-]+)", DEPLOYMENT):
        assert target in targets, target
    for overlay in re.findall(r"kubectl apply -k (\S+)", DEPLOYMENT):
        assert (ROOT / overlay / "kustomization.yaml").exists(), overlay
