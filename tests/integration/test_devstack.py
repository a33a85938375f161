"""The throwaway PostgreSQL, Tansu and subprocess managers behind ``make dev`` and these tests.

Tansu is the other broker (``make dev`` with ``--kafka tansu``, the tests with
``DEVSTACK_BROKER=tansu``); Apache Kafka's, the default, is tested in
``test_kafka_broker.py``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from devtools.stack.devstack import (
    DevStackError,
    ManagedProcess,
    PostgresCluster,
    TansuBroker,
    _metadata_brokers,
    find_free_port,
)

pytestmark = pytest.mark.integration


def _port_is_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except ConnectionRefusedError:
        return True


def _process_gone(pid: int) -> bool:
    """True once ``pid`` has exited: absent, or a zombie nobody reaped yet."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return status.rsplit(")", 1)[1].split()[0] == "Z"


def _poll(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_cluster_logical_replication_and_cleanup() -> None:
    cluster = PostgresCluster()
    assert cluster.port != 5432
    with cluster:
        cluster_dir = cluster.cluster_dir
        assert cluster.log_path.exists()
        with psycopg.connect(cluster.dsn()) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
            assert conn.execute("SHOW port").fetchone() == (str(cluster.port),)

        dsn = cluster.create_database("devstack_check")
        assert dsn == f"postgresql://postgres@127.0.0.1:{cluster.port}/devstack_check"
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT slot_name FROM pg_create_logical_replication_slot('s', 'pgoutput')"
            ).fetchone()
            assert row == ("s",)
            slots = conn.execute(
                "SELECT slot_name, plugin, database FROM pg_replication_slots"
            ).fetchall()
            assert slots == [("s", "pgoutput", "devstack_check")]

    assert _port_is_closed(cluster.port)
    assert not cluster_dir.exists()
    cluster.stop()  # idempotent


def test_postgres_cluster_start_failure_includes_server_log() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy_port = blocker.getsockname()[1]
        cluster = PostgresCluster(port=busy_port, start_timeout_s=10)
        with pytest.raises(DevStackError, match="could not bind") as excinfo:
            cluster.start()
    assert "pg_ctl start failed" in str(excinfo.value)
    cluster.stop()


# --------------------------------------------------------------------------- Tansu


@pytest.fixture
def broker() -> Iterator[TansuBroker]:
    with TansuBroker() as b:
        yield b


async def test_tansu_round_trip_on_explicit_four_partition_topic(broker: TansuBroker) -> None:
    topic = "devstack.round-trip"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        assert await producer.partitions_for(topic) == {0, 1, 2, 3}
        for partition in range(4):
            await producer.send_and_wait(
                topic, f"value-{partition}".encode(), key=b"k", partition=partition
            )
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(4)])
        received: dict[int, bytes | None] = {}
        async with asyncio.timeout(15):
            while len(received) < 4:
                record = await consumer.getone()
                received[record.partition] = record.value
    finally:
        await consumer.stop()
    assert received == {p: f"value-{p}".encode() for p in range(4)}


async def test_tansu_names_itself_in_metadata_even_from_a_running_loop(
    broker: TansuBroker,
) -> None:
    """The readiness probe (aiokafka's bootstrap) sees the broker advertise its address;
    it runs its own loop, so a caller inside one (an async fixture) can use it."""
    brokers = _metadata_brokers(broker.port)
    assert [(host, port) for _, host, port in brokers] == [("127.0.0.1", broker.port)]


def test_the_metadata_probe_of_a_silent_listener_fails_within_its_bound() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections complete in the backlog; nothing ever answers
        started = time.monotonic()
        with pytest.raises(DevStackError, match="no metadata from"):
            _metadata_brokers(silent.getsockname()[1], timeout_s=0.5)
        assert time.monotonic() - started < 5


def test_tansu_stop_closes_port_and_is_idempotent() -> None:
    broker = TansuBroker()
    broker.start()
    assert broker.bootstrap == f"127.0.0.1:{broker.port}"
    log_path = broker.log_path
    assert "ready" in log_path.read_text()
    broker.stop()
    assert _port_is_closed(broker.port)
    assert not log_path.exists()  # temporary log directory removed
    broker.stop()


def test_tansu_start_failure_includes_log(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        broker = TansuBroker(port=blocker.getsockname()[1], log_path=tmp_path / "tansu.log")
        with pytest.raises(DevStackError, match="last lines of"):
            broker.start()
    assert (tmp_path / "tansu.log").exists()  # a caller-chosen log is kept


# --------------------------------------------------------------------------- processes


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_managed_process_log_wait_and_kill(tmp_path: Path) -> None:
    log = tmp_path / "sleeper.log"
    proc = ManagedProcess(
        _python("print('sleeper ready on', 42); import time; time.sleep(60)"),
        log_path=log,
        name="sleeper",
    )
    with proc:
        match = proc.wait_for_log(r"ready on (\d+)", timeout_s=10)
        assert match.group(1) == "42"
        assert proc.is_running

        proc.kill()
        assert proc.wait(timeout_s=5) == -9
        assert not proc.is_running

        with pytest.raises(DevStackError, match="exited with status -9") as excinfo:
            proc.wait_for_log("never printed", timeout_s=10)
        assert "sleeper ready on 42" in str(excinfo.value)


def test_managed_process_exit_is_reported_without_waiting_for_timeout(tmp_path: Path) -> None:
    proc = ManagedProcess(
        _python("import sys; print('boom: bad config'); sys.exit(3)"),
        log_path=tmp_path / "crasher.log",
        name="crasher",
    )
    with proc:
        started = time.monotonic()
        with pytest.raises(DevStackError, match="exited with status 3") as excinfo:
            proc.wait_for_log("ready", timeout_s=30)
        assert time.monotonic() - started < 10
        assert "boom: bad config" in str(excinfo.value)


def test_managed_process_timeout_and_terminate(tmp_path: Path) -> None:
    proc = ManagedProcess(
        _python("import time; print('up'); time.sleep(60)"),
        log_path=tmp_path / "quiet.log",
        name="quiet",
    )
    with proc:
        with pytest.raises(DevStackError, match=r"did not log /ready/ within 0.3 s"):
            proc.wait_for_log("ready", timeout_s=0.3)
        with pytest.raises(TimeoutError):
            proc.wait(timeout_s=0.1)
        assert proc.terminate(timeout_s=5) == -15


def test_managed_process_restart_searches_only_the_new_run(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    counter.write_text("0")
    code = (
        "import pathlib, sys\n"
        "p = pathlib.Path(sys.argv[1]); n = int(p.read_text()) + 1; p.write_text(str(n))\n"
        "print('run', n)\n"
    )
    proc = ManagedProcess(
        [*_python(code), str(counter)], log_path=tmp_path / "twice.log", name="twice"
    )
    with proc:
        proc.wait_for_log(r"^run 1$", timeout_s=10)
        assert proc.wait(timeout_s=5) == 0
    with proc:
        assert proc.wait(timeout_s=5) == 0
        with pytest.raises(DevStackError, match="exited with status 0"):
            proc.wait_for_log(r"^run 1$", timeout_s=10)
        proc.wait_for_log(r"^run 2$", timeout_s=10)
        proc.wait_for_log(r"^run 1$", timeout_s=10, since=0)


def test_managed_process_stop_kills_its_process_group(tmp_path: Path) -> None:
    proc = ManagedProcess(
        _python(
            "import subprocess, sys\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print('child', child.pid, flush=True)\n"
            "child.wait()\n"
        ),
        log_path=tmp_path / "parent.log",
        name="parent",
        env={"PATH": "/usr/bin:/bin"},
    )
    with proc:
        child_pid = int(proc.wait_for_log(r"child (\d+)", timeout_s=10).group(1))
        assert not _process_gone(child_pid)
    assert _poll(lambda: _process_gone(child_pid), timeout_s=5)


def test_find_free_port_is_bindable() -> None:
    port = find_free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
