"""Cross-reference checks of ``docker-compose.yml`` that the compose-spec schema cannot make.

The schema (check-jsonschema's vendored compose-spec) checks each field's name and type; it
cannot see that a name used in one place is defined in another. :func:`problems` returns one
line per broken reference:

- ``depends_on`` names an existing service;
- every secret and config a service mounts is defined at the top level, and every ``file:``
  source exists in the repository;
- every zapstream service (built from the Dockerfile's ``zapstream`` target) runs a real
  ``zapstream`` subcommand, sets only variables some zapstream setting reads (a misspelt one
  makes the process exit 2), and mounts secrets named after such a variable (the files
  ``ZAPSTREAM_SECRETS_DIR`` holds are read by variable name);
- a service that serves ``/metrics`` binds it on every interface and is scraped by Prometheus,
  and every Prometheus target names an existing service and the port it serves.

Pure: it reads the parsed compose mapping and asks ``root`` only whether ``file:`` paths exist.
The YAML is loaded with PyYAML, so anchors, aliases and ``<<`` merges are already resolved:
:func:`environments` gives each service's final environment.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ZAPSTREAM_TARGET = "zapstream"
PROMETHEUS_CONFIG_TARGET = "/etc/prometheus/prometheus.yml"

MetricsPort = tuple[str, int, str]
METRICS_PORTS: dict[str, MetricsPort] = {
    "relay": ("ZAPSTREAM_RELAY_METRICS_PORT", 0, "ZAPSTREAM_RELAY_METRICS_BIND_LOCAL"),
    "worker": ("ZAPSTREAM_WORKER_WEB_PORT", 6066, "ZAPSTREAM_WORKER_WEB_BIND_LOCAL"),
    "sink": ("ZAPSTREAM_SINK_METRICS_PORT", 6067, "ZAPSTREAM_SINK_METRICS_BIND_LOCAL"),
    "lag-monitor": ("ZAPSTREAM_LAG_METRICS_PORT", 6068, "ZAPSTREAM_LAG_METRICS_BIND_LOCAL"),
}
"""Subcommand -> (port variable, its default (0: off), bind-local variable) of its /metrics."""

Compose = Mapping[str, Any]
CommandCheck = Callable[[list[str]], "str | None"]


def load(path: Path = COMPOSE) -> dict[str, Any]:
    """The compose file as a mapping, anchors and merge keys resolved."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a mapping")
    return data


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def services(compose: Compose) -> dict[str, dict[str, Any]]:
    return {name: _mapping(svc) for name, svc in _mapping(compose.get("services")).items()}


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's environment (either compose form) as strings; ``KEY`` alone maps to ``""``."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.partition("=") for item in env)
        return {key: value for key, _, value in pairs}
    return {str(k): "" if v is None else _scalar(v) for k, v in env.items()}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def environments(compose: Compose) -> dict[str, dict[str, str]]:
    """Every service's resolved environment, by service name."""
    return {name: environment(svc) for name, svc in services(compose).items()}


def is_zapstream(service: Mapping[str, Any]) -> bool:
    """Built from the Dockerfile's ``zapstream`` target (the image whose entrypoint is it)."""
    build = service.get("build")
    return isinstance(build, dict) and build.get("target") == ZAPSTREAM_TARGET


def command(service: Mapping[str, Any]) -> list[str]:
    raw = service.get("command") or []
    return shlex.split(raw) if isinstance(raw, str) else [str(part) for part in raw]


def mounts(service: Mapping[str, Any], kind: str) -> list[tuple[str, str]]:
    """(source, file name in the container) of each secret or config a service mounts."""
    found = []
    for item in service.get(kind) or []:
        if isinstance(item, str):
            found.append((item, item))
        else:
            source = str(item.get("source", ""))
            found.append((source, Path(str(item.get("target") or source)).name))
    return found


def _depends_on(service: Mapping[str, Any]) -> list[str]:
    deps = service.get("depends_on") or []
    return list(deps) if isinstance(deps, (list, dict)) else []


def metrics_port(service: Mapping[str, Any]) -> int:
    """The port a zapstream service serves /metrics on (0: none)."""
    argv = command(service)
    spec = METRICS_PORTS.get(argv[0]) if argv else None
    if spec is None:
        return 0
    variable, default, _ = spec
    value = environment(service).get(variable)
    return int(value) if value else default


def scrape_targets(compose: Compose) -> list[str]:
    """``host:port`` of every static target in the Prometheus configuration mounted."""
    configs = _mapping(compose.get("configs"))
    targets: list[str] = []
    for service in services(compose).values():
        for item in service.get("configs") or []:
            if not isinstance(item, dict) or item.get("target") != PROMETHEUS_CONFIG_TARGET:
                continue
            content = _mapping(configs.get(str(item.get("source")))).get("content", "")
            prometheus = yaml.safe_load(content) or {}
            for job in prometheus.get("scrape_configs") or []:
                for static in job.get("static_configs") or []:
                    targets.extend(str(t) for t in static.get("targets") or [])
    return targets


@functools.cache
def _cli_parser() -> argparse.ArgumentParser:
    from connectors.cli import build_parser

    return build_parser()


def cli_command_error(argv: list[str]) -> str | None:
    """Why ``zapstream ARGV`` is not a runnable command (argparse's words), or None."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
            _cli_parser().parse_args(argv)
    except SystemExit as exc:
        lines = out.getvalue().strip().splitlines()
        return lines[-1] if exc.code and lines else "prints help instead of running"
    return None


def known_variables() -> frozenset[str]:
    """Every variable a zapstream settings class reads (any prefix), plus ZAPSTREAM_SECRETS_DIR."""
    from connectors.startup import NOT_SETTINGS, env_names, settings_classes

    names = set(NOT_SETTINGS)
    for cls in settings_classes():
        for field_name in cls.model_fields:
            names.update(env_names(cls, field_name))
    return frozenset(names)


def problems(
    compose: Compose,
    root: Path = ROOT,
    *,
    command_error: CommandCheck = cli_command_error,
    known: Iterable[str] | None = None,
) -> list[str]:
    """One line per broken cross-reference in ``compose`` (empty: none)."""
    known_names = frozenset(known) if known is not None else known_variables()
    svcs = services(compose)
    found: list[str] = []

    for kind in ("secrets", "configs"):
        for name, spec in _mapping(compose.get(kind)).items():
            path = _mapping(spec).get("file")
            if path is not None and not (root / str(path)).is_file():
                found.append(f"{kind}.{name}: file {path} does not exist")

    for name, svc in svcs.items():
        for dep in _depends_on(svc):
            if dep not in svcs:
                found.append(f"{name}: depends_on {dep!r}, which is no service")
        for kind in ("secrets", "configs"):
            defined = _mapping(compose.get(kind))
            for source, _ in mounts(svc, kind):
                if source not in defined:
                    found.append(f"{name}: {kind} {source!r} is not defined at the top level")
        if is_zapstream(svc):
            found.extend(_zapstream_problems(name, svc, command_error, known_names))

    found.extend(_scrape_problems(compose, svcs))
    return found


def _zapstream_problems(
    name: str, svc: Mapping[str, Any], command_error: CommandCheck, known: frozenset[str]
) -> list[str]:
    found = []
    if "entrypoint" in svc:
        found.append(f"{name}: a zapstream service keeps the image's entrypoint (zapstream)")
    argv = command(svc)
    error = command_error(argv)
    if error is not None:
        found.append(f"{name}: `zapstream {' '.join(argv)}` is no zapstream command: {error}")
    env = environment(svc)
    for variable in sorted(env):
        if variable not in known:
            found.append(f"{name}: {variable} is read by no zapstream setting (exit 2)")
    for _, filename in mounts(svc, "secrets"):
        if filename not in known:
            found.append(f"{name}: secret file {filename} is named after no zapstream setting")
    spec = METRICS_PORTS.get(argv[0]) if argv else None
    if spec is not None and metrics_port(svc) and env.get(spec[2], "true").lower() != "false":
        found.append(f"{name}: {spec[2]} is not false: /metrics only on 127.0.0.1")
    return found


def _scrape_problems(compose: Compose, svcs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    found = []
    targets = scrape_targets(compose)
    for target in targets:
        host, _, port = target.rpartition(":")
        svc = svcs.get(host)
        if svc is None:
            found.append(f"prometheus: target {target} names no service")
        elif is_zapstream(svc) and str(metrics_port(svc)) != port:
            found.append(
                f"prometheus: target {target}: {host} serves /metrics on "
                f"{metrics_port(svc) or 'no port'}"
            )
    for name, svc in svcs.items():
        served = metrics_port(svc) if is_zapstream(svc) else 0
        if served and f"{name}:{served}" not in targets:
            found.append(f"prometheus: {name} serves /metrics on {served} but is not scraped")
    return found
