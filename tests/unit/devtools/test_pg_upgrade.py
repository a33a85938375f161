"""devtools.stack.pg_upgrade: the new cluster's initdb matches the old one's checksums."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.stack.devstack import DevStackError
from devtools.stack.pg_upgrade import UpgradedCluster, checksum_options

CONTROLDATA = """pg_control version number:            1300
Database cluster state:               shut down
Data page checksum version:           {version}
Mock authentication nonce:            0f3c
"""


@pytest.mark.parametrize(
    ("version", "new_major", "options"),
    [
        (0, 18, ["--no-data-checksums"]),  # 18's initdb enables them by default
        (0, 17, ["--no-data-checksums"]),
        (0, 16, []),  # no such option before 17, and none is the default
        (1, 18, ["--data-checksums"]),
        (1, 16, ["--data-checksums"]),
    ],
)
def test_checksum_options_match_the_old_cluster(
    version: int, new_major: int, options: list[str]
) -> None:
    assert checksum_options(CONTROLDATA.format(version=version), new_major) == options


def test_controldata_without_the_checksum_line_is_refused() -> None:
    with pytest.raises(DevStackError, match="Data page checksum version"):
        checksum_options("Database cluster state: shut down\n", 18)


def test_an_unknown_transfer_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="transfer='swap'"):
        UpgradedCluster(
            tmp_path,
            tmp_path,
            bin_dir=tmp_path,
            transfer="swap",
        )
