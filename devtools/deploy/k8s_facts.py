"""What the Kubernetes manifests must agree with, as JSON for ``devtools/deploy/manifest_check.py``.

The checker runs in the deployment tools' venv (``.venv-deploy-tools``), which cannot import
zapstream (faust-streaming pins an older click than check-jsonschema needs), so the project
venv computes these facts and hands them over:

- ``topics``: every topic ``zapstream topics ensure`` creates (name, partitions, configs);
- ``commands``: every ``zapstream`` subcommand path (``["db", "migrate"]``, ``["relay"]``, ...);
- ``env_names``: every environment variable a settings class reads (a ``ZAPSTREAM_*`` one that
  none reads makes a deployable exit 2), plus ``ZAPSTREAM_SECRETS_DIR``.

    .venv/bin/python -m devtools.deploy.k8s_facts > /tmp/facts.json
    .venv-deploy-tools/bin/python devtools/deploy/manifest_check.py k8s/overlays/prod \
        --facts /tmp/facts.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

DEFAULT_PARTITIONS = 12


def _command_paths(parser: argparse.ArgumentParser, prefix: list[str]) -> Iterator[list[str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _command_paths(sub, [*prefix, name])
            return
    yield prefix


def commands() -> list[list[str]]:
    """Every runnable ``zapstream`` subcommand, as the words that name it."""
    from connectors.cli import build_parser

    return list(_command_paths(build_parser(), []))


def env_names() -> list[str]:
    """Every environment variable some settings class reads, and ZAPSTREAM_SECRETS_DIR."""
    from connectors import startup

    names = set(startup.NOT_SETTINGS)
    for cls in startup.settings_classes():
        for field_name in cls.model_fields:
            names.update(startup.env_names(cls, field_name))
    return sorted(names)


def topics(partitions: int = DEFAULT_PARTITIONS) -> list[dict[str, Any]]:
    """The topics ``zapstream topics ensure`` creates with this partition count."""
    from streams.kernel.contract import topic_specs

    return [
        {"name": s.name, "partitions": s.partitions, "configs": dict(s.configs)}
        for s in topic_specs(partitions)
    ]


def facts(partitions: int = DEFAULT_PARTITIONS) -> dict[str, Any]:
    return {"topics": topics(partitions), "commands": commands(), "env_names": env_names()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    args = parser.parse_args(argv)
    json.dump(facts(args.partitions), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
