"""``make dev``: the whole pipeline on embedded defaults, with a demo batch and a summary.

Starts a throwaway PostgreSQL and a broker (Apache Kafka, or Tansu with ``--kafka tansu``),
the gateway simulator, the state sink, a relay, a worker, the lag monitor and the
operators' console (reading the lag monitor), each its own process; enqueues
``--messages`` intents over ``--instances`` WhatsApp instances and ``--conversations``
conversations through the application API; shows progress; and ends with what arrived
at the gateway: accepted, duplicates, per-conversation order violations,
commit-to-gateway latency and throughput.

Then, unless ``--no-mix``, the demo mix (:mod:`devtools.stack.demo_mix`): a few jobs retried,
one DEAD, one UNCERTAIN, one cancelled, one expired, one INVALID row and a paused
instance holding two, so the console, ``zapstream status`` and ``zapstream jobs list``
show what operators meet. It comes after the batch's audit and is reported on its own.
The summary ends with the console's URL and its demo login.
Without ``--exit`` it keeps everything running until Ctrl-C so you can poke at it.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import psycopg

from connectors.outbox.enqueue import enqueue
from devtools.bench.support import proc_status_mib
from devtools.stack.delivery_audit import DeliveryReport, audit, demo_key, demo_text
from devtools.stack.demo_mix import RETRY_SCHEDULE_S, DemoMix, MixReport
from devtools.stack.devstack import find_free_port
from devtools.stack.local_pipeline import CONSOLE_DEMO_TOKEN, LOGIN_ROLES, LocalPipeline
from devtools.stack.run_profile import RunProfile, sample

DEMO_PURPOSE = "demo"


def demo_recipient(conversation: int) -> str:
    return f"+55 11 9{conversation:08d}"


def enqueue_demo_message(
    conn: psycopg.Connection[Any], key: str, instance: str, conversation: int
) -> None:
    """Enqueue the demo message ``key`` (idempotent: a key already there is left as it is)."""
    enqueue(
        conn,
        instance_id=instance,
        to=demo_recipient(conversation),
        text=demo_text(key),
        idempotency_key=key,
        purpose=DEMO_PURPOSE,
    )


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
                    enqueue_demo_message(conn, key, instance, conversation)
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
    """Wait until the state sink wrote ``count`` jobs of the demo batch back as sent; return
    the batch's counts by status (the demo mix, another purpose, is counted on its own)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT status, count(*) FROM outbox_jobs WHERE purpose = %s GROUP BY status",
                (DEMO_PURPOSE,),
            ).fetchall()
            by_status = {str(s): int(n) for s, n in rows}
            if by_status.get("ACCEPTED", 0) >= count or time.monotonic() > deadline:
                return by_status
            time.sleep(0.5)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.stack.dev_runner", description=__doc__.split("\n\n")[0]
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
    parser.add_argument(
        "--no-mix",
        action="store_true",
        help="only the demo batch: no retried, DEAD, UNCERTAIN, cancelled, expired, INVALID "
        "or held jobs after it",
    )
    return parser


def run_mix(mix: DemoMix | None, out: TextIO = sys.stdout) -> MixReport | None:
    """Make the demo mix's jobs, wait for their states, and report (None without a mix)."""
    if mix is None:
        return None
    print(
        "adding the demo mix: retried, DEAD, UNCERTAIN, cancelled, expired, INVALID and held "
        "jobs ...",
        file=out,
        flush=True,
    )
    try:
        mix.run_mix()
    except TimeoutError as exc:
        # The report below says which jobs did not get there.
        print(f"  {exc}", file=out, flush=True)
    return mix.finish()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    broker_name = "Apache Kafka" if args.kafka == "apache" else "Tansu"
    print(
        f"make dev: starting PostgreSQL, {broker_name}, the gateway simulator and the state "
        "sink ...",
        flush=True,
    )
    worker_port = find_free_port()
    pipeline = LocalPipeline(
        args.dir,
        partitions=args.partitions,
        keep=args.dir is not None,
        worker_env={
            "ZAPSTREAM_GATEWAY": args.gateway,
            "ZAPSTREAM_WORKER_WEB_PORT": str(worker_port),
            "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": RETRY_SCHEDULE_S,
        },
        broker="kafka" if args.kafka == "apache" else "tansu",
        # The recommended setup: each service on a PostgreSQL role of its own
        # (docs/guides/security.md); the demo's own SQL runs as the superuser.
        per_component_roles=True,
    )
    try:
        pipeline.start()
        print(f"  PostgreSQL  {pipeline.dsn} (superuser; services: one role each)")
        print(f"  roles       {', '.join(f'{c} {r}' for c, r in LOGIN_ROLES.items())}")
        print(f"  Kafka       {pipeline.kafka.bootstrap} ({pipeline.broker_description})")
        print(f"  gateway     {pipeline.sim_url} (simulator, {args.gateway} API)")
        print(f"  logs        {pipeline.dir}")
        if pipeline.sink is not None:
            print(f"  state sink  pid {pipeline.sink.pid} (zapstream sink)")
        print("starting relay, worker, lag monitor and console ...", flush=True)
        pipeline.start_relay()
        pipeline.start_worker()
        _, lag_url = pipeline.start_lag_monitor()
        _, console_url = pipeline.start_console(lag_url=lag_url)
        run = uuid.uuid4().hex[:8]
        mix = None
        if not args.no_mix:
            mix = DemoMix(
                pipeline, run=run, worker_metrics_url=f"http://127.0.0.1:{worker_port}/metrics"
            )
            mix.pause()
        print(
            f"enqueueing {args.messages} messages over {args.instances} instances and "
            f"{args.conversations} conversations ...",
            flush=True,
        )
        pids = {p.name: p.pid for p in pipeline.processes if p.is_running}
        broker_pid = getattr(pipeline.kafka, "pid", None)  # one broker node (not a cluster)
        if isinstance(broker_pid, int):
            pids["broker"] = broker_pid
        started = sample(pids)
        keys, committed = enqueue_demo(
            pipeline.component_dsn("app"),
            run=run,
            messages=args.messages,
            instances=args.instances,
            conversations=args.conversations,
        )
        enqueued = sample(pids)
        report = wait_for_delivery(pipeline, keys, committed, timeout_s=args.timeout)
        profile = RunProfile(len(keys), started, enqueued, sample(pids))
        states = wait_for_outbox(pipeline.dsn, len(keys), timeout_s=60)
        mixed = run_mix(mix)
        print("\nsummary")
        print(report.summary())
        for line in profile.lines():
            print(line)
        print(
            "processes:                "
            + ", ".join(f"{p.name} (pid {p.pid})" for p in pipeline.processes if p.is_running)
        )
        print(f"outbox_jobs by status:    {states} (the batch, purpose {DEMO_PURPOSE})")
        if mixed is not None:
            print(mixed.summary())
        print(
            "peak RSS (VmHWM):         "
            + ", ".join(
                f"{p.name} {proc_status_mib(p.pid, 'VmHWM'):.0f} MiB"
                for p in pipeline.processes
                if p.is_running
            )
        )
        ok = report.ok and states.get("ACCEPTED", 0) == len(keys) and (mixed is None or mixed.ok)
        print("result: OK" if ok else "result: PROBLEMS (see above)")
        print(f"console:                  {console_url}/ (the overview; jobs, history, lag)")
        print(
            f"console login:            token {CONSOLE_DEMO_TOKEN} (operator demo; "
            "a demo value, not a secret)",
            flush=True,
        )
        if not args.exit:
            print("\nthe pipeline keeps running; environment to talk to it:")
            env = {
                **pipeline.env(),
                **pipeline.worker_env,
                "ZAPSTREAM_STATUS_LAG_URL": lag_url,
            }
            for name, value in env.items():
                if "KEY" not in name and "TOKEN" not in name:
                    print(f"  export {name}={shlex.quote(value)}")
            print("then: zapstream status; zapstream jobs list --state DEAD")
            print("Ctrl-C stops everything.", flush=True)
            stop_signals = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
            signal.sigwait(stop_signals)
        return 0 if ok else 1
    finally:
        pipeline.stop()


if __name__ == "__main__":
    sys.exit(main())
