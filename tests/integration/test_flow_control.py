"""Flow control per WhatsApp instance on real processes: pacing, rate limits, disconnections.

Intents are committed one per transaction at a fixed offered rate over several
instances (:class:`OfferedLoad`), the simulator injects the fault on one
instance, and the simulator's own arrival times are the measurements.

These tests run beside the rest of the suite on a loaded machine, so each bound tells the
mechanism apart from its absence, with room for a slow machine, and is not a speed target:
the figures are printed (rates, p99 latencies, ramp times); the targets are ``make bench``'s.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import httpx
import orjson
import psycopg
import pytest

from connectors.outbox.controls import pause_instance, resume_instance
from devtools.bench.support import slot_confirmed
from devtools.stack.delivery_audit import KEY_IN_TEXT, audit, demo_key, demo_text
from devtools.stack.devstack import ManagedProcess, find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import ContractError, IntentCaptured
from tests.integration.support import count_rows, wait_until
from tests.integration.topic_reader import read_topic

pytestmark = pytest.mark.integration

INSTANCES = [f"fc-{i}" for i in range(5)]


class OfferedLoad:
    """Commits ``rate`` intents a second for ``seconds``, round-robin over instances and
    conversations, one per transaction; ``committed`` maps each key to its commit time."""

    def __init__(
        self,
        dsn: str,
        *,
        rate: float,
        seconds: float,
        instances: list[str],
        conversations_per_instance: int = 10,
    ) -> None:
        self.dsn = dsn
        self.rate = rate
        self.total = int(rate * seconds)
        self.instances = instances
        self.conversations = conversations_per_instance
        self.run = uuid.uuid4().hex[:8]
        self.committed: dict[str, float] = {}
        self.keys_by_instance: dict[str, list[str]] = defaultdict(list)
        self._thread = threading.Thread(target=self._commit, name="offered-load", daemon=True)

    def start(self) -> OfferedLoad:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join()

    def _commit(self) -> None:
        seqs: dict[tuple[str, int], int] = defaultdict(int)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            started = time.monotonic()
            for i in range(self.total):
                delay = started + i / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                instance = self.instances[i % len(self.instances)]
                conversation = (i // len(self.instances)) % self.conversations
                seq = seqs[(instance, conversation)]
                seqs[(instance, conversation)] += 1
                key = demo_key(self.run, instance, conversation, seq)
                to = f"+55 11 9{self.instances.index(instance):03d}{conversation:05d}"
                conn.execute(
                    "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) "
                    "VALUES (%s, %s, %s)",
                    (
                        instance,
                        orjson.dumps({"type": "text", "to": to, "text": demo_text(key)}).decode(),
                        key,
                    ),
                )
                self.committed[key] = time.time()
                self.keys_by_instance[instance].append(key)


def _arrivals(pipeline: LocalPipeline, keys: set[str]) -> dict[str, float]:
    """First arrival time at the simulator of each of ``keys``."""
    first: dict[str, float] = {}
    for arrival in pipeline.sim_messages():
        found = KEY_IN_TEXT.search(str(arrival.get("text", "")))
        if found and found.group(1) in keys and found.group(1) not in first:
            first[found.group(1)] = float(arrival["arrived_at"])
    return first


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _max_in_any_second(times: list[float], window_s: float = 1.0) -> int:
    """The most of ``times`` in any window of ``window_s`` (default a second)."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


ARRIVAL_JITTER_S = 0.2
"""How much closer two requests may arrive at the simulator than they left the worker's
pacing gate: the HTTP hop and both processes' scheduling on a loaded machine (the simulator
stamps a request when its event loop gets to it). Measured on Apache Kafka with the gate's
exits logged: at most 55 in any second at the gate (50/s, burst 5), 59-63 in a second at the
simulator, 53-55 in any 0.9 s. The gate's own bound is exact and tested without I/O
(tests/unit/streams/test_pacing.py); this one catches sends the pacer did not hold."""


STALL_S = 1.0
"""How long a loaded machine may hold a request between the worker's pacing gate and the
simulator's stamp (both processes' scheduling and the HTTP hop). The rate bounds below count
arrivals in windows this much shorter than the time the gate had to release them."""

ISOLATION_MARGIN_S = 5.0
"""An isolated instance's message committed this long before a fault on another instance
ends has reached the gateway before that end. Without isolation it waits for the fault's
end (20-30 s later); quiet, it takes well under a second."""


def _committed_during(
    load: OfferedLoad, instances: list[str], start: float, end: float
) -> list[str]:
    return [
        k for i in instances for k in load.keys_by_instance[i] if start <= load.committed[k] < end
    ]


def _held_past(arrivals: dict[str, float], keys: list[str], until: float) -> list[str]:
    """The keys among ``keys`` that reached the gateway only at or after ``until``."""
    return [k for k in keys if arrivals[k] >= until]


def _per_second(times: list[float], origin: float) -> list[int]:
    counts: dict[int, int] = defaultdict(int)
    for t in times:
        counts[int(t - origin)] += 1
    return [counts[s] for s in range(max(counts) + 1)] if counts else []


def _wait_delivered(pipeline: LocalPipeline, keys: list[str], timeout_s: float) -> None:
    wanted = set(keys)
    wait_until(
        lambda: len(_arrivals(pipeline, wanted)) >= len(wanted),
        timeout_s,
        f"{len(wanted)} messages at the gateway",
    )


class Worker:
    def __init__(self, process: ManagedProcess, port: int) -> None:
        self.process = process
        self.port = port

    def intents(self) -> float:
        """``zapstream_intents_total``, all decisions."""
        return self.metric("zapstream_intents_total")

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def _start_workers(pipeline: LocalPipeline, n: int, env: dict[str, str]) -> list[Worker]:
    ports = [find_free_port() for _ in range(n)]
    workers = [
        Worker(
            pipeline.start_worker(
                f"fc-worker-{i}", wait=False, env={**env, "ZAPSTREAM_WORKER_WEB_PORT": str(port)}
            ),
            port,
        )
        for i, port in enumerate(ports)
    ]
    for worker in workers:
        worker.process.wait_for_log(r"\[\^Worker\]: Ready", timeout_s=120)
    return workers


@pytest.fixture
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=8) as p:
        p.start_relay()
        yield p


def test_an_instance_at_10_per_second_never_exceeds_it_with_two_workers(
    pipeline: LocalPipeline,
) -> None:
    limited, rate, burst = INSTANCES[0], 10, 4
    env = {
        "ZAPSTREAM_WORKER_INSTANCE_RATES": orjson.dumps(
            {limited: {"rate_per_s": rate, "burst": burst}}
        ).decode()
    }
    workers = _start_workers(pipeline, 2, env)
    # 100 msg/s offered over 5 instances: 20/s on the limited one, twice its limit.
    load = OfferedLoad(pipeline.dsn, rate=100, seconds=8, instances=INSTANCES).start()
    load.join()
    _wait_delivered(pipeline, list(load.committed), 120)
    arrivals = _arrivals(pipeline, set(load.keys_by_instance[limited]))
    times = sorted(arrivals.values())
    span = times[-1] - times[0]
    window_s = 3.0
    most = _max_in_any_second(times, window_s)
    report = audit(list(load.committed), pipeline.sim_messages())
    per_worker = [w.intents() for w in workers]
    print(
        f"\n{rate}/s instance, 2 workers: {len(times)} messages over {span:.1f} s "
        f"(mean {(len(times) - 1) / span:.1f}/s), most in any 1 s window "
        f"{_max_in_any_second(times)}, in any {window_s:g} s window {most}; per second "
        f"{_per_second(times, times[0])}; duplicates {report.duplicate_count}, order "
        f"violations {len(report.order_violations)}; intents per worker {per_worker}"
    )
    assert all(per_worker), "both workers sent"
    # Both workers' shares together release at most rate x T + burst in any T seconds, so
    # the instance's 160 messages take at least (160 - burst) / rate = 15.6 s; unpaced, they
    # arrive as offered, in 8 s. A loaded machine only stretches the span, and may bunch
    # arrivals by STALL_S at either end.
    assert span >= (len(times) - burst) / rate - STALL_S, (span, len(times))
    assert most <= rate * (window_s + STALL_S) + burst, most
    assert report.duplicate_count == 0 and not report.order_violations


def test_a_429_storm_on_one_instance_leaves_the_others_alone(pipeline: LocalPipeline) -> None:
    stormy = INSTANCES[0]
    _start_workers(pipeline, 1, {})
    pipeline.sim_config(retry_after_s=2)

    def others_p99(load: OfferedLoad, arrivals: dict[str, float]) -> float:
        return _p99(
            [
                arrivals[k] - load.committed[k]
                for i in INSTANCES[1:]
                for k in load.keys_by_instance[i]
            ]
        )

    calm = OfferedLoad(pipeline.dsn, rate=50, seconds=10, instances=INSTANCES).start()
    calm.join()
    _wait_delivered(pipeline, list(calm.committed), 120)
    calm_p99 = others_p99(calm, _arrivals(pipeline, set(calm.committed)))

    storm = OfferedLoad(pipeline.dsn, rate=50, seconds=30, instances=INSTANCES).start()
    time.sleep(3)  # the storm starts while traffic flows, like in production
    pipeline.sim_config(rate_limited_instances={stormy: 20})
    storm_start = time.time()
    storm_end = storm_start + 20
    storm.join()
    _wait_delivered(pipeline, list(storm.committed), 120)
    arrivals = _arrivals(pipeline, set(storm.committed))
    storm_p99 = others_p99(storm, arrivals)
    others_in_storm = _committed_during(
        storm, INSTANCES[1:], storm_start, storm_end - ISOLATION_MARGIN_S
    )
    others_held = _held_past(arrivals, others_in_storm, storm_end)
    stormy_keys = storm.keys_by_instance[stormy]
    held = [k for k in stormy_keys if storm.committed[k] < storm_end]
    recent = [arrivals[k] for k in stormy_keys if arrivals[k] >= storm_end - 5]
    last_stormy = max(arrivals[k] for k in held)
    report = audit(list(storm.committed), pipeline.sim_messages())
    attempts_dead = count_rows(
        pipeline.dsn,
        "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = ANY(%s) AND status = 'DEAD'",
        (stormy_keys,),
    )
    print(
        f"\n429 storm on {stormy} for 20 s (Retry-After 2): other instances' p99 "
        f"{calm_p99 * 1000:.0f} ms calm -> {storm_p99 * 1000:.0f} ms during the storm, "
        f"{len(others_held)} of their {len(others_in_storm)} committed in it held past its end; "
        f"{len(held)} of its messages committed before the storm's end, the last of them "
        f"{last_stormy - storm_end:+.1f} s after the storm's end (per second from 5 s "
        f"before: {_per_second(recent, storm_end - 5)}); duplicates "
        f"{report.duplicate_count}, order violations {len(report.order_violations)}"
    )
    # The other instances are not held by the storm: what they committed while it raged
    # (up to ISOLATION_MARGIN_S before its end) reached the gateway before it ended.
    assert others_in_storm and not others_held, (len(others_held), calm_p99, storm_p99)
    # A 429 just before the storm's end still blocks for its Retry-After (2 s): the ramp
    # starts between 0 and 2 s after the end, then doubles the rate each second through
    # ~230 held messages (~4 s), and a parked conversation is seen at most 0.5 s late.
    # Measured 4.0, 4.9, 5.7 and 6.1 s on a quiet machine; the bound leaves a loaded one
    # room and still tells the ramp from the failure schedule, whose first step is 60 s.
    assert last_stormy - storm_end <= 30.0
    assert report.duplicate_count == 0 and not report.order_violations
    assert attempts_dead == 0


def test_a_disconnected_instance_waits_and_ramps_up_after_it_returns(
    pipeline: LocalPipeline,
) -> None:
    lost = INSTANCES[0]
    _start_workers(pipeline, 1, {"ZAPSTREAM_WORKER_INSTANCE_PROBE_S": "3"})
    load = OfferedLoad(pipeline.dsn, rate=50, seconds=40, instances=INSTANCES).start()
    time.sleep(3)
    pipeline.sim_config(disconnected_instances={lost: 30})
    lost_at = time.time()
    back_at = lost_at + 30
    load.join()
    _wait_delivered(pipeline, list(load.committed), 120)
    lost_keys = load.keys_by_instance[lost]
    arrivals = _arrivals(pipeline, set(load.committed))
    report = audit(list(load.committed), pipeline.sim_messages())
    bad = count_rows(
        pipeline.dsn,
        "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = ANY(%s) "
        "AND status IN ('FAILED', 'DEAD', 'UNCERTAIN')",
        (lost_keys,),
    )
    after = sorted(t for k, t in arrivals.items() if k in set(lost_keys) and t >= back_at)
    counts = _per_second(after, back_at)
    others = [
        arrivals[k] - load.committed[k]
        for i in INSTANCES[1:]
        for k in load.keys_by_instance[i]
        if back_at - 30 <= load.committed[k] < back_at
    ]
    others_in_outage = _committed_during(load, INSTANCES[1:], lost_at, back_at - ISOLATION_MARGIN_S)
    others_held = _held_past(arrivals, others_in_outage, back_at)
    print(
        f"\n{lost} disconnected for 30 s: {len(after)} of its messages after it returned, "
        f"per second {counts}; other instances' p99 during the outage "
        f"{_p99(others) * 1000:.0f} ms, {len(others_held)} of their {len(others_in_outage)} "
        f"held past it; bad ends {bad}; duplicates {report.duplicate_count}"
    )
    assert bad == 0
    assert report.duplicate_count == 0 and not report.order_violations
    assert others_in_outage and not others_held, len(others_held)
    assert len(after) > 50
    # Ramp-up: the first second after the probe gets through sends less than the peak.
    first = next(i for i, c in enumerate(counts) if c)
    assert counts[first] < max(counts), counts


def test_operational_messages_overtake_a_100k_bulk_campaign_on_the_same_instance(
    pipeline: LocalPipeline,
) -> None:
    busy = INSTANCES[0]
    env = {
        "ZAPSTREAM_WORKER_INSTANCE_RATES": orjson.dumps(
            {busy: {"rate_per_s": 50, "burst": 5}}
        ).decode()
    }
    _start_workers(pipeline, 1, env)
    campaign = 100_000
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, priority, purpose) "
            "SELECT %s, jsonb_build_object('type', 'text', 'to', '+55 11 8' || lpad(n::text, 8, "
            "'0'), 'text', 'campaign ' || n), 'campaign-' || n, 'bulk', 'campaign' "
            "FROM generate_series(1, %s) AS n",
            (busy, campaign),
        )
        # The insert position, not pg_current_wal_lsn(): that is the write position, which
        # lags unflushed commits (synchronous_commit=off here), so the slot can pass it
        # before the campaign left PostgreSQL.
        end_lsn = str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])  # type: ignore[index]
    # The whole campaign is in Kafka (the relay confirmed past it: operational commits are
    # not behind it in the WAL any more) and the instance busy with it.
    wait_until(
        lambda: slot_confirmed(pipeline.dsn, "zapstream_outbox", end_lsn),
        120,
        "the relay streaming the campaign into Kafka",
    )
    wait_until(
        lambda: len(pipeline.sim_messages()) >= 200, 120, "the campaign reaching the gateway"
    )
    load = OfferedLoad(pipeline.dsn, rate=5, seconds=20, instances=[busy]).start()
    load.join()
    _wait_delivered(pipeline, list(load.committed), 60)
    arrivals = _arrivals(pipeline, set(load.committed))
    latencies = sorted(arrivals[k] - load.committed[k] for k in load.committed)
    sent = pipeline.sim_messages()
    bulk_sent = sum(1 for m in sent if str(m.get("text", "")).startswith("campaign "))
    window = [float(m["arrived_at"]) for m in sent if m.get("instance") == busy]
    report = audit(list(load.committed), sent)
    print(
        f"\n{campaign:,}-message campaign on {busy} (50/s) with 5/s operational: operational "
        f"p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, p99 {_p99(latencies) * 1000:.0f} "
        f"ms over {len(latencies)}; campaign messages sent so far {bulk_sent:,}; most in any "
        f"1 s window on the instance {_max_in_any_second(window)} "
        f"({_max_in_any_second(window, 1.0 - ARRIVAL_JITTER_S)} in any "
        f"{1.0 - ARRIVAL_JITTER_S:g} s); "
        f"duplicates {report.duplicate_count}"
    )
    produced: dict[str, float] = {}  # each intent's Kafka timestamp (the relay's produce)
    for r in read_topic(pipeline.kafka.bootstrap, pipeline.topics.intents):
        try:
            key = IntentCaptured.loads(r.value).idempotency_key
        except ContractError:
            continue  # a command or a receipt
        if key in load.committed:
            produced[key] = r.timestamp_ms / 1000
    relay = sorted(produced[k] - load.committed[k] for k in load.committed)
    worker = sorted(arrivals[k] - produced[k] for k in load.committed)
    print(
        f"operational hops, p50/p99: commit -> Kafka {relay[len(relay) // 2] * 1000:.0f}/"
        f"{_p99(relay) * 1000:.0f} ms, Kafka -> gateway {worker[len(worker) // 2] * 1000:.0f}/"
        f"{_p99(worker) * 1000:.0f} ms"
    )
    order = sorted(load.committed, key=lambda k: load.committed[k])
    slow = [
        (n, round(arrivals[k] - produced[k], 2))
        for n, k in enumerate(order)
        if arrivals[k] - produced[k] > 0.3
    ]
    print(f"operational messages over 300 ms at the worker (index, seconds): {slow}")
    # Measured p99: 51 ms quiet, 41 ms beside the suite's heaviest files. In arrival order
    # behind the campaign's sends in flight (ZAPSTREAM_WORKER_MAX_IN_FLIGHT_BULK, 128, at
    # 50/s) an operational message would wait about 2.6 s: the bound is half of that.
    assert _p99(latencies) <= 1.25
    # Rate + burst in any second at the worker, seen through the HTTP hop's jitter.
    assert _max_in_any_second(window, 1.0 - ARRIVAL_JITTER_S) <= 50 + 5
    assert bulk_sent < campaign  # the campaign was still going: it did not simply finish first
    assert report.duplicate_count == 0 and not report.order_violations


def test_an_operator_pause_holds_an_instance_until_resumed(pipeline: LocalPipeline) -> None:
    held, free = INSTANCES[0], INSTANCES[1]
    (worker,) = _start_workers(pipeline, 1, {})
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        pause_instance(conn, held, reason="number under review", actor="ana")
    wait_until(
        lambda: worker.metric("zapstream_control_paused", kind="instance", target=held) == 1,
        60,
        "the worker learning the pause",
    )
    load = OfferedLoad(pipeline.dsn, rate=40, seconds=1, instances=[held, free]).start()
    load.join()
    _wait_delivered(pipeline, load.keys_by_instance[free], 60)
    wait_until(
        lambda: worker.metric("zapstream_parked_conversations") >= 1,
        30,
        "the held instance's conversations parked",
    )
    assert not _arrivals(pipeline, set(load.keys_by_instance[held]))
    pending = count_rows(
        pipeline.dsn,
        "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = ANY(%s) AND status = 'PENDING'",
        (load.keys_by_instance[held],),
    )
    assert pending == len(load.keys_by_instance[held])
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        resume_instance(conn, held, reason="review passed", actor="ana")
    _wait_delivered(pipeline, load.keys_by_instance[held], 60)
    report = audit(list(load.committed), pipeline.sim_messages())
    print(
        f"\n{held} paused by an operator: {pending} messages held while {free} flowed; "
        f"after the resume {report.accepted_unique} accepted, duplicates "
        f"{report.duplicate_count}, order violations {len(report.order_violations)}"
    )
    assert report.duplicate_count == 0 and not report.order_violations
