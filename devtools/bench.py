"""``make bench``: end-to-end throughput, latency and memory on local processes.

Runs the whole pipeline (throwaway PostgreSQL, Tansu, simulator, relay, worker),
enqueues ``--messages`` intents, waits for the gateway to accept them all, and
prints throughput, commit-to-gateway latency and the peak RSS of the relay and
the worker. Speed and memory targets belong here, never in timed unit tests;
``--min-throughput`` makes the run fail below a floor.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from devtools.dev_runner import enqueue_demo, wait_for_delivery
from devtools.local_pipeline import LocalPipeline


def peak_rss_mib(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make bench")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--conversations", type=int, default=2_000)
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--min-throughput", type=float, default=0.0, help="msg/s floor")
    args = parser.parse_args(argv)
    with LocalPipeline(partitions=args.partitions) as pipeline:
        relay = pipeline.start_relay()
        worker = pipeline.start_worker()
        started = time.monotonic()
        keys, committed = enqueue_demo(
            pipeline.dsn,
            run=uuid.uuid4().hex[:8],
            messages=args.messages,
            instances=args.instances,
            conversations=args.conversations,
        )
        enqueue_s = time.monotonic() - started
        report = wait_for_delivery(pipeline, keys, committed, timeout_s=1800, out=sys.stderr)
        print(report.summary())
        print(f"enqueue:                  {args.messages / enqueue_s:.0f} msg/s (application side)")
        rss = f"{peak_rss_mib(relay.pid):.0f} / {peak_rss_mib(worker.pid):.0f} MiB"
        print(f"peak RSS relay / worker:  {rss}")
        ok = report.ok and (report.throughput_per_s or 0) >= args.min_throughput
        print("bench: OK" if ok else "bench: FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
