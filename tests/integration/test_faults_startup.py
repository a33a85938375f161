"""Start-up faults: `zapstream doctor`, topic checks before a worker/relay starts, config errors.

Real processes only: PostgreSQL clusters (one with ``wal_level=replica``), a fresh
topic namespace per test where topics matter (a topic prefix of its own on the process's
shared Apache Kafka broker, :mod:`devtools.stack.shared_broker`; a fresh Tansu with
``DEVSTACK_BROKER=tansu``), the gateway simulator as a subprocess, and
``python -m connectors.cli`` run as a subprocess with the environment an
operator would set. A healthy baseline (doctor exits 0 with every line OK) keeps
each fault test honest: exactly the broken check fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from connectors.ops.topics import ensure_topics
from connectors.outbox.migrate import shipped_migrations
from devtools.stack import shared_broker
from devtools.stack.devstack import ManagedProcess, PostgresCluster, TansuBroker, find_free_port
from devtools.stack.kafka_broker import KafkaBroker
from devtools.stack.local_pipeline import REFERENCE_KEY, WEBHOOK_SECRET, default_broker
from streams.kernel.contract import TopicNames
from streams.kernel.settings import KafkaSettings
from streams.kernel.topics_check import partition_counts
from tests.integration.support import wait_until, zapstream

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "doctor-test-key"
PARTITIONS = 8
BROKER = default_broker()


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The gateway simulator as a subprocess (the CLI runs synchronously beside it)."""
    port = find_free_port()
    log_path = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = ManagedProcess(
        [
            sys.executable,
            "-m",
            "devtools.simulator.gateway_sim",
            "--port",
            str(port),
            "--api-key",
            API_KEY,
        ],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        log_path=log_path,
        name="gateway-sim",
    )
    with proc:
        wait_until(lambda: _port_open(port), 20, "the gateway simulator to listen")
        yield f"http://127.0.0.1:{port}"


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def logical_pg() -> Iterator[PostgresCluster]:
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def replica_pg() -> Iterator[PostgresCluster]:
    with PostgresCluster(wal_level="replica") as cluster:
        yield cluster


@dataclasses.dataclass(frozen=True)
class Namespace:
    """Where a test's topics live: a broker and the topic prefix no other test uses."""

    bootstrap: str
    names: TopicNames

    @property
    def prefix(self) -> str:
        return self.names.prefix


@pytest.fixture
def kafka() -> Iterator[Namespace]:
    """A fresh namespace per test: the topic state is what each test is about. On Apache
    Kafka a prefix of its own on the shared broker (deleted afterwards), on Tansu (which
    the tests run without prefixes) a fresh broker."""
    if BROKER == "tansu":
        with TansuBroker() as broker:
            yield Namespace(broker.bootstrap, TopicNames())
        return
    broker = shared_broker.shared_broker()  # started on first use
    namespace = Namespace(broker.bootstrap, TopicNames(shared_broker.next_prefix()))
    try:
        yield namespace
    finally:
        shared_broker.delete_namespace(namespace.bootstrap, namespace.prefix)


_db_counter = 0


def fresh_db(cluster: PostgresCluster) -> str:
    global _db_counter
    _db_counter += 1
    return cluster.create_database(f"startup_{_db_counter}")


def base_env(
    dsn: str, bootstrap: str, sim_url: str, *, prefix: str = "", **extra: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
    env.update(
        {
            "PYTHONPATH": str(REPO_ROOT),
            "ZAPSTREAM_DATABASE_URL": dsn,
            # Slots are per cluster: one per test database.
            "ZAPSTREAM_RELAY_SLOT": "slot_" + dsn.rsplit("/", 1)[-1],
            "ZAPSTREAM_KAFKA_BROKERS": bootstrap,
            "ZAPSTREAM_KAFKA_FLAVOR": BROKER,
            "ZAPSTREAM_KAFKA_TOPIC_PREFIX": prefix,
            "ZAPSTREAM_KAFKA_PARTITIONS": str(PARTITIONS),
            "ZAPSTREAM_GATEWAY": "stackzap",
            "STACKZAP_API_URL": sim_url,
            "STACKZAP_API_KEY": API_KEY,
            # What the worker and the webhook refuse to start without (checked before Kafka).
            "ZAPSTREAM_REFERENCE_KEY": REFERENCE_KEY,
            "ZAPSTREAM_WEBHOOK_SECRET": WEBHOOK_SECRET,
        }
    )
    env.update(extra)
    return env


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def failed_checks(stdout: str) -> list[str]:
    return [line for line in lines(stdout) if line.startswith("FAIL")]


def topics_of(kafka: Namespace) -> dict[str, int]:
    """The namespace's topics (the shared broker holds other tests' too) and their
    partition counts."""
    counts = asyncio.run(partition_counts(KafkaSettings(brokers=kafka.bootstrap)))
    return {name: n for name, n in counts.items() if name.startswith(kafka.prefix)}


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(run())


def healthy(cluster: PostgresCluster, kafka: Namespace, sim_url: str) -> dict[str, str]:
    """A database migrated with its slot, and every topic: what `make dev` sets up."""
    env = base_env(fresh_db(cluster), kafka.bootstrap, sim_url, prefix=kafka.prefix)
    assert zapstream(["db", "migrate"], env)[0] == 0
    assert zapstream(["topics", "ensure"], env)[0] == 0
    return env


# --- doctor ----------------------------------------------------------------------------------


def test_doctor_all_ok_on_a_healthy_setup(
    logical_pg: PostgresCluster, kafka: Namespace, sim_url: str
) -> None:
    env = healthy(logical_pg, kafka, sim_url)
    code, out, _ = zapstream(["doctor"], env)
    checks = [line for line in lines(out) if not line.startswith("zapstream doctor:")]
    assert code == 0, out
    names = {line.split()[1].rstrip(":") for line in checks}
    expected = {"postgres", "wal_level", "migrations", "publication", "slot", "kafka", "topics"}
    assert expected | {"gateway", "role", "failover"} == names
    # The cluster's superuser owns the outbox: its role is not a component's to check.
    [role] = [line for line in checks if line.split()[1] == "role:"]
    assert role.startswith("SKIP") and "--component" in role, role
    # No standby here (and on 15/16 no failover slots): nothing to fail over to.
    [failover] = [line for line in checks if line.split()[1] == "failover:"]
    assert failover.startswith("SKIP"), failover
    assert all(line.startswith("OK") for line in checks if line not in (role, failover)), checks

    code, out, _ = zapstream(["doctor", "--json"], env)
    report = json.loads(out)
    print(f"checks={len(report['checks'])} ok={report['ok']}")
    assert code == 0 and report["ok"] is True


def test_doctor_names_rejected_gateway_credentials(
    logical_pg: PostgresCluster, kafka: Namespace, sim_url: str
) -> None:
    env = {**healthy(logical_pg, kafka, sim_url), "STACKZAP_API_KEY": "wrong"}
    code, out, _ = zapstream(["doctor"], env)
    failed = failed_checks(out)
    assert code == 1
    assert len(failed) == 1 and "gateway" in failed[0] and "STACKZAP_API_KEY" in failed[0]
    assert "wrong" not in out


def test_doctor_diagnoses_wal_level_replica(
    replica_pg: PostgresCluster, kafka: Namespace, sim_url: str
) -> None:
    env = base_env(fresh_db(replica_pg), kafka.bootstrap, sim_url, prefix=kafka.prefix)
    assert zapstream(["db", "migrate", "--no-slot"], env)[0] == 0
    assert zapstream(["topics", "ensure"], env)[0] == 0
    code, out, _ = zapstream(["doctor"], env)
    wal = [line for line in failed_checks(out) if line.startswith("FAIL wal_level")]
    assert code == 1
    assert len(wal) == 1
    assert "'replica'" in wal[0] and "wal_level=logical" in wal[0]


def test_doctor_names_a_missing_migration(
    logical_pg: PostgresCluster, kafka: Namespace, sim_url: str
) -> None:
    env = healthy(logical_pg, kafka, sim_url)
    last = shipped_migrations()[-1]
    with psycopg.connect(env["ZAPSTREAM_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("DELETE FROM schema_migrations WHERE version = %s", (last.version,))
    code, out, _ = zapstream(["doctor"], env)
    failed = failed_checks(out)
    assert code == 1
    assert len(failed) == 1, failed
    assert f"{last.version:04d}_{last.name}" in failed[0]
    assert "zapstream db migrate" in failed[0]


# --- topics checked before a worker or relay starts ------------------------------------------


def test_wrong_partition_count_refused_by_doctor_worker_and_relay(
    logical_pg: PostgresCluster, kafka: Namespace, sim_url: str
) -> None:
    env = base_env(fresh_db(logical_pg), kafka.bootstrap, sim_url, prefix=kafka.prefix)
    assert zapstream(["db", "migrate"], env)[0] == 0
    intents = kafka.names.intents
    create_topic(kafka.bootstrap, intents, 4)  # as Tansu's auto-creation would have

    code, out, _ = zapstream(["doctor"], env)
    mismatch = [line for line in failed_checks(out) if f"{intents} has 4 partitions" in line]
    assert code == 1 and len(mismatch) == 1

    for command in ("worker", "relay"):
        code, _, err = zapstream([command], env, timeout_s=60)
        assert code == 2, command
        assert len(lines(err)) == 1, err
        assert f"topic {intents} has 4 partitions" in err
        assert f"ZAPSTREAM_KAFKA_PARTITIONS says {PARTITIONS}" in err

    after = topics_of(kafka)
    print(f"topics after the refused starts: {after}")
    assert after == {intents: 4}, "the checks must not create (auto-create) any topic"


def test_services_refuse_missing_topics_without_creating_them(
    logical_pg: PostgresCluster, kafka: Namespace, sim_url: str
) -> None:
    env = base_env(fresh_db(logical_pg), kafka.bootstrap, sim_url, prefix=kafka.prefix)
    for command in ("worker", "relay", "sink", "webhook"):
        code, _, err = zapstream([command], env, timeout_s=60)
        assert code == 2, command
        assert len(lines(err)) == 1, err
        assert "does not exist: run `zapstream topics ensure`" in err
    after = topics_of(kafka)
    print(f"topics after the refused starts: {after}")
    assert not any(name.startswith(kafka.prefix + "zapstream") for name in after), after


# --- configuration errors --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "relay", "sink", "webhook", "doctor"])
def test_misspelt_variable_is_named_with_a_suggestion(command: str) -> None:
    env = base_env("postgresql://postgres@127.0.0.1:1/x", "127.0.0.1:1", "http://127.0.0.1:1")
    env["ZAPSTREAM_WORKER_MAX_INFLIGHT"] = "3"
    code, out, err = zapstream([command], env, timeout_s=60)
    assert code == 2
    assert lines(err) == [
        "zapstream: ZAPSTREAM_WORKER_MAX_INFLIGHT: unknown variable, no zapstream setting reads "
        "it (did you mean ZAPSTREAM_WORKER_MAX_IN_FLIGHT?)"
    ]
    assert out == ""


@pytest.mark.parametrize(
    ("command", "name", "value", "expected"),
    [
        ("worker", "ZAPSTREAM_KAFKA_PARTITIONS", "0", "ZAPSTREAM_KAFKA_PARTITIONS: must be >= 1"),
        (
            "relay",
            "ZAPSTREAM_RELAY_MAX_IN_FLIGHT",
            "many",
            "ZAPSTREAM_RELAY_MAX_IN_FLIGHT: must be",
        ),
        (
            "worker",
            "ZAPSTREAM_GATEWAY",
            "whatsapp",
            "ZAPSTREAM_GATEWAY: must be 'stackzap', 'zapapi' or",
        ),
        (
            "worker",
            "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S",
            "[1,",
            "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S: not valid JSON",
        ),
        # Issue 18, findings 2 and 8: short keys are refused, by name, never shown.
        ("webhook", "ZAPSTREAM_WEBHOOK_SECRET", "short", "ZAPSTREAM_WEBHOOK_SECRET is shorter"),
        ("worker", "ZAPSTREAM_REFERENCE_KEY", "short", "ZAPSTREAM_REFERENCE_KEY is shorter"),
        ("webhook", "ZAPSTREAM_REFERENCE_KEY", "", "ZAPSTREAM_REFERENCE_KEY is not set"),
    ],
)
def test_invalid_value_is_one_line_naming_the_variable(
    command: str, name: str, value: str, expected: str
) -> None:
    env = base_env("postgresql://postgres@127.0.0.1:1/x", "127.0.0.1:1", "http://127.0.0.1:1")
    env[name] = value
    code, _, err = zapstream([command], env, timeout_s=60)
    assert code == 2
    assert len(lines(err)) == 1, err
    assert lines(err)[0].startswith(f"zapstream: {expected}"), err


def test_unreachable_database_is_one_line_without_the_password() -> None:
    """A one-shot command (db migrate) cannot wait: one line naming the setting, exit 2."""
    closed = find_free_port()
    dsn = f"postgresql://app:s3cr3t-pw@127.0.0.1:{closed}/zapstream"
    env = base_env(dsn, f"127.0.0.1:{closed}", "http://127.0.0.1:1")

    code, _, err = zapstream(["db", "migrate"], env, timeout_s=60)
    assert code == 2
    assert len(lines(err)) == 1, err
    assert "ZAPSTREAM_DATABASE_URL" in err and "s3cr3t-pw" not in err


def test_a_service_waits_out_a_broker_that_is_not_up_yet(
    logical_pg: PostgresCluster, tmp_path: Path
) -> None:
    """Kafka down at start is transient: the worker logs it once, waits, and starts on it."""
    port = find_free_port()
    sim_port = find_free_port()
    env = base_env(fresh_db(logical_pg), f"127.0.0.1:{port}", f"http://127.0.0.1:{sim_port}")
    env["ZAPSTREAM_WORKER_WEB_PORT"] = str(find_free_port())
    env["ZAPSTREAM_WORKER_DATA_DIR"] = str(tmp_path / "worker")
    env["ZAPSTREAM_KAFKA_SESSION_TIMEOUT_S"] = "6"
    env["ZAPSTREAM_KAFKA_HEARTBEAT_INTERVAL_S"] = "1"
    worker = ManagedProcess(
        [sys.executable, "-m", "connectors.cli", "worker"],
        env=env,
        log_path=tmp_path / "worker.log",
        name="worker",
    )
    settings = KafkaSettings(brokers=f"127.0.0.1:{port}", partitions=PARTITIONS)
    broker: KafkaBroker | TansuBroker
    if BROKER == "kafka":
        # The topics exist before the worker can reach the broker, as in a deployment
        # (`topics ensure` first). Created while the worker connects they would race it:
        # missing, they are refused; just created, a partition whose leader is not serving
        # yet answers NotLeaderForPartition (Apache Kafka only), which starts an outage.
        broker = KafkaBroker(port=port)
        broker.start()
        asyncio.run(ensure_topics(settings))
        broker.terminate()  # the log dirs, and so the topics, stay for the restart
    with worker:  # starts it
        worker.wait_for_log(r"Kafka unavailable, .*ZAPSTREAM_KAFKA_BROKERS=", timeout_s=60)
        if BROKER == "kafka":
            broker.restart()
        else:
            broker = TansuBroker(port=port)
            broker.start()
            asyncio.run(ensure_topics(settings))
        try:
            worker.wait_for_log(r"Kafka available again after", timeout_s=60)
            worker.wait_for_log(r"\[\^Worker\]: Ready", timeout_s=120)
            assert worker.is_running
            # Read while the broker runs: stopping it is an outage the worker logs too.
            text = (tmp_path / "worker.log").read_text()
        finally:
            broker.stop()
        assert text.count("Kafka unavailable") == 1, text[-3000:]


def test_relay_names_an_invalidated_slot_and_the_recovery(kafka: Namespace, sim_url: str) -> None:
    """PostgreSQL invalidates a slot that needs more WAL than ``max_slot_wal_keep_size``
    (SQLSTATE 55000, like a wrong wal_level): the relay says what happened and how to
    recover, not "set wal_level=logical". Its own cluster: the setting is cluster-wide."""
    with PostgresCluster() as cluster:
        env = healthy(cluster, kafka, sim_url)
        slot = env["ZAPSTREAM_RELAY_SLOT"]
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("CREATE TABLE wal_filler (v text)")
            for _ in range(3):  # past the kept size by whole segments, then a checkpoint
                conn.execute(
                    "INSERT INTO wal_filler SELECT repeat('x', 1000) FROM generate_series(1, 20000)"
                )
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
            status = conn.execute(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
        assert status == ("lost",), status

        code, _, err = zapstream(["relay"], env, timeout_s=60)
        assert code == 2
        [line] = lines(err)
        assert "replication slot was invalidated" in line, line
        assert "pg_drop_replication_slot" in line and "restreams every PENDING row" in line
        assert "wal_level" not in line
