"""The public demo secrets of .env.example stop every zapstream command (exit 2) unless
ZAPSTREAM_ALLOW_DEMO_SECRETS=1."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.cli import main
from connectors.demo_secrets import demo_secret_names

DEMO_TOKENS = '{"demo-admin-token-change-me": {"operator": "demo", "role": "admin"}}'


def test_a_demo_value_in_a_variable_or_a_secret_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "ZAPSTREAM_CONSOLE_TOKENS").write_text(DEMO_TOKENS)
    (tmp_path / "STACKZAP_API_KEY").write_text("a-real-key-0123456789")
    env = {
        "ZAPSTREAM_SECRETS_DIR": str(tmp_path),
        "ZAPSTREAM_WEBHOOK_SECRET": "demo-webhook-secret-change-me",
        "ZAPSTREAM_CONSOLE_PORT": "change-me",  # not a secret's name
    }
    assert demo_secret_names(env) == ["ZAPSTREAM_CONSOLE_TOKENS", "ZAPSTREAM_WEBHOOK_SECRET"]


def test_the_cli_refuses_in_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ZAPSTREAM_CONSOLE_TOKENS").write_text(DEMO_TOKENS)
    monkeypatch.setenv("ZAPSTREAM_SECRETS_DIR", str(tmp_path))
    monkeypatch.delenv("ZAPSTREAM_ALLOW_DEMO_SECRETS", raising=False)
    assert main(["db", "roles", "--print"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "zapstream: ZAPSTREAM_CONSOLE_TOKENS holds a public demo value from .env.example: "
        "replace it with your own secret, or set ZAPSTREAM_ALLOW_DEMO_SECRETS=1 for a local "
        "demo only"
    ]


def test_allowed_explicitly_for_a_local_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ZAPSTREAM_CONSOLE_TOKENS").write_text(DEMO_TOKENS)
    monkeypatch.setenv("ZAPSTREAM_SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv("ZAPSTREAM_ALLOW_DEMO_SECRETS", "1")
    assert main(["db", "roles", "--print"]) == 0
    assert "CREATE ROLE zapstream_webhook NOLOGIN" in capsys.readouterr().out
