"""``make bench`` worker sections: worker alone vs a bare Faust agent, memory, end-to-end latency.

Worker alone: intents are put into Kafka by a relay that is then stopped; the
worker starts afterwards and is timed from the simulator's first accepted
message to the last, with its CPU (utime+stime from /proc) over the same span.
The Faust+Table baseline (:mod:`devtools.bench.faust_baseline`) then reads the
same topic with the same broker and partitions in its own consumer group.

End to end: relay, worker and state sink run; intents are committed one per
transaction at a fixed offered rate and their commit times compared with the
simulator's arrival times.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import orjson
import psycopg
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from connectors.cdc.provisioning import ensure_replication
from devtools.bench.support import (
    cpu_seconds,
    fill_outbox,
    machine_cpu_s,
    ms,
    percentile,
    proc_status_mib,
    slot_confirmed,
    wait_until,
)
from devtools.stack.delivery_audit import KEY_IN_TEXT, audit
from devtools.stack.kafka_broker import KafkaCluster
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import INTENTS

SLOT = "zapstream_outbox"
MEMORY_HORIZON_S = 20.0
"""The dedup horizon of the memory run (``ZAPSTREAM_WORKER_DEDUP_HORIZON_S``)."""
BASELINE_APP = "bench-faust-baseline"


def _log(out: TextIO, text: str) -> None:
    print(f"  [worker] {text}", file=out, flush=True)


def _sim_accepted(pipe: LocalPipeline) -> int:
    import httpx

    response = httpx.get(f"{pipe.sim_url}/_sim/stats", timeout=10.0)
    response.raise_for_status()
    return int(response.json()["accepted"])


def _relay_into_kafka(pipe: LocalPipeline, *, run: str, start: int, count: int) -> None:
    """Fill the outbox and let a relay put it into Kafka; stop the relay once confirmed."""
    ensure_replication(pipe.dsn, slot=SLOT, publication=SLOT)  # before the fill: rows stream
    end_lsn = fill_outbox(pipe.dsn, run=run, start=start, count=count)
    relay = pipe.start_relay(name=f"relay-{start}")
    wait_until(
        lambda: slot_confirmed(pipe.dsn, SLOT, end_lsn),
        timeout_s=1800,
        what="relay slot confirmation",
        interval_s=0.2,
    )
    relay.stop()


def _timed_delivery(
    pipe: LocalPipeline,
    worker_pid: int | Sequence[int],
    *,
    target: int,
    timeout_s: float,
    also: dict[str, int] | None = None,
    on_first: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Poll the simulator until ``target`` accepted; rate and CPU from first to last.

    With several workers, CPU is their sum; ``machine_busy`` is the share of all the
    machine's cores that were busy over the same span (workers, broker, simulator).
    ``on_first`` runs once the first message is accepted (after the span's first reading).
    """
    pids = [worker_pid] if isinstance(worker_pid, int) else list(worker_pid)

    def cpu() -> float:
        return sum(cpu_seconds(pid) for pid in pids)

    others = dict(also or {})
    others_first: dict[str, float] = {}
    first: tuple[float, int, float] | None = None
    machine_first = (0.0, 0.0)
    deadline = time.monotonic() + timeout_s
    while True:
        accepted = _sim_accepted(pipe)
        now = time.monotonic()
        if first is None and accepted > 0:
            first = (now, accepted, cpu())
            machine_first = machine_cpu_s()
            others_first = {name: cpu_seconds(pid) for name, pid in others.items()}
            if on_first is not None:
                on_first()
        if accepted >= target:
            break
        if now > deadline:
            raise TimeoutError(f"bench: worker delivered {accepted}/{target} in {timeout_s:g} s")
        time.sleep(0.1)
    used = cpu()
    busy, total = machine_cpu_s()
    assert first is not None
    n = accepted - first[1]
    elapsed = now - first[0]
    spent = total - machine_first[1]
    per_other = {
        f"{name}_cpu_ms": (cpu_seconds(pid) - others_first[name]) / n * 1000 if n else float("nan")
        for name, pid in others.items()
    }
    return {
        **per_other,
        "msg_s": n / elapsed if elapsed > 0 else float("nan"),
        "cpu_ms_per_msg": (used - first[2]) / n * 1000 if n else float("nan"),
        "span_s": elapsed,
        "messages_timed": n,
        "machine_busy": (busy - machine_first[0]) / spent if spent > 0 else float("nan"),
    }


def _audit_counts(pipe: LocalPipeline, keys: list[str]) -> dict[str, int]:
    report = audit(keys, pipe.sim_messages())
    return {
        "duplicates": report.duplicate_count,
        "order_violations": len(report.order_violations),
        "missing": len(report.missing),
    }


async def _create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-admin")
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(n, partitions, 1, topic_configs={"cleanup.policy": "compact"}) for n in names]
        )
    finally:
        await admin.close()


def _faust_baseline(pipe: LocalPipeline, *, expect: int) -> dict[str, Any]:
    import asyncio

    asyncio.run(
        _create_topics(pipe.kafka.bootstrap, [f"{BASELINE_APP}-counts-changelog"], pipe.partitions)
    )
    proc = pipe.process(
        "faust-baseline",
        [
            "--brokers",
            pipe.kafka.bootstrap,
            "--topic",
            INTENTS,
            "--partitions",
            str(pipe.partitions),
            "--expect",
            str(expect),
            "--app-id",
            BASELINE_APP,
            "--data-dir",
            str(pipe.dir / "faust-baseline"),
        ],
        module="devtools.bench.faust_baseline",
    )
    proc.start()
    match = proc.wait_for_log(r"bench-baseline-result (\{.*\})", timeout_s=600)
    result: dict[str, Any] = orjson.loads(match.group(1))
    result["vmhwm_mib"] = proc_status_mib(proc.pid, "VmHWM")
    proc.stop()
    return result


def keys_for(run: str, start: int, count: int) -> list[str]:
    from devtools.bench.support import demo_key_of

    return [
        demo_key_of(run, i, conversations=2_000, instances=20) for i in range(start, start + count)
    ]


def run_worker_alone(
    *,
    latency_ms: float,
    messages: int,
    memory_total: int,
    baseline: bool,
    partitions: int,
    out: TextIO,
    broker: str | None = None,
    on_busy: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One worker-alone run; with ``memory_total`` > ``messages``, keep feeding it to there.

    ``broker``: ``tansu`` or ``kafka`` (:class:`LocalPipeline`'s; default ``DEVSTACK_BROKER``),
    as in every run of this module. ``on_busy`` gets the worker's pid once its first
    message reached the gateway (``make bench --profile`` attaches py-spy there)."""
    result: dict[str, Any] = {"latency_ms": latency_ms, "messages": messages}
    with LocalPipeline(partitions=partitions, with_sink=False, broker=broker) as pipe:
        pipe.sim_config(latency_ms=latency_ms)
        run = uuid.uuid4().hex[:8]
        started = time.monotonic()
        _relay_into_kafka(pipe, run=run, start=0, count=messages)
        _log(out, f"{messages} intents in Kafka after {time.monotonic() - started:.1f} s")
        worker = pipe.start_worker(wait=False)
        timed = _timed_delivery(
            pipe,
            worker.pid,
            target=messages,
            timeout_s=1800,
            on_first=None if on_busy is None else lambda: on_busy(worker.pid),
        )
        result.update(timed)
        result["rss_mib_after_first"] = proc_status_mib(worker.pid, "VmRSS")
        result.update(_audit_counts(pipe, keys_for(run, 0, messages)))
        _log(
            out,
            f"gateway {latency_ms:g} ms: {timed['msg_s']:,.0f} msg/s, "
            f"{timed['cpu_ms_per_msg']:.2f} ms CPU/msg, "
            f"RSS {result['rss_mib_after_first']:.0f} MiB",
        )
        if baseline:
            result["baseline"] = _faust_baseline(pipe, expect=messages)
            _log(out, f"faust+table baseline: {result['baseline']}")
        result["vmhwm_mib"] = proc_status_mib(worker.pid, "VmHWM")
        if memory_total > messages:
            # The dedup horizon at work, in a worker of its own: settled jobs leave its table
            # MEMORY_HORIZON_S after their last change, once the state sink wrote them. Its
            # intents are fresh (the relay streams them as they are filled), so none is old
            # enough for a lookup in outbox_jobs.
            worker.stop()
            pipe.start_sink()
            memory = pipe.start_worker(
                "worker-memory",
                env={
                    "ZAPSTREAM_WORKER_DEDUP_HORIZON_S": str(MEMORY_HORIZON_S),
                    "ZAPSTREAM_WORKER_DEDUP_MARGIN_S": "5",
                },
            )
            relay = pipe.start_relay(name="relay-more")
            done = messages
            for upto in (2 * messages, messages + memory_total):
                fill_outbox(pipe.dsn, run=run, start=done, count=upto - done)
                wait_until(
                    lambda upto=upto: _sim_accepted(pipe) >= upto,  # type: ignore[misc]
                    timeout_s=3600,
                    what=f"{upto} jobs at the gateway",
                    interval_s=0.5,
                )
                done = upto
                if upto == 2 * messages:
                    result["rss_mib_after_first"] = proc_status_mib(memory.pid, "VmRSS")
            relay.stop()
            result["memory_total"] = memory_total
            result["memory_horizon_s"] = MEMORY_HORIZON_S
            result["rss_mib_after_total"] = proc_status_mib(memory.pid, "VmRSS")
            result["vmhwm_mib"] = max(result["vmhwm_mib"], proc_status_mib(memory.pid, "VmHWM"))
            _log(
                out,
                f"memory worker (horizon {MEMORY_HORIZON_S:g} s): RSS "
                f"{result['rss_mib_after_first']:.0f} MiB after {messages} jobs, "
                f"{result['rss_mib_after_total']:.0f} MiB after {memory_total}",
            )
    return result


def _worker_intents(port: int) -> float:
    """``zapstream_intents_total`` of one worker, all decisions, from its /metrics."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10.0).text
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^zapstream_intents_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    )


def run_worker_scaling(
    *, workers: int, messages: int, partitions: int, out: TextIO, broker: str | None = None
) -> dict[str, Any]:
    """``workers`` workers of one group, running and assigned before intents arrive.

    The workers start first and wait until each reports Ready; then a relay puts the
    intents into Kafka (it is done long before the workers are) and the run is timed
    from the first accepted message to the last, CPU summed over the workers. Each
    worker's share comes from its own ``zapstream_intents_total``.
    """
    from devtools.stack.devstack import find_free_port

    result: dict[str, Any] = {"workers": workers, "messages": messages}
    with LocalPipeline(partitions=partitions, with_sink=False, broker=broker) as pipe:
        pipe.sim_config(latency_ms=0)
        ports = [find_free_port() for _ in range(workers)]
        procs = [
            pipe.start_worker(
                f"worker-{i}", wait=False, env={"ZAPSTREAM_WORKER_WEB_PORT": str(port)}
            )
            for i, port in enumerate(ports)
        ]
        for proc in procs:
            proc.wait_for_log(r"\[\^Worker\]: Ready", timeout_s=120)
        run = uuid.uuid4().hex[:8]
        ensure_replication(pipe.dsn, slot=SLOT, publication=SLOT)
        relay = pipe.start_relay(name="relay-scaling")
        fill_outbox(pipe.dsn, run=run, start=0, count=messages)
        assert pipe.simulator is not None
        assert not isinstance(pipe.kafka, KafkaCluster), "one broker process, for its CPU"
        timed = _timed_delivery(
            pipe,
            [p.pid for p in procs],
            target=messages,
            timeout_s=1800,
            also={"broker": pipe.kafka.pid, "simulator": pipe.simulator.pid},
        )
        relay.stop()
        result.update(timed)
        result["per_worker"] = [_worker_intents(port) for port in ports]
        result.update(_audit_counts(pipe, keys_for(run, 0, messages)))
    _log(
        out,
        f"{workers} worker(s): {result['msg_s']:,.0f} msg/s, "
        f"{result['cpu_ms_per_msg']:.2f} ms CPU/msg (all workers), intents per worker "
        f"{[int(n) for n in result['per_worker']]}, machine busy "
        f"{result['machine_busy']:.0%} of {os.cpu_count()} cores; per message the broker "
        f"used {result['broker_cpu_ms']:.2f} ms CPU, the simulator "
        f"{result['simulator_cpu_ms']:.2f} ms",
    )
    return result


HOPS = ("commit_to_relay_send", "relay_send_to_journal", "journal_to_gateway")
"""Where a message's time goes, from the records' CreateTime stamps (1 ms resolution):
the relay stamps the intent when it sends it, the worker stamps the ATTEMPTING state
when it journals the attempt, just before the gateway call."""


def _hops(
    bootstrap: str, committed: dict[str, float], arrived: dict[str, float]
) -> dict[str, float | None]:
    """Per-hop p50/p99 for the keys in ``committed``, read back from the topics."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    from streams.kernel.contract import STATE

    sent: dict[str, float] = {}
    journaled: dict[str, float] = {}

    async def read(topic: str, into: dict[str, float], only_attempting: bool) -> None:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
        )
        await consumer.start()
        try:
            quiet = 0
            while quiet < 3:
                batches = await consumer.getmany(timeout_ms=500, max_records=5000)
                quiet = 0 if batches else quiet + 1
                for records in batches.values():
                    for record in records:
                        if record.value is None:
                            continue
                        data = orjson.loads(record.value)
                        key = data.get("idempotency_key")
                        if key not in committed or key in into:
                            continue
                        if only_attempting and data.get("status") != "ATTEMPTING":
                            continue
                        into[key] = record.timestamp / 1000
        finally:
            await consumer.stop()

    async def both() -> None:
        await read(INTENTS, sent, False)
        await read(STATE, journaled, True)

    asyncio.run(both())
    spans = {
        "commit_to_relay_send": [sent[k] - committed[k] for k in committed if k in sent],
        "relay_send_to_journal": [journaled[k] - sent[k] for k in sent if k in journaled],
        "journal_to_gateway": [arrived[k] - journaled[k] for k in journaled if k in arrived],
    }
    out: dict[str, float | None] = {}
    for hop, values in spans.items():
        values.sort()
        out[f"{hop}_p50_s"] = percentile(values, 0.5)
        out[f"{hop}_p99_s"] = percentile(values, 0.99)
    return out


def run_end_to_end(
    *,
    rate: float,
    seconds: float,
    partitions: int,
    out: TextIO,
    broker: str | None = None,
    on_busy: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Commit one intent per transaction at ``rate``/s; commit -> gateway percentiles.

    ``on_busy`` gets the worker's pid as the commits begin."""
    with LocalPipeline(partitions=partitions, broker=broker) as pipe:
        relay = pipe.start_relay()
        worker = pipe.start_worker()
        run = uuid.uuid4().hex[:8]
        total = int(rate * seconds)
        committed: dict[str, float] = {}
        with psycopg.connect(pipe.dsn, autocommit=True) as conn:
            # The dev cluster runs synchronous_commit=off: its WAL would reach the
            # walsender only at the WAL writer's next 200 ms round. Applications commit
            # with the default (on), so this session does too.
            conn.execute("SET synchronous_commit = on")
            if on_busy is not None:
                on_busy(worker.pid)
            started = time.monotonic()
            for i in range(total):
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                conversation = i % 2_000
                key = f"{run}:inst-{conversation % 20:02d}:{conversation}:{i // 2_000}"
                payload = {
                    "type": "text",
                    "to": f"+55 11 9{conversation:08d}",
                    "text": f"Your zapstream demo message [{key}]",
                }
                conn.execute(
                    "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) "
                    "VALUES (%s, %s, %s)",
                    (f"inst-{conversation % 20:02d}", orjson.dumps(payload).decode(), key),
                )
                committed[key] = time.time()
            offered = total / (time.monotonic() - started)
        _log(out, f"offered {offered:.0f} msg/s for {seconds:g} s; waiting for the gateway")
        try:
            wait_until(
                lambda: _sim_accepted(pipe) >= total,
                timeout_s=max(60.0, total / 50),
                what="end-to-end delivery",
                interval_s=0.5,
            )
        except TimeoutError as exc:
            _log(out, str(exc))
        first: dict[str, float] = {}
        for arrival in pipe.sim_messages():
            found = KEY_IN_TEXT.search(str(arrival.get("text", "")))
            if found and found.group(1) in committed and found.group(1) not in first:
                first[found.group(1)] = float(arrival["arrived_at"])
        latencies = sorted(first[k] - committed[k] for k in first)
        # Latency of the first and the last fifth of the commits: flat means delay,
        # growing means the pipeline fell behind the offered load (queueing).
        by_commit = [first[k] - committed[k] for k in committed if k in first]
        fifth = max(1, len(by_commit) // 5)
        result = {
            "offered_msg_s": offered,
            "messages": total,
            "delivered": len(first),
            "p50_s": percentile(latencies, 0.5),
            "p99_s": percentile(latencies, 0.99),
            "p999_s": percentile(latencies, 0.999),
            "p50_first_fifth_s": percentile(sorted(by_commit[:fifth]), 0.5),
            "p50_last_fifth_s": percentile(sorted(by_commit[-fifth:]), 0.5),
            **_hops(pipe.kafka.bootstrap, committed, first),
            "relay_vmhwm_mib": proc_status_mib(relay.pid, "VmHWM"),
            "worker_vmhwm_mib": proc_status_mib(worker.pid, "VmHWM"),
        }
        _log(
            out,
            "hops p50/p99: "
            + "; ".join(
                f"{hop} {ms(result.get(f'{hop}_p50_s'))} / {ms(result.get(f'{hop}_p99_s'))}"
                for hop in HOPS
            ),
        )
        _log(
            out,
            f"commit->gateway p50 {ms(result['p50_s'])}, p99 {ms(result['p99_s'])}, "
            f"p999 {ms(result['p999_s'])} ({len(first)}/{total} delivered); p50 of the "
            f"first / last fifth of commits {ms(result['p50_first_fifth_s'])} / "
            f"{ms(result['p50_last_fifth_s'])}",
        )
        return result
