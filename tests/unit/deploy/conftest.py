"""The deployment validators, from their own venv (``.venv-deploy-tools``, made by ``make setup``).

check-jsonschema and hadolint cannot live in the project's ``.venv`` (check-jsonschema needs a
newer click than faust-streaming allows), so the tests run them by path. A missing tool fails
the test with the command that installs it: it never skips.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.unit.deploy.deployables import deploy_tool_path


@pytest.fixture(scope="session")
def deploy_tool() -> Callable[[str], str]:
    """``deploy_tool("hadolint")``: the tool's path, or the test fails naming `make setup`."""
    return deploy_tool_path
