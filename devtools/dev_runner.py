"""``make dev``: the whole pipeline on embedded defaults, with a demo batch and a summary.

Starts a throwaway PostgreSQL and a broker (Apache Kafka, or Tansu with ``--kafka tansu``),
the gateway simulator, the state sink,
a relay and a worker, each its own process; enqueues ``--messages`` intents over
``--instances`` WhatsApp instances and ``--conversations`` conversations through
the application API; shows
progress; and ends with what arrived at the gateway: accepted, duplicates,
per-conversation order violations, commit-to-gateway latency and throughput.
Without ``--exit`` it keeps everything running until Ctrl-C so you can poke at it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import psycopg

from connectors.outbox.enqueue import enqueue
from devtools.bench_support import proc_status_mib
from devtools.delivery_audit import DeliveryReport, audit, demo_key, demo_text
from devtools.local_pipeline import LocalPipeline


def demo_recipient(conversation: int) -> str:
    return f"+55 11 9{conversation:08d}"


def enqueue_demo(
    dsn: str,
    *,
    run: str,
    messages: int,
    instances: int,
    conversations: int,
    batch: int = 500,
    after_transaction: Callable[[int], None] | None = None,
) -> tuple[list[str], dict[str, float]]:
    """Enqueue the demo batch in transactions of ``batch``; return keys and commit times.

    Message ``i`` goes to conversation ``i % conversations`` with sequence number
    ``i // conversations``, so each conversation's messages commit in order.
    ``after_transaction(committed_so_far)`` runs after each commit (tests pace with it).
    """
    keys: list[str] = []
    committed: dict[str, float] = {}
    with psycopg.connect(dsn) as conn:
        for start in range(0, messages, batch):
            chunk: list[str] = []
            with conn.transaction():
                for i in range(start, min(messages, start + batch)):
                    conversation = i % conversations
                    instance = f"inst-{conversation % instances:02d}"
                    key = demo_key(run, instance, conversation, i // conversations)
                    enqueue(
                        conn,
                        instance_id=instance,
                        to=demo_recipient(conversation),
                        text=demo_text(key),
                        idempotency_key=key,
                        purpose="demo",
                    )
                    chunk.append(key)
            now = time.time()
            committed.update((k, now) for k in chunk)
            keys.extend(chunk)
            if after_transaction is not None:
                after_transaction(len(keys))
    return keys, committed


def wait_for_delivery(
    pipeline: LocalPipeline,
    keys: list[str],
    committed: dict[str, float],
    *,
    timeout_s: float,
    out: TextIO = sys.stdout,
) -> DeliveryReport:
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    arrivals: list[dict[str, object]] = []
    report = audit(keys, arrivals, committed_at=committed)
    while time.monotonic() < deadline:
        arrivals.extend(pipeline.sim_messages(since=len(arrivals)))
        report = audit(keys, arrivals, committed_at=committed)
        elapsed = time.monotonic() - started
        print(
            f"  [{elapsed:5.1f}s] accepted by gateway {report.accepted_unique}/{report.expected}"
            f"  duplicates {report.duplicate_count}",
            file=out,
            flush=True,
        )
        if not report.missing:
            break
        time.sleep(1.0)
    return report


def wait_for_outbox(dsn: str, count: int, timeout_s: float) -> dict[str, int]:
    """Wait until the state sink wrote ``count`` jobs back as sent; return counts by status."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT status, count(*) FROM outbox_jobs GROUP BY status"
            ).fetchall()
            by_status = {str(s): int(n) for s, n in rows}
            if by_status.get("ACCEPTED", 0) >= count or time.monotonic() > deadline:
                return by_status
            time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.dev_runner", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--conversations", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for delivery")
    parser.add_argument("--exit", action="store_true", help="exit after the summary")
    parser.add_argument("--dir", type=Path, default=None, help="keep logs and data here")
    parser.add_argument(
        "--gateway",
        choices=["stackzap", "zapapi", "meta"],
        default="stackzap",
        help="the API the worker speaks to the simulator (ZAPSTREAM_GATEWAY)",
    )
    parser.add_argument(
        "--kafka",
        choices=["apache", "tansu"],
        default="apache",
        help="the broker: Apache Kafka (default; one KRaft node, the jars `make kafka` fetched) "
        "or Tansu (no JVM)",
    )
    args = parser.parse_args(argv)

    broker_name = "Apache Kafka" if args.kafka == "apache" else "Tansu"
    print(
        f"make dev: starting PostgreSQL, {broker_name}, the gateway simulator and the state "
        "sink ...",
        flush=True,
    )
    pipeline = LocalPipeline(
        args.dir,
        partitions=args.partitions,
        keep=args.dir is not None,
        worker_env={"ZAPSTREAM_GATEWAY": args.gateway},
        broker="kafka" if args.kafka == "apache" else "tansu",
    )
    try:
        pipeline.start()
        print(f"  PostgreSQL  {pipeline.dsn}")
        print(f"  Kafka       {pipeline.kafka.bootstrap} ({pipeline.broker_description})")
        print(f"  gateway     {pipeline.sim_url} (simulator, {args.gateway} API)")
        print(f"  logs        {pipeline.dir}")
        if pipeline.sink is not None:
            print(f"  state sink  pid {pipeline.sink.pid} (zapstream sink)")
        print("starting relay and worker ...", flush=True)
        pipeline.start_relay()
        pipeline.start_worker()
        run = uuid.uuid4().hex[:8]
        print(
            f"enqueueing {args.messages} messages over {args.instances} instances and "
            f"{args.conversations} conversations ...",
            flush=True,
        )
        keys, committed = enqueue_demo(
            pipeline.dsn,
            run=run,
            messages=args.messages,
            instances=args.instances,
            conversations=args.conversations,
        )
        report = wait_for_delivery(pipeline, keys, committed, timeout_s=args.timeout)
        states = wait_for_outbox(pipeline.dsn, len(keys), timeout_s=60)
        print("\nsummary")
        print(report.summary())
        print(
            "processes:                "
            + ", ".join(f"{p.name} (pid {p.pid})" for p in pipeline.processes if p.is_running)
        )
        print(f"outbox_jobs by status:    {states}")
        print(
            "peak RSS (VmHWM):         "
            + ", ".join(
                f"{p.name} {proc_status_mib(p.pid, 'VmHWM'):.0f} MiB"
                for p in pipeline.processes
                if p.is_running
            )
        )
        ok = report.ok and states.get("ACCEPTED", 0) == len(keys)
        print("result: OK" if ok else "result: PROBLEMS (see above)", flush=True)
        if not args.exit:
            print("\nthe pipeline keeps running; environment to talk to it:")
            for name, value in {**pipeline.env(), **pipeline.worker_env}.items():
                if "KEY" not in name and "TOKEN" not in name:
                    print(f"  export {name}={value}")
            print("Ctrl-C stops everything.", flush=True)
            stop_signals = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
            signal.sigwait(stop_signals)
        return 0 if ok else 1
    finally:
        pipeline.stop()


if __name__ == "__main__":
    sys.exit(main())
