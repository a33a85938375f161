"""Failover of PostgreSQL under a running pipeline: the primary SIGKILLed mid-stream, a streaming
standby promoted, and nothing lost, sent twice or reordered at the gateway.

- **With a synchronised failover slot** (PostgreSQL 17+): the standby runs
  ``sync_replication_slots``, ``hot_standby_feedback`` and a physical slot the primary names in
  ``synchronized_standby_slots``; commits wait for it (``synchronous_standby_names``). The relay
  created its slot with ``failover``; after the promotion it resumes from the standby's copy.
- **Without one** (the standby does not synchronise slots, as on PostgreSQL 15/16): the slot is
  gone after the promotion; the relay recreates it and restreams every PENDING job itself.

Every service reaches PostgreSQL through one multi-host DSN with
``target_session_attrs=read-write``; the application's writer retries a transaction whose commit
it did not hear about, with the same idempotency keys. No zapstream process is restarted.
Each test prints: sent, accepted, duplicates, order violations, lost.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from connectors.cdc.provisioning import ensure_replication
from connectors.outbox.migrate import migrate
from devtools.stack.delivery_audit import DeliveryReport
from devtools.stack.dev_runner import demo_key, enqueue_demo_message
from devtools.stack.devstack import ManagedProcess, PostgresCluster, find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from devtools.stack.postgres_binaries import postgres_bin_dir, postgres_major
from devtools.stack.postgres_standby import PHYSICAL_SLOT, StandbyCluster, failover_dsn
from tests.integration.support import Arrivals, count_rows, wait_for_status, wait_until

pytestmark = pytest.mark.integration

SLOT = "zapstream_outbox"
MESSAGES = 3_000
CONVERSATIONS = 30
PER_TRANSACTION = 10
INSTANCES = 5


class RetryingWriter(threading.Thread):
    """The application: transactions of outbox rows, each retried with the same keys until its
    commit is heard (enqueue is idempotent by key), through the multi-host DSN."""

    def __init__(self, dsn: str, run: str, *, pause_s: float) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.run_id = run
        self.pause_s = pause_s
        self.keys: list[str] = []
        self.committed = 0
        self.retried_transactions = 0
        self.error: BaseException | None = None
        self.hold_at = MESSAGES // 5
        self.go_on = threading.Event()
        """Set by the test when the failover may come: the writer holds at ``hold_at`` until."""

    def run(self) -> None:
        try:
            self._write()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _chunk(self, start: int) -> list[tuple[str, str, int]]:
        rows = []
        for i in range(start, min(MESSAGES, start + PER_TRANSACTION)):
            conversation = i % CONVERSATIONS
            instance = f"inst-{conversation % INSTANCES:02d}"
            rows.append(
                (
                    demo_key(self.run_id, instance, conversation, i // CONVERSATIONS),
                    instance,
                    conversation,
                )
            )
        return rows

    def _write(self) -> None:
        conn: psycopg.Connection | None = None
        deadline = time.monotonic() + 300
        for start in range(0, MESSAGES, PER_TRANSACTION):
            chunk = self._chunk(start)
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, connect_timeout=2)
                    with conn.transaction():
                        for key, instance, conversation in chunk:
                            enqueue_demo_message(conn, key, instance, conversation)
                    break
                except psycopg.OperationalError:
                    if time.monotonic() > deadline:
                        raise
                    self.retried_transactions += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.1)
            self.keys.extend(key for key, _, _ in chunk)
            self.committed = len(self.keys)
            time.sleep(self.pause_s)
            if self.committed == self.hold_at and not self.go_on.wait(timeout=180):
                raise TimeoutError("the test never let the writer go on")
        if conn is not None:
            conn.close()


def _print_figures(what: str, sent: int, report: DeliveryReport) -> None:
    print(
        f"\n[{what}] sent={sent} accepted={report.accepted_unique} "
        f"duplicates={report.duplicate_count} order_violations={len(report.order_violations)} "
        f"lost={len(report.missing)}"
    )


def _synced_slot(primary_dsn: str, dsn: str) -> tuple[bool, bool] | None:
    """(synced, temporary) of the relay's slot on the standby, None while it has none.

    The standby takes the copy once the slot's catalog xmin passed its own, which moves with
    the running-transactions record PostgreSQL logs every 15 s: one is logged now, so the
    copy is ready in a second or two instead.
    """
    with psycopg.connect(primary_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_log_standby_snapshot()")
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
        ).fetchone()
    return None if row is None else (bool(row[0]), bool(row[1]))


def _start_services(pipeline: LocalPipeline, dsn: str, metrics_port: int) -> ManagedProcess:
    env = {"ZAPSTREAM_DATABASE_URL": dsn}
    pipeline.start_sink(env=env)
    pipeline.start_worker(env=env)
    return pipeline.start_relay(
        "relay-failover",
        env={
            **env,
            "ZAPSTREAM_RELAY_METRICS_PORT": str(metrics_port),
            "ZAPSTREAM_RELAY_SLOT_CHECKPOINT_INTERVAL_S": "1",
            "ZAPSTREAM_RELAY_RECONNECT_MAX_S": "2",
        },
    )


def _failover_mid_stream(
    pipeline: LocalPipeline, standby: StandbyCluster, writer: RetryingWriter
) -> float:
    """Wait for a third of the rows, SIGKILL the primary, promote the standby a second later
    (as an HA manager would); the seconds the database accepted no writes."""
    wait_until(lambda: writer.committed >= MESSAGES * 2 // 5, 120, "the failover's row count")
    killed_at = time.monotonic()
    pipeline.postgres.crash()
    print(f"[failover] primary SIGKILLed at {writer.committed} committed")
    time.sleep(1.0)  # the HA manager's detection time: the services meet a dead primary
    standby.promote()
    return time.monotonic() - killed_at


def _assert_delivered_once(what: str, pipeline: LocalPipeline, writer: RetryingWriter) -> None:
    writer.join(timeout=300)
    assert writer.error is None, writer.error
    assert len(writer.keys) == MESSAGES
    report = Arrivals(pipeline).wait_for(writer.keys, timeout_s=240)
    _print_figures(what, len(writer.keys), report)
    retried = writer.retried_transactions
    print(f"[{what}] application transactions retried after the failover: {retried}")
    assert not report.missing, f"{report.summary()}; e.g. {sorted(report.missing)[:5]}"
    assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}"
    assert report.order_violations == (), report.order_violations[:5]
    assert report.accepted_unique == MESSAGES


STORY = re.compile(
    r"^.*(unavailable|available again|promoted|slot gap|streaming slot|replication slot).*$", re.M
)


def _relay_story(relay: ManagedProcess, since: int) -> str:
    """The relay's lines since the failover; printed, and its outage lines counted."""
    text = relay.log_since(since)
    for line in STORY.finditer(text):
        print(f"  relay: {line.group(0)[:200]}")
    return text


def _assert_outage_logged_once(story: str) -> None:
    lines = re.findall(r"^.*PostgreSQL.* unavailable.*$", story, re.M)
    assert len(lines) == 1, lines
    assert len(re.findall(r"PostgreSQL.* available again", story)) == 1, story[-2000:]


def _gap_metrics(port: int) -> tuple[float, float]:
    """(gaps found for a missing slot, jobs restreamed) from the relay's ``/metrics``."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.search(
        r'^zapstream_relay_slot_gaps_total\{reason="missing"\} ([0-9.e+]+)$', text, re.M
    )
    restreamed = re.search(r"^zapstream_relay_slot_gap_restreamed_total ([0-9.e+]+)$", text, re.M)
    return (
        float(found.group(1)) if found else 0.0,
        float(restreamed.group(1)) if restreamed else 0.0,
    )


@pytest.fixture
def pipeline() -> Iterator[LocalPipeline]:
    # synchronous_commit=on: with synchronous_standby_names, a commit the application heard
    # about is on the standby too (else PostgreSQL itself may lose it in a failover).
    primary = PostgresCluster(settings={"synchronous_commit": "on"})
    with LocalPipeline(partitions=4, with_sink=False, postgres=primary) as p:
        yield p


def _synchronous(primary_dsn: str, *, slot_sync: bool) -> None:
    """Commits wait for the standby; with ``slot_sync``, so does the relay's slot."""
    with psycopg.connect(primary_dsn, autocommit=True) as conn:
        if slot_sync:
            conn.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{PHYSICAL_SLOT}'")
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{PHYSICAL_SLOT}'")
        conn.execute("SELECT pg_reload_conf()")


def test_the_relay_follows_a_promoted_standby_from_its_synchronised_failover_slot(
    pipeline: LocalPipeline,
) -> None:
    if postgres_major(postgres_bin_dir()) < 17:
        pytest.skip("failover slots need PostgreSQL 17+ (make test runs this on 18 in phase 3)")
    with StandbyCluster(
        pipeline.postgres,
        settings={"sync_replication_slots": "on", "hot_standby_feedback": "on"},
    ) as standby:
        _synchronous(pipeline.dsn, slot_sync=True)
        dsn = failover_dsn("postgres", pipeline.postgres, standby)
        metrics_port = find_free_port()
        relay = _start_services(pipeline, dsn, metrics_port)
        flagged = count_rows(
            pipeline.dsn,
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND failover",
            (SLOT,),
        )
        assert flagged == 1, "the relay creates its slot with failover on 17+"
        writer = RetryingWriter(dsn, uuid.uuid4().hex[:8], pause_s=0.03)
        writer.start()
        # The standby's copy becomes usable once the slot moved past what the standby has (its
        # sync worker naps up to 30 s while nothing changes): the writer holds until then.
        wait_until(
            lambda: _synced_slot(pipeline.dsn, standby.dsn()) == (True, False),
            120,
            "the slot synchronised",
            interval_s=0.5,
        )
        writer.go_on.set()
        print(f"\n[failover] the standby has a synchronised copy of the slot at {writer.committed}")
        since = relay.log_offset()
        outage_s = _failover_mid_stream(pipeline, standby, writer)
        print(f"[failover] no primary for {outage_s:.1f} s")
        _assert_delivered_once("failover", pipeline, writer)
        story = _relay_story(relay, since)
        _assert_outage_logged_once(story)
        # A copy that had not caught up is behind the relay's record: said, never restreamed.
        assert "slot gap" not in story, "the synchronised slot resumes: nothing to restream"
        wait_for_status(standby.dsn(), writer.keys, "ACCEPTED", 180)
        _assert_all_running(pipeline)


def test_a_standby_promoted_without_the_slot_gets_the_gap_restreamed_by_the_relay(
    pipeline: LocalPipeline,
) -> None:
    """As on PostgreSQL 15/16 (or a standby not synchronising slots): the new primary has no
    slot; the relay recreates it and restreams every PENDING job itself."""
    with StandbyCluster(pipeline.postgres) as standby:
        _synchronous(pipeline.dsn, slot_sync=False)
        dsn = failover_dsn("postgres", pipeline.postgres, standby)
        metrics_port = find_free_port()
        relay = _start_services(pipeline, dsn, metrics_port)
        writer = RetryingWriter(dsn, uuid.uuid4().hex[:8], pause_s=0.03)
        writer.go_on.set()
        writer.start()
        since = relay.log_offset()
        outage_s = _failover_mid_stream(pipeline, standby, writer)
        print(f"\n[no-slot-failover] no primary for {outage_s:.1f} s")
        line = relay.wait_for_log(GAP_LINE, timeout_s=60, since=since)
        _assert_delivered_once("no-slot-failover", pipeline, writer)
        story = _relay_story(relay, since)
        _assert_outage_logged_once(story)
        gaps, restreamed = _gap_metrics(metrics_port)
        print(
            f"[no-slot-failover] zapstream_relay_slot_gaps_total{{reason=missing}}={gaps} "
            f"zapstream_relay_slot_gap_restreamed_total={restreamed}"
        )
        assert gaps == 1.0 and restreamed == float(line.group(1))
        wait_for_status(standby.dsn(), writer.keys, "ACCEPTED", 180)
        _assert_all_running(pipeline)


GAP_LINE = r"slot gap on zapstream_outbox \(missing: [^)]*\): restreamed (\d+) PENDING jobs"


def _assert_all_running(pipeline: LocalPipeline) -> None:
    dead = [(p.name, p.returncode) for p in pipeline.processes if not p.is_running]
    assert not dead, f"processes exited: {dead}"


def test_a_slot_created_without_failover_becomes_a_failover_slot_at_the_relays_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A slot from before ZAPSTREAM_RELAY_SLOT_FAILOVER (or made by hand) is altered; a role
    without REPLICATION (``db migrate`` as the tables' owner) gets a warning, not a crash."""
    if postgres_major(postgres_bin_dir()) < 17:
        pytest.skip("failover slots need PostgreSQL 17+ (make test runs this on 18 in phase 3)")
    with PostgresCluster() as cluster:
        dsn = cluster.create_database("app")
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
            conn.execute("CREATE ROLE no_replication LOGIN")

        def failover_flag() -> int:
            query = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND failover"
            return count_rows(dsn, query, (SLOT,))

        ensure_replication(dsn, slot=SLOT, publication=SLOT, failover=False)
        assert failover_flag() == 0, "ZAPSTREAM_RELAY_SLOT_FAILOVER=false leaves it alone"
        ensure_replication(dsn.replace("postgres@", "no_replication@"), slot=SLOT, publication=SLOT)
        assert failover_flag() == 0
        assert "could not make slot zapstream_outbox a failover slot" in caplog.text
        ensure_replication(dsn, slot=SLOT, publication=SLOT)
        assert failover_flag() == 1
