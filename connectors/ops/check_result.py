"""One line of ``zapstream doctor``: a check's name, OK/FAIL/SKIP, what was found, the remedy.

A module of its own so the doctor's check groups (:mod:`connectors.ops.doctor`,
:mod:`connectors.ops.failover_checks`) share it without importing each other.
"""

from __future__ import annotations

import dataclasses
import enum


class Status(enum.StrEnum):
    OK = "OK"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    """What one check found; ``remedy`` says what to do when it failed."""

    check: str
    status: Status
    detail: str
    remedy: str = ""

    def line(self) -> str:
        text = f"{self.status.value:<4} {self.check}: {self.detail}"
        return f"{text} -> {self.remedy}" if self.remedy else text
