"""What each zapstream deployable reads, for the tests of docker-compose.yml and k8s/."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOOLS_BIN = ROOT / ".venv-deploy-tools" / "bin"

SETTINGS_PREFIXES = ("ZAPSTREAM_", "STACKZAP_", "ZAP_", "META_")
"""Every variable a zapstream settings class may read (docs/reference/settings.md)."""


def settings_of(argv: list[str]) -> Any:
    """Build the settings the command builds in ``main()`` (from the current environment)."""
    from connectors.cdc.settings import RelaySettings
    from connectors.console.settings import ConsoleSettings
    from connectors.sink.settings import SinkSettings
    from connectors.webhook.settings import WebhookSettings
    from streams.kernel.settings import KafkaSettings, LagMonitorSettings, PostgresSettings
    from streams.worker_settings import WorkerSettings

    build: dict[str, Callable[[], Any]] = {
        "db migrate": lambda: (PostgresSettings(), RelaySettings()),
        "topics ensure": KafkaSettings,
        "relay": RelaySettings,
        "worker": WorkerSettings,
        "sink": SinkSettings,
        "webhook": WebhookSettings,
        "lag-monitor": LagMonitorSettings,
        "console": ConsoleSettings,
        "outbox prune": PostgresSettings,
    }
    command = " ".join(argv[:2]) if argv[:1] == ["outbox"] else " ".join(argv)
    return build[command]()


def isolate_environment(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> None:
    """Only ``env`` of the settings' variables is set, as in a fresh container."""
    for name in list(os.environ):
        if name.startswith(SETTINGS_PREFIXES):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def write_secret_files(directory: Path, names: Iterator[str] | list[str]) -> dict[str, str]:
    """A plausible value for each secret file a deployable mounts; returns them."""
    values = {
        "ZAPSTREAM_DATABASE_URL": "postgresql://zapstream:pw@db.example:5432/app",
        "ZAPSTREAM_CONSOLE_TOKENS": (
            '{"tok-0123456789abcdef0123456789abcdef": {"operator": "o", "role": "admin"}}'
        ),
        # At least 32 characters, as the webhook and the worker require.
        "ZAPSTREAM_WEBHOOK_SECRET": "demo-webhook-secret-0123456789abcdef",
        "ZAPSTREAM_REFERENCE_KEY": "demo-reference-key-0123456789abcdef",
    }
    written = {}
    for name in names:
        written[name] = values.get(name, f"demo-{name.lower()}")
        (directory / name).write_text(written[name])
    return written


def deploy_tool_path(name: str) -> str:
    """A deployment validator from ``.venv-deploy-tools``; the test fails naming `make setup`."""
    path = TOOLS_BIN / name
    if not path.exists():
        pytest.fail(
            f"{path} is missing: run `make setup` (it installs devtools/deploy/deploy-tools.txt "
            "into .venv-deploy-tools)",
            pytrace=False,
        )
    return str(path)
