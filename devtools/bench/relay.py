"""``make bench`` relay section: the relay next to ``pg_recvlogical`` and the polling worker.

1. N outbox rows are filled set-based while the relay is stopped, after its slot
   and an identical second slot were created; then the real ``zapstream relay``
   streams them until Kafka acknowledged them and the slot is confirmed
   (``confirmed_flush_lsn`` reaches ``pg_current_wal_insert_lsn()`` taken at fill end).
2. ``pg_recvlogical`` (pgoutput, proto_version 1, the same publication) drains
   the second slot to /dev/null up to the same LSN: PostgreSQL's own decoding.
3. The outbox article's polling worker (``FOR UPDATE SKIP LOCKED``, batches of
   1,000, produce all then await all, mark SENT in the same transaction) on an
   identical copy of the rows in a second database of the same cluster.
4. Commit -> Kafka latency at a fixed offered load (one row per transaction), on
   a fresh relay process with its metrics port set: the relay's own measurement
   (``zapstream_relay_commit_to_ack_seconds``, from PostgreSQL's commit timestamp
   in the pgoutput Begin to Kafka's acknowledgement of the transaction's record;
   exact p50/p99 from the relay's closing summary line, and the histogram's bucket
   bounds from ``/metrics``), next to a consumer of ``zapstream.intents`` (arrival
   time: an upper bound on the ack) and the record's CreateTime (the relay's send,
   1 ms resolution: a lower bound). Bench and cluster share a host, hence a clock.
5. librdkafka (confluent-kafka) producing the same rows as the relay's records to a
   topic of their own, acks=all and idempotent: the client ceiling the relay's rate
   is a fraction of (:mod:`devtools.bench.librdkafka`).

Every step runs on the section's one broker (``broker``: Tansu or Apache Kafka).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import subprocess
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, TextIO

import orjson
import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from connectors.cdc.provisioning import ensure_replication
from connectors.outbox.migrate import migrate
from devtools.bench.librdkafka import librdkafka_ceiling, librdkafka_figures
from devtools.bench.support import (
    Figure,
    cpu_seconds,
    fill_outbox,
    ms,
    percentile,
    proc_status_mib,
    slot_confirmed,
    wait_until,
)
from devtools.stack.devstack import ManagedProcess, find_free_port, postgres_bin_dir
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import INTENTS

SLOT = "zapstream_outbox"
PUBLICATION = "zapstream_outbox"
RECV_SLOT = "bench_recvlogical"
TXN_SLOT = "bench_relay_transactional"
"""The transactional relay variant's slot (Apache Kafka only): the same WAL as ``SLOT``."""
TXN_ENV = {"ZAPSTREAM_RELAY_SLOT": TXN_SLOT, "ZAPSTREAM_RELAY_EXACTLY_ONCE": "true"}
POLLING_TOPIC = "bench.polling"
DEBEZIUM_ROWS_S = 21_700.0


def _log(out: TextIO, text: str) -> None:
    print(f"  [relay] {text}", file=out, flush=True)


def run_relay_section(
    *,
    rows: int,
    latency_s: float,
    rate: float,
    partitions: int,
    out: TextIO,
    broker: str | None = None,
) -> list[Figure]:
    """The section on one ``broker``: ``tansu`` or ``kafka`` (default ``DEVSTACK_BROKER``)."""
    figures: list[Figure] = []
    with LocalPipeline(partitions=partitions, with_sink=False, broker=broker) as pipe:
        ensure_replication(pipe.dsn, slot=SLOT, publication=PUBLICATION)
        with psycopg.connect(pipe.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (RECV_SLOT,))
        # The relay variant "transactional" (ZAPSTREAM_RELAY_EXACTLY_ONCE): Tansu has none.
        transactional = pipe.broker == "kafka"
        if transactional:
            ensure_replication(pipe.dsn, slot=TXN_SLOT, publication=PUBLICATION)
        run = uuid.uuid4().hex[:8]
        started = time.monotonic()
        end_lsn = fill_outbox(pipe.dsn, run=run, start=0, count=rows)
        _log(out, f"filled {rows} rows in {time.monotonic() - started:.1f} s, end LSN {end_lsn}")

        # --- zapstream relay --------------------------------------------------------
        relay = pipe.start_relay(wait=False)
        timed = _time_relay(pipe, relay, SLOT, end_lsn, what="relay slot confirmation")
        relay_s = timed.seconds
        relay_rate = rows / relay_s
        cpu_us_row = timed.cpu_s / rows * 1e6
        relay_hwm = proc_status_mib(relay.pid, "VmHWM")
        _log(
            out,
            f"relay: {relay_rate:,.0f} rows/s ({relay_s:.1f} s from 'relay streaming'; "
            f"{rows / timed.since_spawn_s:,.0f} rows/s from process start), "
            f"{cpu_us_row:.0f} us CPU/row",
        )

        relay.stop()

        # --- the same rows through the transactional relay (exactly-once) -----------------
        txn = _transactional_relay(pipe, rows=rows, end_lsn=end_lsn) if transactional else None
        if txn is not None:
            _log(
                out,
                f"relay (transactional): {txn['rows_s']:,.0f} rows/s ({txn['seconds']:.1f} s), "
                f"{txn['cpu_us_row']:.0f} us CPU/row, {txn['kafka_commits']:,.0f} Kafka commits",
            )

        # --- commit -> Kafka latency at a fixed offered load ----------------------------
        # A fresh relay, so its metrics and closing summary cover only this run's
        # transactions (not the pre-filled ones it drained above).
        metrics_port = find_free_port()
        relay = pipe.start_relay(
            "relay-latency", env={"ZAPSTREAM_RELAY_METRICS_PORT": str(metrics_port)}
        )
        latency = _commit_to_kafka(
            pipe,
            run=f"{run}l",
            seconds=latency_s,
            rate=rate,
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        )
        relay_hwm = max(relay_hwm, proc_status_mib(relay.pid, "VmHWM"))
        relay.stop()
        latency.update(_relay_summary(relay.log_tail(400)))
        _log(out, f"commit->Kafka: {latency}")
        if txn is not None:
            # Visible to read_committed consumers only at the Kafka commit: time that. The
            # slot skips the plain latency run's rows first: only this run's rows are in flight.
            with psycopg.connect(pipe.dsn, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_replication_slot_advance(%s, pg_current_wal_insert_lsn())",
                    (TXN_SLOT,),
                )
            metrics_port = find_free_port()
            relay = pipe.start_relay(
                "relay-latency-transactional",
                env={**TXN_ENV, "ZAPSTREAM_RELAY_METRICS_PORT": str(metrics_port)},
            )
            txn_latency = _commit_to_kafka(
                pipe,
                run=f"{run}t",
                seconds=latency_s,
                rate=rate,
                metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
                isolation_level="read_committed",
            )
            relay.stop()
            txn.update({f"latency_{k}": v for k, v in txn_latency.items()})
            _log(out, f"commit->read_committed (transactional): {txn_latency}")

        # --- pg_recvlogical on the identical slot -----------------------------------------
        recv_s = _pg_recvlogical(pipe, end_lsn)
        recv_rate = rows / recv_s
        _log(out, f"pg_recvlogical: {recv_rate:,.0f} rows/s ({recv_s:.1f} s)")

        # --- the polling worker on an identical copy ---------------------------------------
        dsn2 = pipe.postgres.create_database("bench_polling")
        migrate(dsn2)
        fill_outbox(dsn2, run=run, start=0, count=rows)
        poll_s = asyncio.run(_polling_worker(dsn2, pipe.kafka.bootstrap, partitions))
        poll_rate = rows / poll_s
        _log(out, f"polling worker: {poll_rate:,.0f} rows/s ({poll_s:.1f} s)")

        # --- librdkafka (confluent-kafka) producing the same rows: the client ceiling ---
        lib = librdkafka_ceiling(
            pipe.dsn, pipe.kafka.bootstrap, rows=rows, partitions=partitions, lsn=end_lsn
        )
        _log(out, f"librdkafka producer: {lib['rows_s']:,.0f} rows/s ({lib['seconds']:.1f} s)")

    sec = "relay"
    figures.append(
        Figure(
            sec,
            f"relay rows/s, {rows:,} pre-filled rows until slot confirmed",
            f"{relay_rate:,.0f}",
            f"pg_recvlogical {recv_rate:,.0f}; polling worker {poll_rate:,.0f}; "
            f"Debezium {DEBEZIUM_ROWS_S:,.0f} (fixed, earlier measurement)",
            ">= 60,000",
            relay_rate >= 60_000,
            {
                "rows": rows,
                "relay_rows_s": relay_rate,
                "relay_s": relay_s,
                "relay_s_from_spawn": timed.since_spawn_s,
                "pg_recvlogical_rows_s": recv_rate,
                "polling_worker_rows_s": poll_rate,
                "debezium_rows_s_fixed": DEBEZIUM_ROWS_S,
            },
        )
    )
    figures.append(
        Figure(
            sec,
            "relay / pg_recvlogical",
            f"{relay_rate / recv_rate:.2f}",
            f"pg_recvlogical {recv_rate:,.0f} rows/s",
            ">= 0.6",
            relay_rate / recv_rate >= 0.6,
        )
    )
    figures.append(
        Figure(
            sec,
            "relay / Debezium",
            f"{relay_rate / DEBEZIUM_ROWS_S:.2f}x",
            f"Debezium {DEBEZIUM_ROWS_S:,.0f} rows/s (fixed, earlier measurement)",
            ">= 2.75x",
            relay_rate / DEBEZIUM_ROWS_S >= 2.75,
        )
    )
    figures.append(
        Figure(
            sec,
            "relay / polling worker",
            f"{relay_rate / poll_rate:.2f}x",
            f"polling worker {poll_rate:,.0f} rows/s",
        )
    )
    # A relay variant measured above (e.g. transactional) adds its rows/s here: it gets
    # its own "<label> / librdkafka producer" row.
    variants = {"relay": relay_rate}
    if txn is not None:
        variants["relay (transactional)"] = txn["rows_s"]
        figures.extend(_transactional_figures(txn, relay_rate, latency, rows=rows, rate=rate))
    figures.extend(librdkafka_figures(lib, variants))
    figures.append(
        Figure(sec, "relay CPU per row", f"{cpu_us_row:.0f} us", raw={"cpu_us_row": cpu_us_row})
    )
    ack_p99 = latency.get("ack_p99_s")
    hist_p99 = latency.get("ack_hist_p99_le_s")
    if ack_p99 is None:
        # No summary line: judge by the histogram's bound (an upper bound on p99).
        ack_p99 = hist_p99
    figures.append(
        Figure(
            sec,
            f"commit->Kafka ack p50/p99 at {rate:.0f} rows/s, {latency_s:.0f} s (relay's own)",
            f"{ms(latency.get('ack_p50_s'))} / {ms(latency.get('ack_p99_s'))}",
            f"exact over {latency.get('ack_summary_window', 0):,} txns (1 warm-up); "
            f"histogram: p50 <= {ms(latency.get('ack_hist_p50_le_s'))}, p99 <= "
            f"{ms(hist_p99)} ({latency.get('ack_hist_count', 0):,.0f} txns); "
            f"of which commit->relay read (PostgreSQL) {ms(latency.get('read_p50_s'))} / "
            f"{ms(latency.get('read_p99_s'))}; "
            f"consumer arrival {ms(latency.get('arrival_p50_s'))} / "
            f"{ms(latency.get('arrival_p99_s'))}; record CreateTime (send) "
            f"{ms(latency.get('send_p50_s'))} / {ms(latency.get('send_p99_s'))}",
            "p99 <= 10 ms",
            None if ack_p99 is None else ack_p99 <= 0.010,
            latency,
        )
    )
    figures.append(
        Figure(
            sec,
            "relay peak RSS (VmHWM)",
            f"{relay_hwm:.0f} MiB",
            target="<= 150 MB",
            passed=relay_hwm * 1.048576 <= 150,
            raw={"relay_vmhwm_mib": relay_hwm},
        )
    )
    return figures


# --- pg_recvlogical ----------------------------------------------------------------------


def _pg_recvlogical(pipe: LocalPipeline, end_lsn: str) -> float:
    """Drain RECV_SLOT to /dev/null up to ``end_lsn``; wall seconds until it exits."""
    binary = postgres_bin_dir() / "pg_recvlogical"
    args = [
        str(binary),
        "-d",
        pipe.dsn,
        "--slot",
        RECV_SLOT,
        "--start",
        "--no-loop",
        "--endpos",
        end_lsn,
        "-o",
        "proto_version=1",
        "-o",
        f"publication_names={PUBLICATION}",
        "-f",
        "/dev/null",
    ]
    kwargs: dict[str, Any] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        env["HOME"] = user.pw_dir
    started = time.monotonic()
    result = subprocess.run(
        args,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        cwd="/tmp",
        timeout=1800,
        check=False,
        **kwargs,
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({result.returncode}): {result.stderr}")
    return elapsed


# --- the outbox article's polling worker ------------------------------------------------

_CLAIM = """
SELECT id, instance_id, payload::text, idempotency_key, conversation_key
FROM outbox_jobs WHERE status = 'PENDING' ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED
"""
# The article's mark, one version up: zapstream's outbox refuses a status write that leaves
# state_version alone (migration 0009: it is not the state sink's), and this baseline
# measures the polling loop, not that refusal.
_MARK = (
    "UPDATE outbox_jobs SET status = 'SENT', sent_at = now(), "
    "state_version = state_version + 1 WHERE id = ANY(%s)"
)


async def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-admin")
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def _polling_worker(dsn: str, bootstrap: str, partitions: int) -> float:
    """Poll, produce, mark until no PENDING row is left; wall seconds of the loop."""
    await _create_topic(bootstrap, POLLING_TOPIC, partitions)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            started = time.monotonic()
            while True:
                async with conn.transaction():
                    cur = await conn.execute(_CLAIM)
                    rows = await cur.fetchall()
                    if not rows:
                        break
                    futures = [
                        await producer.send(
                            POLLING_TOPIC,
                            value=orjson.dumps(
                                {
                                    "id": r[0],
                                    "instance_id": r[1],
                                    "payload": orjson.Fragment(r[2]),
                                    "idempotency_key": r[3],
                                }
                            ),
                            key=f"{r[1]}:{r[4]}".encode(),
                        )
                        for r in rows
                    ]
                    await asyncio.gather(*futures)
                    await conn.execute(_MARK, ([r[0] for r in rows],))
            return time.monotonic() - started
    finally:
        await producer.stop()


# --- commit -> Kafka latency ----------------------------------------------------------------


_SUMMARY = re.compile(
    r"(commit->ack|commit->read) p50 ([\d.]+) ms p99 ([\d.]+) ms max ([\d.]+) ms "
    r"over the last (\d+) of (\d+)"
)
_BUCKET = re.compile(r'^zapstream_relay_commit_to_ack_seconds_bucket\{le="([^"]+)"\} (\S+)$', re.M)


def _relay_summary(log_tail: str) -> dict[str, Any]:
    """The exact p50/p99 from the relay's closing line (over its last transactions)."""
    found: dict[str, Any] = {}
    for name, p50, p99, top, window, total in _SUMMARY.findall(log_tail):
        prefix = "ack" if name == "commit->ack" else "read"
        found.update(
            {
                f"{prefix}_p50_s": float(p50) / 1000,
                f"{prefix}_p99_s": float(p99) / 1000,
                f"{prefix}_max_s": float(top) / 1000,
                f"{prefix}_summary_window": int(window),
                f"{prefix}_summary_transactions": int(total),
            }
        )
    return found


def _histogram(url: str) -> dict[float, float]:
    """Cumulative bucket counts of ``zapstream_relay_commit_to_ack_seconds`` (le -> count)."""
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (our own relay)
        text = response.read().decode()
    return {float(le): float(count) for le, count in _BUCKET.findall(text)}


def _bucket_bound(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The smallest bucket bound under which at least ``q`` of the new observations lie."""
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return None
    return next(le for le, count in delta.items() if count >= q * total)


def _insert(conn: psycopg.Connection[Any], key: str, i: int) -> None:
    conn.execute(
        "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES (%s, %s, %s)",
        (
            "inst-00",
            orjson.dumps(
                {"type": "text", "to": f"+55 11 9{i:08d}", "text": f"bench [{key}]"}
            ).decode(),
            key,
        ),
    )


def _commit_to_kafka(
    pipe: LocalPipeline,
    *,
    run: str,
    seconds: float,
    rate: float,
    metrics_url: str,
    isolation_level: str = "read_uncommitted",
) -> dict[str, Any]:
    """Insert one row per transaction at ``rate``/s; the relay and a consumer time them.

    ``isolation_level="read_committed"``: the consumer sees a transactional relay's
    records when their Kafka transaction commits, its arrival is commit -> visible."""
    arrivals: dict[str, tuple[float, float]] = {}  # key -> (arrival epoch s, CreateTime s)
    ready = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    async def consume() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=pipe.kafka.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=5,
            isolation_level=isolation_level,
        )
        await consumer.start()
        try:
            parts = [TopicPartition(INTENTS, p) for p in range(pipe.partitions)]
            consumer.assign(parts)
            await consumer.seek_to_end(*parts)
            for tp in parts:
                await consumer.position(tp)
            ready.set()
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=50)
                now = time.time()
                for records in batches.values():
                    for record in records:
                        value = orjson.loads(record.value or b"{}")
                        key = value.get("idempotency_key")
                        if isinstance(key, str):
                            arrivals[key] = (now, record.timestamp / 1000)
        finally:
            await consumer.stop()

    def thread_main() -> None:
        try:
            asyncio.run(consume())
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=thread_main, name="bench-consumer", daemon=True)
    thread.start()
    ready.wait(60)
    committed: dict[str, float] = {}
    total = int(seconds * rate)
    inf = float("inf")
    with psycopg.connect(pipe.dsn, autocommit=True) as conn:
        # The dev cluster runs synchronous_commit=off: its WAL would reach the
        # walsender only at the WAL writer's next 200 ms round. Applications commit
        # with the default (on), so this session does too.
        conn.execute("SET synchronous_commit = on")
        # Warm-up: a freshly started walsender first decodes again from the slot's
        # restart_lsn (here the whole pre-filled WAL) before it sends anything new.
        # One transaction, acknowledged before the timed run; it is in the relay's
        # summary window (1 of total + 1) but not in the histogram difference.
        _insert(conn, f"{run}:warmup", 0)
        wait_until(
            lambda: _histogram(metrics_url).get(inf, 0) >= 1, timeout_s=120, what="relay warm-up"
        )
        hist_before = _histogram(metrics_url)
        started = time.monotonic()
        for i in range(total):
            due = started + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            key = f"{run}:inst-00:{i}:0"
            _insert(conn, key, i)
            committed[key] = time.time()
        offered = total / (time.monotonic() - started)
    deadline = time.monotonic() + 60
    while len(arrivals.keys() & committed.keys()) < total and time.monotonic() < deadline:
        if errors:
            break
        time.sleep(0.1)
    stop.set()
    thread.join(10)
    if errors:
        raise RuntimeError(f"bench consumer failed: {errors[0]!r}")
    # The relay observes a transaction when its ack callback runs: wait for all of them.
    hist_after = _histogram(metrics_url)
    deadline = time.monotonic() + 30
    while hist_after.get(inf, 0) - hist_before.get(inf, 0) < total and time.monotonic() < deadline:
        time.sleep(0.1)
        hist_after = _histogram(metrics_url)
    arrival = sorted(arrivals[k][0] - c for k, c in committed.items() if k in arrivals)
    send = sorted(arrivals[k][1] - c for k, c in committed.items() if k in arrivals)
    return {
        "offered_rows_s": offered,
        "rows": total,
        "arrived": len(arrival),
        "arrival_p50_s": percentile(arrival, 0.5),
        "arrival_p99_s": percentile(arrival, 0.99),
        "send_p50_s": percentile(send, 0.5),
        "send_p99_s": percentile(send, 0.99),
        "ack_hist_count": hist_after.get(inf, 0) - hist_before.get(inf, 0),
        "ack_hist_p50_le_s": _bucket_bound(hist_before, hist_after, 0.5),
        "ack_hist_p99_le_s": _bucket_bound(hist_before, hist_after, 0.99),
    }


# --- the relay variant "transactional" (ZAPSTREAM_RELAY_EXACTLY_ONCE) ----------------------

_EOS_COMMITS = re.compile(r"relay exactly-once: (\d+) Kafka transactions committed")


@dataclass(frozen=True)
class RelayTiming:
    """How long a relay took to confirm its slot past the fill, from its 'relay streaming'
    line (from its spawn if that line was never seen), and the CPU it spent meanwhile."""

    seconds: float
    since_spawn_s: float
    cpu_s: float


def _time_relay(
    pipe: LocalPipeline, relay: ManagedProcess, slot: str, end_lsn: str, *, what: str
) -> RelayTiming:
    """Time ``relay`` (just started, ``wait=False``) until ``slot`` is confirmed past
    ``end_lsn``."""
    spawned = time.monotonic()
    streaming_at: float | None = None
    cpu_at_stream = 0.0

    def confirmed() -> bool:
        nonlocal streaming_at, cpu_at_stream
        if streaming_at is None and "relay streaming" in relay.log_tail(200):
            streaming_at = time.monotonic()
            cpu_at_stream = cpu_seconds(relay.pid)
        return slot_confirmed(pipe.dsn, slot, end_lsn)

    done = wait_until(confirmed, timeout_s=1800, what=what)
    cpu = cpu_seconds(relay.pid)
    started = streaming_at if streaming_at is not None else spawned
    return RelayTiming(done - started, done - spawned, cpu - cpu_at_stream)


def _transactional_relay(pipe: LocalPipeline, *, rows: int, end_lsn: str) -> dict[str, float]:
    """The relay with exactly-once on ``TXN_SLOT`` (the WAL the plain relay drained): its rate.

    Timed like the plain relay: from its 'relay streaming' line (the transactional
    producer started, the stored position read) until ``TXN_SLOT`` is confirmed past the
    fill's end, i.e. until the last Kafka transaction committed.
    """
    relay = pipe.start_relay("relay-transactional", wait=False, env=TXN_ENV)
    timed = _time_relay(
        pipe, relay, TXN_SLOT, end_lsn, what="transactional relay slot confirmation"
    )
    hwm = proc_status_mib(relay.pid, "VmHWM")
    relay.stop()
    seconds = timed.seconds
    commits = _EOS_COMMITS.findall(relay.log_tail(400))
    return {
        "rows": rows,
        "rows_s": rows / seconds,
        "seconds": seconds,
        "cpu_us_row": timed.cpu_s / rows * 1e6,
        "vmhwm_mib": hwm,
        "kafka_commits": float(commits[-1]) if commits else float("nan"),
    }


def _transactional_figures(
    txn: dict[str, Any], relay_rate: float, latency: dict[str, Any], *, rows: int, rate: float
) -> list[Figure]:
    """The cost of exactly-once: rows/s and commit -> visible against the plain relay."""
    ratio = txn["rows_s"] / relay_rate
    return [
        Figure(
            "relay",
            f"relay (transactional) rows/s, the same {rows:,} rows until slot confirmed",
            f"{txn['rows_s']:,.0f}",
            f"plain relay {relay_rate:,.0f} rows/s (transactional / plain {ratio:.2f}); "
            f"{txn['kafka_commits']:,.0f} Kafka transactions, CPU {txn['cpu_us_row']:.0f} us/row",
            raw={**txn, "plain_rows_s": relay_rate, "transactional_over_plain": ratio},
        ),
        Figure(
            "relay",
            f"relay (transactional) commit->read_committed consumer p50/p99 at {rate:.0f} rows/s",
            f"{ms(txn.get('latency_arrival_p50_s'))} / {ms(txn.get('latency_arrival_p99_s'))}",
            f"plain relay, consumer arrival {ms(latency.get('arrival_p50_s'))} / "
            f"{ms(latency.get('arrival_p99_s'))}",
        ),
    ]
