"""The deployment guide names only things that exist.

``docs/guides/deployment.md`` is what an operator follows to install and upgrade zapstream.
Every `zapstream ...` command it shows parses and prints its help; every `python -m
devtools...` tool prints its help; every `make` target it names is a target of the Makefile;
every environment variable it names is read by a zapstream settings class; every repository
path it names exists; every compose service, Dockerfile target and kustomize overlay it runs
exists. A renamed command, setting or file breaks this test before it breaks a user's upgrade.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.cli import build_parser, main
from devtools.deploy import compose_check as cc

ROOT = Path(__file__).resolve().parents[3]
GUIDE_PATH = ROOT / "docs" / "guides" / "deployment.md"
GUIDE = GUIDE_PATH.read_text()


def _subcommand_paths() -> set[tuple[str, ...]]:
    """Every path of subcommands the CLI knows: ("relay",), ("outbox", "prune"), ..."""
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
    """The longest known subcommand path after each ``zapstream `` in the guide."""
    found = set()
    for match in re.finditer(r"(?<![\w./-])zapstream ((?:[a-z][a-z-]* ?){1,3})", GUIDE):
        words = tuple(match.group(1).split())
        known = [words[:n] for n in range(len(words), 0, -1) if words[:n] in KNOWN]
        if known:
            found.add(known[0])
    return found


NAMED = sorted(_named_commands())


def test_the_guide_names_the_deployment_commands() -> None:
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


def test_every_zapstream_command_in_a_code_block_is_known() -> None:
    """A command line in a shell block (``zapstream outbox prune ...``, ``docker compose run
    --rm migrate jobs list``) starts with a known subcommand."""
    blocks = re.findall(r"```sh\n(.*?)```", GUIDE, re.S)
    unknown = []
    for block in blocks:
        for line in block.splitlines():
            match = re.search(r"(?:^|exec \S+ -- |run --rm migrate )zapstream ([a-z].*)", line)
            if match is None:
                match = re.search(r"run --rm migrate ([a-z].*)", line)
            if match is None:
                continue
            words = tuple(match.group(1).split("#")[0].split())
            if not any(words[:n] in KNOWN for n in range(1, len(words) + 1)):
                unknown.append(line.strip())
    assert not unknown, unknown


TOOLS = sorted(set(re.findall(r"python -m (devtools\.[a-z0-9_.]+[a-z0-9_])", GUIDE)))


def test_the_guide_names_its_tools() -> None:
    assert {"devtools.deploy.lock_constraints", "devtools.deploy.k8s_rules"} <= set(TOOLS)


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


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-zA-Z][\w-]*):(?!=)", text, re.M))


MAKE_TARGETS = sorted(set(re.findall(r"`make ([a-z][\w-]*)", GUIDE)))


def test_the_guide_names_its_make_targets() -> None:
    assert {"test", "deploy-check"} <= set(MAKE_TARGETS), MAKE_TARGETS


@pytest.mark.parametrize("target", MAKE_TARGETS)
def test_each_named_make_target_exists(target: str) -> None:
    assert target in _make_targets(), f"`make {target}`: no such target in the Makefile"


def _settings_variables() -> set[str]:
    """Every variable some zapstream settings class reads (``ZAPSTREAM_*``, ``STACKZAP_*``,
    ``ZAP_*``, ``META_*``), plus those read outside the settings classes."""
    from connectors.startup import NOT_SETTINGS, env_names, settings_classes

    names = set(NOT_SETTINGS)
    for cls in settings_classes():
        for field_name in cls.model_fields:
            names.update(env_names(cls, field_name))
    return names


# A variable in full: a prefix, then words; `ZAPSTREAM_KAFKA_SSL_*FILE` (a pattern) and
# `ZAPSTREAM_*` (the family) end in `_` or `*` and are not names.
_VARIABLE = re.compile(r"(?<![\w$])((?:ZAPSTREAM|STACKZAP|ZAP|META)_[A-Z0-9_]*[A-Z0-9])(?![\w*])")
VARIABLES = sorted(set(_VARIABLE.findall(GUIDE)))


def test_the_guide_names_settings() -> None:
    assert {"ZAPSTREAM_DATABASE_URL", "ZAPSTREAM_KAFKA_BROKERS"} <= set(VARIABLES), VARIABLES


@pytest.mark.parametrize("variable", VARIABLES)
def test_each_named_variable_is_a_setting(variable: str) -> None:
    assert variable in _settings_variables(), f"{variable}: no zapstream setting reads it"


PATH_PREFIXES = (
    "k8s",
    "devtools",
    "docs",
    "bench",
    "tests",
    "connectors",
    "streams",
    ".env.example",
    "Dockerfile",
    "Makefile",
    "constraints.txt",
    "docker-compose.yml",
    "pyproject.toml",
)
PATHS = sorted(
    {
        p.rstrip("/.,")
        for p in re.findall(
            r"`((?:" + "|".join(re.escape(p) for p in PATH_PREFIXES) + r")(?:/[^`\s]*)?)`",
            GUIDE,
        )
    }
)


def test_the_guide_names_paths() -> None:
    assert {"Dockerfile", "docker-compose.yml", "k8s/base/topics.yaml"} <= set(PATHS), PATHS


@pytest.mark.parametrize("path", PATHS)
def test_each_named_path_exists(path: str) -> None:
    assert (ROOT / path).exists(), path


def test_the_compose_services_and_image_targets_it_runs_exist() -> None:
    services = cc.services(cc.load())
    ran = re.findall(r"docker compose (?:exec|run --rm) ([a-z-]+)", GUIDE)
    assert ran, "the guide shows no docker compose command"
    for name in ran:
        assert name in services, name
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.M))
    for target in re.findall(r"--target ([a-z-]+)", GUIDE):
        assert target in targets, target
    overlays = re.findall(r"kubectl apply -k (\S+)", GUIDE)
    assert overlays, "the guide shows no kubectl apply -k"
    for overlay in overlays:
        assert (ROOT / overlay / "kustomization.yaml").exists(), overlay


def test_the_kubernetes_objects_it_names_are_deployed() -> None:
    """Each object the guide names (a Deployment, Job, CronJob or ConfigMap by its name, or
    ``deploy/<name>`` in a command) is declared in k8s/base or a component."""
    manifests = "\n".join(
        p.read_text() for p in (ROOT / "k8s").rglob("*.yaml") if "overlays" not in p.parts
    )
    # An object's metadata name, or a kustomize generator's (`- name: zapstream-config`).
    declared = set(re.findall(r"^\s{2}(?:- )?name: (zapstream-[a-z-]+)$", manifests, re.M))
    named = set(re.findall(r"(?:deploy|job)/(zapstream-[a-z-]+)", GUIDE))
    named |= set(re.findall(r"(?:Deployments?|Job|CronJob|ConfigMap) `(zapstream-[a-z-]+)`", GUIDE))
    assert named, "the guide names no Kubernetes object"
    assert named <= declared, sorted(named - declared)
