"""The Apache Kafka dev broker's pure parts: the pin, its server properties, the Metadata
probe's bytes (against a scripted socket on loopback), the leader count, the broker choice."""

from __future__ import annotations

import re
import socket
import struct
import threading
from pathlib import Path

import pytest

from devtools.stack.kafka_broker import (
    KAFKA_POM,
    ClusterMetadata,
    KafkaBroker,
    KafkaCluster,
    PartitionMetadata,
    kafka_metadata,
    kafka_version,
)
from devtools.stack.local_pipeline import default_broker

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_the_pin_is_a_4x_release_and_the_makefile_reads_the_same_file() -> None:
    assert re.fullmatch(r"4\.\d+\.\d+", kafka_version())
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "devtools/stack/kafka/pom.xml" in makefile and KAFKA_POM.is_file()
    assert ".cache/" in (REPO_ROOT / ".gitignore").read_text().splitlines()


def test_one_node_is_a_quorum_of_itself_on_loopback_without_auto_creation() -> None:
    node = KafkaBroker(port=20_001, advertised_port=20_002, base_dir=Path("/nonexistent"))
    props = node.server_properties()
    assert props["process.roles"] == "broker,controller"
    assert props["auto.create.topics.enable"] == "false"
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{_port(props, 'CONTROLLER')}"
    assert _port(props, "CLIENT") == 20_001
    assert "CLIENT://127.0.0.1:20002" in props["advertised.listeners"]
    for name in ("listeners", "advertised.listeners"):
        hosts = re.findall(r"://([^:]+):", props[name])
        assert hosts and set(hosts) == {"127.0.0.1"}
    assert props["inter.broker.listener.name"] == "BROKER"  # never through the client proxy
    assert props["default.replication.factor"] == props["offsets.topic.replication.factor"] == "1"
    assert props["min.insync.replicas"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.dirs"] == "/nonexistent/data"


def test_config_overrides_our_properties() -> None:
    node = KafkaBroker(
        base_dir=Path("/nonexistent"),
        config={"num.partitions": "3", "log.retention.check.interval.ms": "500"},
    )
    props = node.server_properties()
    assert props["num.partitions"] == "3" and props["log.retention.check.interval.ms"] == "500"


def test_three_node_properties_replicate_everything_three_times() -> None:
    cluster = KafkaCluster(nodes=3)
    quorum = cluster._quorum_for([21_001, 21_002, 21_003])
    node = KafkaBroker(
        base_dir=Path("/nonexistent"), node_id=2, controller_port=21_002, _quorum=quorum
    )
    props = node.server_properties()
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:21001,2@127.0.0.1:21002,3@127.0.0.1:21003"
    )
    assert props["node.id"] == "2"
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
    ):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"


def _port(props: dict[str, str], listener: str) -> int:
    match = re.search(rf"{listener}://127\.0\.0\.1:(\d+)", props["listeners"])
    assert match is not None
    return int(match.group(1))


def _string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    return struct.pack(">h", len(text)) + text.encode()


def _metadata_v7_reply(correlation_id: int) -> bytes:
    body = struct.pack(">ii", correlation_id, 0)
    body += struct.pack(">i", 2)
    body += struct.pack(">i", 1) + _string("127.0.0.1") + struct.pack(">i", 9001) + _string(None)
    body += struct.pack(">i", 2) + _string("127.0.0.1") + struct.pack(">i", 9002) + _string("r1")
    body += _string("cluster-x") + struct.pack(">i", 2)
    body += struct.pack(">i", 1)  # one topic
    body += struct.pack(">h", 0) + _string("t") + b"\x00"
    body += struct.pack(">i", 2)  # two partitions, out of order
    for index, leader in ((1, 2), (0, 1)):
        body += struct.pack(">hiii", 0, index, leader, 5)
        body += struct.pack(">iii", 2, 1, 2)  # replicas
        body += struct.pack(">ii", 1, leader)  # isr
        body += struct.pack(">i", 0)  # offline
    return struct.pack(">i", len(body)) + body


def test_metadata_v7_request_and_reply_bytes() -> None:
    requests: list[bytes] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                (size,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
                request = conn.recv(size, socket.MSG_WAITALL)
                requests.append(request)
                (correlation_id,) = struct.unpack_from(">i", request, 4)
                conn.sendall(_metadata_v7_reply(correlation_id))

        thread = threading.Thread(target=answer)
        thread.start()
        got = kafka_metadata(port, ["t"], timeout_s=5)
        thread.join(5)
    (request,) = requests
    api_key, version, _, client_len = struct.unpack_from(">hhih", request)
    assert (api_key, version) == (3, 7)
    rest = request[10 + client_len :]
    assert rest == struct.pack(">i", 1) + _string("t") + b"\x00"  # no auto-creation
    assert got.brokers == ((1, "127.0.0.1", 9001), (2, "127.0.0.1", 9002))
    assert got.cluster_id == "cluster-x"
    error, partitions = got.topics["t"]
    assert error == 0
    assert partitions == (
        PartitionMetadata(0, 0, 1, (1, 2), (1,)),
        PartitionMetadata(1, 0, 2, (1, 2), (2,)),
    )


def test_the_leader_of_most_partitions_is_found_and_ties_go_to_the_lowest_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = KafkaCluster(nodes=3)
    cluster.nodes = [KafkaBroker(node_id=i) for i in (1, 2, 3)]
    leaders = [3, 2, 3, 2, 1, -1]

    def metadata(topics: object = ()) -> ClusterMetadata:
        partitions = tuple(
            PartitionMetadata(i, 0, leader, (), ()) for i, leader in enumerate(leaders)
        )
        return ClusterMetadata((), None, {"t": (0, partitions)})

    monkeypatch.setattr(cluster, "metadata", metadata)
    assert cluster.leader_of_most_partitions("t").node_id == 2
    leaders[1] = 3
    assert cluster.leader_of_most_partitions("t").node_id == 3


@pytest.mark.parametrize(
    ("value", "broker"), [(None, "kafka"), ("", "kafka"), ("kafka", "kafka"), (" Tansu ", "tansu")]
)
def test_the_broker_choice_comes_from_devstack_broker(
    monkeypatch: pytest.MonkeyPatch, value: str | None, broker: str
) -> None:
    if value is None:
        monkeypatch.delenv("DEVSTACK_BROKER", raising=False)
    else:
        monkeypatch.setenv("DEVSTACK_BROKER", value)
    assert default_broker() == broker


def test_an_unknown_broker_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSTACK_BROKER", "redpanda")
    with pytest.raises(ValueError, match="redpanda"):
        default_broker()
