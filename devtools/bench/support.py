"""Shared pieces of ``make bench``: figures, /proc readings, percentiles, set-based outbox fills.

A :class:`Figure` is one row of the bench table: what was measured, the value,
the comparison measured in the same run (or a fixed earlier figure, labelled so)
and the target with its verdict.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(slots=True)
class Figure:
    """One row of the table. ``target`` is a human text; ``passed`` None means no target."""

    section: str
    what: str
    value: str
    comparison: str = ""
    target: str = ""
    passed: bool | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "" if self.passed is None else ("PASS" if self.passed else "MISS")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, in seconds (from /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # without guest time, which user time already counts
    return (total - idle) / _CLOCK_TICKS, total / _CLOCK_TICKS


def proc_status_mib(pid: int, field: str) -> float:
    """A ``kB`` field of /proc/<pid>/status (VmHWM, VmRSS) in MiB; NaN if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending sequence (q in 0..1)."""
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values))) - 1))
    return sorted_values[index]


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f} ms"


def wait_until(
    condition: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float = 0.05
) -> float:
    """Poll ``condition`` until true; return the monotonic time it became true."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: {what} did not happen within {timeout_s:g} s")
        time.sleep(interval_s)


# --- filling the outbox ---------------------------------------------------------------

# Row i: conversation i % C, sequence i // C, instance inst-(conversation % I): the
# conventions of devtools.stack.delivery_audit (the key is in the text, so arrivals trace back).
_FILL = """
INSERT INTO outbox_jobs (instance_id, payload, idempotency_key)
SELECT 'inst-' || lpad(((g %% %(c)s) %% %(i)s)::text, 2, '0'),
       jsonb_build_object(
           'type', 'text',
           'to', '+55 11 9' || lpad((g %% %(c)s)::text, 8, '0'),
           'text', 'Your zapstream demo message [' || %(run)s || ':inst-'
                   || lpad(((g %% %(c)s) %% %(i)s)::text, 2, '0') || ':'
                   || (g %% %(c)s) || ':' || (g / %(c)s) || ']'),
       %(run)s || ':inst-' || lpad(((g %% %(c)s) %% %(i)s)::text, 2, '0') || ':'
           || (g %% %(c)s) || ':' || (g / %(c)s)
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""


def demo_key_of(run: str, i: int, *, conversations: int, instances: int) -> str:
    conversation = i % conversations
    return f"{run}:inst-{conversation % instances:02d}:{conversation}:{i // conversations}"


def fill_outbox(
    dsn: str,
    *,
    run: str,
    start: int,
    count: int,
    batch: int = 500,
    conversations: int = 2_000,
    instances: int = 20,
) -> str:
    """Insert rows ``start .. start+count-1`` set-based, ``batch`` rows per transaction.

    Returns ``pg_current_wal_insert_lsn()`` after the last commit (text): the end of
    the last commit record. Not ``pg_current_wal_lsn()``, the write position: with
    ``synchronous_commit=off`` (the throwaway cluster) it can lag behind commits the
    WAL writer has not flushed yet, and the slot can confirm past it before the relay
    has even received them.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        for lo in range(start, start + count, batch):
            hi = min(start + count, lo + batch) - 1
            params = {"run": run, "lo": lo, "hi": hi, "c": conversations, "i": instances}
            conn.execute(_FILL, params)
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def slot_confirmed(dsn: str, slot: str, lsn: str) -> bool:
    """Whether ``slot``'s confirmed_flush_lsn reached ``lsn``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (lsn, slot),
        ).fetchone()
    return bool(row and row[0])
