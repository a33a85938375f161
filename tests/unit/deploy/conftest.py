"""The deployment validators, from their own venv (``.venv-deploy-tools``, made by ``make setup``).

check-jsonschema and hadolint cannot live in the project's ``.venv`` (check-jsonschema needs a
newer click than faust-streaming allows), so the tests run them by path. A missing tool fails
the test with the command that installs it: it never skips.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOOLS_BIN = ROOT / ".venv-deploy-tools" / "bin"


def _tool(name: str) -> str:
    path = TOOLS_BIN / name
    if not path.exists():
        pytest.fail(
            f"{path} is missing: run `make setup` (it installs devtools/deploy-tools.txt "
            "into .venv-deploy-tools)",
            pytrace=False,
        )
    return str(path)


@pytest.fixture(scope="session")
def deploy_tool() -> Callable[[str], str]:
    """``deploy_tool("hadolint")``: the tool's path, or the test fails naming `make setup`."""
    return _tool
