"""Huge outbox rows against the relay's memory, on real processes (issue 15, acceptance 3).

A valid text intent whose JSONB payload carries 8 MB, then 64 MB, of extra data, followed by
50 good rows: the good rows reach the gateway once each and in order, each big row ends
INVALID in ``outbox_jobs`` with a reason naming its size and ``ZAPSTREAM_RELAY_MAX_RECORD_BYTES``,
the relay's slot is confirmed past them, and the relay's peak RSS (``VmHWM``) stays under
the 256 MiB its Kubernetes manifest allows. The relay checks a column's size before it parses
it (``connectors/cdc/pgoutput.py``, ``outbox_rows.oversized_rejection``).

Prints, per row: the payload size, the relay's VmHWM before and after, and the slot positions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from devtools.stack.local_pipeline import LocalPipeline
from tests.integration.support import (
    Arrivals,
    count_rows,
    enqueue_conversations,
    wait_for_status,
    wait_until,
)

pytestmark = pytest.mark.integration

MANIFEST_LIMIT_MIB = 256
"""The relay's memory limit in k8s/base (``resources.limits.memory: 256Mi``)."""
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4) as p:
        p.start_worker()
        yield p


def _vm_mib(pid: int, field: str = "VmHWM") -> float:
    """A memory figure of the process from /proc/<pid>/status, in MiB: ``VmHWM`` is the peak
    resident set size, ``VmRSS`` the current one."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _slot_confirmed(dsn: str) -> int:
    return count_rows(
        dsn,
        "SELECT coalesce(confirmed_flush_lsn - '0/0', 0)::bigint FROM pg_replication_slots "
        "WHERE slot_name = 'zapstream_outbox'",
    )


def _insert_big_row(dsn: str, key: str, extra_bytes: int, shape: str) -> tuple[int, int, int]:
    """One valid text intent whose payload carries ``extra_bytes`` of extra data.

    ``objects``: an array of small objects (``{"k": 7}``), the shape that costs a JSON parser
    the most Python objects per byte (~30: 8 MB took the relay to 292 MiB when it parsed
    payloads). ``string``: one long string, as cheap as it gets for PostgreSQL to store and
    decode (an array of 64 MB of objects takes it ~20 s on a loaded machine); the relay,
    which never parses either, pays the same for both. Returns (job id, payload text bytes
    as PostgreSQL prints it, WAL position after the commit).
    """
    if shape == "objects":
        element = '{"k": 7}'
        extra = "[" + ", ".join([element] * (extra_bytes // (len(element) + 2))) + "]"
    else:
        extra = '"' + "x" * extra_bytes + '"'
    payload = '{"type": "text", "to": "+5511987650000", "text": "big row", "extra": ' + extra + "}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) "
            "VALUES (%s, %s::jsonb, %s) RETURNING id, octet_length(payload::text)",
            ("inst-00", payload, key),
        ).fetchone()
        assert row is not None
        lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
        assert lsn is not None
    return int(row[0]), int(row[1]), int(lsn[0])


def _job(dsn: str, job_id: int) -> tuple[str, str | None]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, last_error FROM outbox_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return str(row[0]), row[1]


@pytest.mark.parametrize(("extra_mb", "shape"), [(8, "objects"), (64, "string")])
def test_a_huge_payload_row_ends_invalid_and_the_relay_stays_under_its_memory_limit(
    pipeline: LocalPipeline, extra_mb: int, shape: str
) -> None:
    relay = pipeline.start_relay(f"relay-large-{extra_mb}")
    try:
        hwm_before = _vm_mib(relay.pid)
        run = uuid.uuid4().hex[:8]
        started = time.monotonic()
        big_id, payload_bytes, big_lsn = _insert_big_row(
            pipeline.dsn, f"big-{run}", extra_mb * MIB, shape
        )
        keys = enqueue_conversations(pipeline.dsn, run, messages=50, conversations=5)
        report = Arrivals(pipeline).wait_for(keys, timeout_s=180)
        wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)
        # Settled either way (INVALID as documented; before the size check it was sent).
        wait_until(
            lambda: _job(pipeline.dsn, big_id)[0] in ("INVALID", "ACCEPTED"),
            60,
            f"job {big_id} settled (INVALID)",
        )
        status, reason = _job(pipeline.dsn, big_id)
        # The slot moves past the big row: the relay never stalls on it.
        wait_until(
            lambda: _slot_confirmed(pipeline.dsn) >= big_lsn, 60, "the slot confirmed past the row"
        )
        confirmed = _slot_confirmed(pipeline.dsn)
        hwm_after = _vm_mib(relay.pid)
        rss_after = _vm_mib(relay.pid, "VmRSS")
        elapsed = time.monotonic() - started
        figures = (
            f"[relay large row {extra_mb} MB] payload={payload_bytes} bytes ({shape}) "
            f"relay_vm_hwm_before={hwm_before:.0f} MiB relay_vm_hwm_after={hwm_after:.0f} MiB "
            f"(limit {MANIFEST_LIMIT_MIB} MiB) relay_vm_rss_after={rss_after:.0f} MiB "
            "good_rows_sent=50 "
            f"accepted={report.accepted_unique} duplicates={report.duplicate_count} "
            f"order_violations={len(report.order_violations)} big_row={status} "
            f"slot_confirmed={confirmed:#x} big_row_wal_end={big_lsn:#x} elapsed={elapsed:.1f}s "
            f"reason={reason!r}"
        )
        print(f"\n{figures}")
        assert payload_bytes > extra_mb * MIB * 0.95, figures
        assert report.ok, f"{report.summary()}; {figures}"
        assert report.accepted_unique == 50, figures
        assert status == "INVALID", figures
        assert reason is not None and str(payload_bytes) in reason, figures
        assert "ZAPSTREAM_RELAY_MAX_RECORD_BYTES" in reason, figures
        assert hwm_after < MANIFEST_LIMIT_MIB, figures
        assert relay.is_running, relay.log_tail()
    finally:
        assert relay.terminate(timeout_s=60) == 0, relay.log_tail()
