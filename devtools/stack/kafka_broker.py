"""Apache Kafka for ``make dev`` and the integration tests: one KRaft node, or a 3-node cluster.

The broker is the ``org.apache.kafka:kafka_2.13`` release pinned in
``devtools/stack/kafka/pom.xml``, whose jars ``make kafka`` (part of ``make setup``) copies
from Maven Central into ``.cache/kafka-<version>/`` once; from then on nothing is
fetched. Each node is one ``java -cp '<cache>/*' kafka.Kafka server.properties``
process, a combined broker and controller (``process.roles=broker,controller``),
in a directory of its own that holds its properties, its log dirs and its server
log. Its storage is formatted (``kafka.tools.StorageTool format``) only when its
log dir has no ``meta.properties``, so a node killed or stopped and started again
comes back with its records, groups and offsets.

* :class:`KafkaBroker`: one node on ``127.0.0.1`` free ports, a quorum of one.
  ``advertised_port`` puts a :class:`~devtools.simulator.tcp_proxy.TcpProxy` in front of
  the clients' listener; the node talks to itself on listeners of its own, so
  cutting the proxy cuts the clients only.
  ``sasl`` (a :class:`BrokerSasl`): the clients' listener is ``SASL_PLAINTEXT`` with
  SCRAM-SHA-512 users and Kafka's ``StandardAuthorizer``: a client may do what ACLs
  (:meth:`KafkaBroker.create_acls`) allow its user, and nothing else.
* :class:`KafkaCluster`: ``nodes`` combined nodes sharing a quorum of that many
  voters, replication factor ``nodes`` and ``min.insync.replicas`` 2 (3 nodes);
  each node can be killed and started again, and
  :meth:`KafkaCluster.leader_of_most_partitions` says which one to kill.

Both are synchronous, like :mod:`devtools.stack.devstack`: every wait polls with a
deadline, a failed start carries the tail of the server log, and ``stop()`` is
idempotent and registered with ``atexit`` while started. Topic auto-creation is
off, as in production: create topics up front (``zapstream topics ensure``).
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devtools.stack.devstack import DevStackError, ManagedProcess, find_free_port
from devtools.stack.lifecycle import StartStop
from devtools.stack.tls import ServerTls, TlsTerminator
from streams.kernel.kafka_access import AclBinding

__all__ = [
    "BrokerSasl",
    "ClusterMetadata",
    "KafkaBroker",
    "KafkaCluster",
    "PartitionMetadata",
    "java_binary",
    "kafka_libs_dir",
    "kafka_version",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_POM = REPO_ROOT / "devtools" / "stack" / "kafka" / "pom.xml"
_CACHE_DIR = REPO_ROOT / ".cache"
_INSTALLED_MARKER = ".installed"

_POLL_INTERVAL_S = 0.1

DEFAULT_HEAP = ("-Xms256m", "-Xmx512m")
"""The JVM heap of one node: enough for the tests' topics, a fraction of Kafka's 1 GiB default."""

_JVM_OPTIONS = (
    # kafka-run-class.sh's choices for the broker.
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
    # C1 only: a node serves metadata in about a third of the time (no C2 compiling the
    # start-up), and its RSS is lower; a test broker's load never needs C2's peak code.
    "-XX:TieredStopAtLevel=1",
    # A node that ran out of heap is dead: exit, so the test sees it, rather than limp.
    "-XX:+ExitOnOutOfMemoryError",
)

_LOG4J2 = """\
# Written by devtools/stack/kafka_broker.py: the server log goes to stdout (the node's log file).
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
# A SASL broker's authorizer logs each refused request at INFO (what an ACL lacks).
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = INFO
# Every config object logs its ~300 values at INFO: 2,700 lines per start.
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


# --------------------------------------------------------------------------- the jars


def kafka_version() -> str:
    """The Kafka release pinned in ``devtools/stack/kafka/pom.xml`` (its ``kafka.version``)."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", KAFKA_POM.read_text())
    if match is None:
        raise DevStackError(f"{KAFKA_POM} has no <kafka.version> property")
    return match.group(1).strip()


def kafka_libs_dir() -> Path:
    """The directory of the pinned broker's jars, filled by ``make kafka``."""
    libs = _CACHE_DIR / f"kafka-{kafka_version()}"
    if not (libs / _INSTALLED_MARKER).is_file():
        raise DevStackError(
            f"the Apache Kafka {kafka_version()} jars are not in {libs}: run `make kafka` "
            "(part of `make setup`; it fetches them from Maven Central once)"
        )
    return libs


def java_binary() -> Path:
    """The ``java`` on PATH (Debian's ``default-jre-headless``: OpenJDK 17, what Kafka 4 needs)."""
    java = shutil.which("java")
    if java is None:
        raise DevStackError(
            "no `java` on PATH: run `make kafka` (it installs Debian's default-jre-headless)"
        )
    return Path(java)


def _random_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


# --------------------------------------------------------------------------- metadata


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """One partition as a Metadata response describes it."""

    partition: int
    error_code: int
    leader: int
    """The leader's node id; -1 while it has none."""
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """What a Metadata request returned: the live brokers and the topics asked for."""

    brokers: tuple[tuple[int, str, int], ...]
    """(node id, host, port) of each registered, unfenced broker."""
    cluster_id: str | None
    topics: Mapping[str, tuple[int, tuple[PartitionMetadata, ...]]]
    """Topic name -> (error code, partitions)."""


class _Reader:
    """Big-endian reads from a Kafka response (non-flexible versions)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> tuple[int, ...]:
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def int16(self) -> int:
        return self.unpack(">h")[0]

    def int32(self) -> int:
        return self.unpack(">i")[0]

    def string(self) -> str | None:
        length = self.int16()
        if length < 0:
            return None
        text = self.data[self.pos : self.pos + length].decode()
        self.pos += length
        return text

    def int32_array(self) -> tuple[int, ...]:
        return tuple(self.int32() for _ in range(self.int32()))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-reply")
        buf += chunk
    return bytes(buf)


def kafka_metadata(
    port: int, topics: Sequence[str] | None = (), timeout_s: float = 2.0
) -> ClusterMetadata:
    """Send one Metadata v7 request to ``127.0.0.1:port`` and decode the reply.

    ``topics=()`` asks for no topic, ``None`` for every topic; neither creates one
    (``allow_auto_topic_creation`` is false). v7 is the newest version before the
    flexible encoding (v9) and well above Kafka 4's floor (KIP-896 dropped v0-v3).

    Request:  int32 size | int16 api_key=3 | int16 api_version=7 | int32 correlation_id
              | string client_id | nullable array[string] topics | bool allow_auto_topic_creation
    Response: int32 size | int32 correlation_id | int32 throttle_time_ms
              | array brokers: int32 node_id, string host, int32 port, nullable string rack
              | nullable string cluster_id | int32 controller_id
              | array topics: int16 error_code, string name, bool is_internal,
                array partitions: int16 error_code, int32 partition_index, int32 leader_id,
                int32 leader_epoch, array[int32] replica_nodes, array[int32] isr_nodes,
                array[int32] offline_replicas
    Strings are an int16 length (-1: null) then UTF-8; arrays an int32 count (-1: null).
    A hand-built request keeps the probe synchronous and free of an event loop.
    """
    correlation_id = 0x2AF7
    client_id = b"zapstream-devstack"
    body = struct.pack(">hhih", 3, 7, correlation_id, len(client_id)) + client_id
    if topics is None:
        body += struct.pack(">i", -1)
    else:
        body += struct.pack(">i", len(topics))
        for name in topics:
            encoded = name.encode()
            body += struct.pack(">h", len(encoded)) + encoded
    body += b"\x00"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        reader = _Reader(_recv_exactly(sock, size))
    got_id, _throttle = reader.unpack(">ii")
    if got_id != correlation_id:
        raise DevStackError(f"metadata reply for correlation id {got_id}, sent {correlation_id}")
    brokers = []
    for _ in range(reader.int32()):
        node_id = reader.int32()
        host = reader.string() or ""
        broker_port = reader.int32()
        reader.string()  # rack
        brokers.append((node_id, host, broker_port))
    cluster_id = reader.string()
    reader.int32()  # controller_id: in KRaft, a random live broker
    described: dict[str, tuple[int, tuple[PartitionMetadata, ...]]] = {}
    for _ in range(reader.int32()):
        topic_error = reader.int16()
        name = reader.string() or ""
        reader.unpack(">b")  # is_internal
        partitions = []
        for _ in range(reader.int32()):
            error_code = reader.int16()
            index = reader.int32()
            leader = reader.int32()
            reader.int32()  # leader_epoch
            replicas = reader.int32_array()
            isr = reader.int32_array()
            reader.int32_array()  # offline_replicas
            partitions.append(PartitionMetadata(index, error_code, leader, replicas, isr))
        described[name] = (topic_error, tuple(sorted(partitions, key=lambda p: p.partition)))
    return ClusterMetadata(tuple(brokers), cluster_id, described)


# --------------------------------------------------------------------------- SASL and ACLs


SCRAM_MECHANISM = "SCRAM-SHA-512"
"""The clients' SASL mechanism on a SASL broker: what Strimzi's ``KafkaUser``
(``authentication: scram-sha-512``) gives production."""


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerSasl:
    """A broker whose clients log in (SASL_PLAINTEXT, SCRAM-SHA-512) and are authorized by ACL.

    ``users``: user name -> password, besides the admin. The SCRAM credentials are written
    into the metadata log when the storage is formatted (``kafka-storage format
    --add-scram``), so they exist before the broker takes its first request. The admin is a
    super user (it creates the ACLs, :meth:`KafkaBroker.create_acls`); so is ``ANONYMOUS``,
    the principal of the node's own plaintext listeners (inter-broker, controller), which
    bind to 127.0.0.1 and are never advertised to clients. Any other user may do only what
    an ACL allows it (``allow.everyone.if.no.acl.found`` stays false).
    """

    users: Mapping[str, str]
    admin_user: str = "admin"
    admin_password: str = "admin-secret"

    def __post_init__(self) -> None:
        for name, password in {**self.users, self.admin_user: self.admin_password}.items():
            # The --add-scram argument is [name=...,password=...]: no separators inside.
            if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or not re.fullmatch(
                r"[A-Za-z0-9._-]+", password
            ):
                raise ValueError(f"SASL user {name!r}: names and passwords are [A-Za-z0-9._-]")

    def credentials(self) -> dict[str, str]:
        """Every user and its password, the admin included."""
        return {**self.users, self.admin_user: self.admin_password}

    def server_properties(self) -> dict[str, str]:
        """What the node's properties get: the listener's mechanism, the authorizer."""
        return {
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "listener.name.client.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:ANONYMOUS;User:{self.admin_user}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_arguments(self) -> list[str]:
        """``--add-scram`` for every user, the admin included."""
        return [
            f"--add-scram={SCRAM_MECHANISM}=[name={name},password={password}]"
            for name, password in self.credentials().items()
        ]


_RD_RESOURCE = {"topic": "TOPIC", "group": "GROUP", "transactionalId": "TRANSACTIONAL_ID"}
"""Strimzi's resource type names -> confluent-kafka's ``ResourceType`` members."""
_RD_PATTERN = {"literal": "LITERAL", "prefix": "PREFIXED"}
"""Strimzi's pattern types -> confluent-kafka's ``ResourcePatternType`` members."""

# --------------------------------------------------------------------------- one node


@dataclasses.dataclass(frozen=True, slots=True)
class _Quorum:
    """What every node of one cluster shares."""

    cluster_id: str
    voters: str
    """``controller.quorum.voters``: ``id@127.0.0.1:controller_port`` of every node."""
    size: int


class KafkaBroker(StartStop):
    """One Apache Kafka node (combined KRaft broker and controller) on ``127.0.0.1:port``.

    ``base_dir``: the node's directory (properties, ``data/`` log dirs, ``kafka.log``);
    default a temporary directory, removed by :meth:`stop` unless ``keep``.
    ``advertised_port``: the port clients are told to use (a proxy in front of ``port``).
    ``config``: server properties added to or overriding ours (e.g. a short
    ``log.retention.check.interval.ms`` for a retention test).
    ``tls`` (a :class:`devtools.stack.tls.ServerTls`): clients must use TLS on ``port``, which a
    :class:`devtools.stack.tls.TlsTerminator` serves in front of Kafka's plaintext listener
    (as :class:`devtools.stack.devstack.TansuBroker` does); the node advertises ``port``.
    ``sasl`` (a :class:`BrokerSasl`): clients log in on ``port`` (SASL_PLAINTEXT,
    SCRAM-SHA-512) and may do what :meth:`create_acls` allows their user; the readiness
    probe then goes to the node's own (inter-broker) listener.

    :meth:`kill` (SIGKILL) and :meth:`terminate` (SIGTERM: a controlled shutdown) end the
    process and keep its log dirs; :meth:`restart` starts it again on them. :meth:`stop`
    ends it and removes what it owns.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        base_dir: Path | None = None,
        advertised_port: int | None = None,
        config: Mapping[str, str] | None = None,
        heap: Sequence[str] = DEFAULT_HEAP,
        keep: bool = False,
        start_timeout_s: float = 90.0,
        stop_timeout_s: float = 20.0,
        tls: ServerTls | None = None,
        sasl: BrokerSasl | None = None,
        node_id: int = 1,
        controller_port: int | None = None,
        _quorum: _Quorum | None = None,
    ) -> None:
        """``node_id``, ``controller_port`` and ``_quorum`` are how :class:`KafkaCluster`
        makes its nodes; a lone node is a quorum of itself."""
        if tls is not None and advertised_port is not None:
            raise DevStackError("a TLS broker advertises its own TLS port: no advertised_port")
        if sasl is not None and tls is not None:
            raise DevStackError("a broker is SASL_PLAINTEXT or TLS, not both")
        self.sasl = sasl
        self._port = port if port is not None else find_free_port()
        self._advertised_port = advertised_port or self._port
        self._tls = tls
        self._terminator: TlsTerminator | None = None
        # Where Kafka's client listener binds: behind the TLS terminator when there is one.
        self._listen_port = find_free_port() if tls is not None else self._port
        self._broker_port = find_free_port()  # inter-broker traffic, never through a proxy
        self._controller_port = controller_port or find_free_port()
        self.node_id = node_id
        self._quorum = _quorum or _Quorum(
            _random_cluster_id(), f"{node_id}@127.0.0.1:{self._controller_port}", 1
        )
        self._config = dict(config or {})
        self._heap = tuple(heap)
        self.keep = keep
        self._base_dir = base_dir
        self._own_dir = base_dir is None
        self._dir: Path | None = None
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._process: ManagedProcess | None = None
        self.last_start_s: float | None = None
        """Seconds from launching the JVM to the node serving metadata, at its last start."""
        self.last_format_s: float | None = None
        """Seconds the storage format took, the last time the node's log dirs were new."""
        self._launched_at = 0.0

    def __repr__(self) -> str:
        return f"<KafkaBroker node {self.node_id} {self.bootstrap}>"

    # --- where it is ---------------------------------------------------------------

    @property
    def port(self) -> int:
        """The clients' listener."""
        return self._port

    @property
    def advertised_port(self) -> int:
        return self._advertised_port

    @property
    def listen_port(self) -> int:
        """Where Kafka's own client listener binds (``port`` unless a TLS terminator is in
        front): what :func:`kafka_metadata` probes."""
        return self._listen_port

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:port``, as :class:`devtools.stack.devstack.TansuBroker` gives it; with a
        proxy in front, clients bootstrapped here go on through the advertised port."""
        return f"127.0.0.1:{self._port}"

    @property
    def dir(self) -> Path:
        """The node's directory: ``server.properties``, ``data/``, ``kafka.log``."""
        if self._dir is None:
            raise DevStackError(f"{self!r} is not started")
        return self._dir

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def log_path(self) -> Path:
        return self.dir / "kafka.log"

    @property
    def process(self) -> ManagedProcess:
        """The JVM, e.g. to read its log or measure it in a test."""
        if self._process is None:
            raise DevStackError(f"{self!r} is not started")
        return self._process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.is_running

    def log_tail(self, n: int = 60) -> str:
        return self.process.log_tail(n)

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Format the log dirs if new, start the JVM and wait until it serves metadata."""
        self.launch()
        try:
            self.wait_ready()
            if self._tls is not None and self._terminator is None:
                self._terminator = TlsTerminator(self._listen_port, self._tls, port=self._port)
                self._terminator.start()
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        """Prepare the directory and start the JVM without waiting (a cluster starts its
        nodes together: none is ready before a majority of the quorum runs)."""
        if self._process is not None:
            raise DevStackError(f"{self!r} is already started")
        if self._dir is None:
            if self._base_dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix=f"zapstream-kafka-{self.node_id}-"))
            else:
                self._dir = Path(self._base_dir)
                self._dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        self._write_config()
        self._format_storage()
        self._process = ManagedProcess(
            self._java_command("kafka.Kafka", str(self.dir / "server.properties")),
            env=None,
            log_path=self.log_path,
            name=f"kafka-{self.node_id}:{self._port}",
            cwd=self.dir,
            stop_timeout_s=self._stop_timeout_s,
        )
        self._launched_at = time.monotonic()
        self._process.start()

    def wait_ready(self) -> None:
        """Wait until the node lists itself, at its advertised address, in a Metadata reply.

        A KRaft broker appears there once the quorum has a leader and the broker is
        registered and unfenced: it can then take produce and fetch requests.
        """
        process = self.process
        deadline = time.monotonic() + self._start_timeout_s
        # A SASL listener answers nothing before a login: probe the node's own listener,
        # which lists the brokers at their addresses on it.
        probe_port = self._broker_port if self.sasl is not None else self._listen_port
        advertised = self._broker_port if self.sasl is not None else self._advertised_port
        wanted = (self.node_id, "127.0.0.1", advertised)
        last_error = "port not accepting connections"
        while True:
            if not process.is_running:
                raise DevStackError(
                    f"kafka node {self.node_id} exited with status {process.returncode} before "
                    f"serving metadata on 127.0.0.1:{self._listen_port}; last lines of "
                    f"{process.log_path}:\n{process.log_tail()}"
                )
            try:
                brokers = kafka_metadata(probe_port, timeout_s=1.0).brokers
            except (OSError, struct.error, DevStackError) as e:
                last_error = f"metadata request failed: {e!r}"
            else:
                if wanted in brokers:
                    self.last_start_s = time.monotonic() - self._launched_at
                    return
                last_error = f"metadata lists brokers {list(brokers)}, not {wanted}"
            if time.monotonic() >= deadline:
                raise DevStackError(
                    f"kafka node {self.node_id} not ready on 127.0.0.1:{self._listen_port} within "
                    f"{self._start_timeout_s:g} s ({last_error}); last lines of "
                    f"{process.log_path}:\n{process.log_tail()}"
                )
            time.sleep(_POLL_INTERVAL_S)

    # --- ACLs ----------------------------------------------------------------------

    def client_config(self, user: str) -> dict[str, str]:
        """librdkafka's settings for ``user`` of a SASL broker (its password from ``sasl``)."""
        if self.sasl is None:
            raise DevStackError(f"{self!r} has no SASL users")
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": self.sasl.credentials()[user],
        }

    def create_acls(self, bindings: Sequence[AclBinding], timeout_s: float = 30.0) -> None:
        """Create ALLOW ``bindings`` (any host) as the admin user, and wait until the node
        authorizes with them (KRaft applies them from the metadata log a moment later).

        Through confluent-kafka's admin client (librdkafka): aiokafka's has no CreateAcls.
        """
        import confluent_kafka.admin

        # Its names are re-exported without __all__ (mypy strict: "not exported"): by attribute.
        rd: Any = confluent_kafka.admin
        if self.sasl is None:
            raise DevStackError(f"{self!r} has no authorizer: start it with sasl=BrokerSasl(...)")
        # librdkafka's own log on stderr: errors only.
        admin = rd.AdminClient({**self.client_config(self.sasl.admin_user), "log_level": 3})
        wanted = [
            rd.AclBinding(
                rd.ResourceType[_RD_RESOURCE[b.resource.type.value]],
                b.resource.name,
                rd.ResourcePatternType[_RD_PATTERN[b.resource.pattern.value]],
                b.principal,
                "*",
                rd.AclOperation[b.operation.value.upper()],
                rd.AclPermissionType.ALLOW,
            )
            for b in bindings
        ]
        for future in admin.create_acls(wanted, request_timeout=timeout_s).values():
            future.result()
        any_acl = rd.AclBindingFilter(
            rd.ResourceType.ANY,
            None,
            rd.ResourcePatternType.ANY,
            None,
            None,
            rd.AclOperation.ANY,
            rd.AclPermissionType.ANY,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            described = admin.describe_acls(any_acl, request_timeout=timeout_s).result()
            if set(wanted) <= set(described):
                return
            if time.monotonic() >= deadline:
                raise DevStackError(
                    f"kafka node {self.node_id} shows {len(described)} ACLs after {timeout_s:g} s, "
                    f"not the {len(wanted)} created"
                )
            time.sleep(_POLL_INTERVAL_S)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL: a crash) and wait until the JVM is gone; the log
        dirs stay for :meth:`restart`."""
        process = self.process
        process.kill(sig)
        process.wait(self._stop_timeout_s)
        process.stop()  # reaps it and unregisters its atexit hook
        self._process = None

    def terminate(self) -> None:
        """SIGTERM (Kafka's controlled shutdown), SIGKILL after ``stop_timeout_s``; the log
        dirs stay for :meth:`restart`."""
        self.process.stop()
        self._process = None

    def restart(self) -> None:
        """Start the node again on its log dirs (after :meth:`kill` or :meth:`terminate`;
        a running node is terminated first) and wait until it serves metadata."""
        if self._process is not None:
            self.terminate()
        self.start()

    def stop(self) -> None:
        """End the JVM (SIGTERM, SIGKILL after ``stop_timeout_s``) and remove the directory
        it owns unless ``keep``; idempotent."""
        try:
            terminator, self._terminator = self._terminator, None
            if terminator is not None:
                terminator.stop()
            if self._process is not None:
                self._process.stop()
        finally:
            self._process = None
            if self._dir is not None and self._own_dir and not self.keep:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            atexit.unregister(self.stop)

    # --- configuration -------------------------------------------------------------

    def server_properties(self) -> dict[str, str]:
        """The node's ``server.properties``: ours, then ``config`` over them.

        Known before :meth:`start` when a ``base_dir`` was given; else once started.
        """
        node_dir = self._dir or self._base_dir
        if node_dir is None:
            raise DevStackError(f"{self!r} has no directory before start without a base_dir")
        size = self._quorum.size
        min_isr = str(min(2, size))
        properties = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self._quorum.voters,
            "listeners": (
                f"CLIENT://127.0.0.1:{self._listen_port},BROKER://127.0.0.1:{self._broker_port},"
                f"CONTROLLER://127.0.0.1:{self._controller_port}"
            ),
            "advertised.listeners": (
                f"CLIENT://127.0.0.1:{self._advertised_port},BROKER://127.0.0.1:{self._broker_port}"
            ),
            "listener.security.protocol.map": (
                f"CLIENT:{'SASL_PLAINTEXT' if self.sasl else 'PLAINTEXT'},"
                "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            "inter.broker.listener.name": "BROKER",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(Path(node_dir) / "data"),
            # As production runs: every topic is created up front, with its partitions.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": str(size),
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": str(size),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(size),
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(size),
            "share.coordinator.state.topic.min.isr": min_isr,
            # Tests: a group's first join is not held back 3 s waiting for more members.
            "group.initial.rebalance.delay.ms": "0",
            # A SIGKILLed node is fenced, and its partitions led elsewhere, within 6 s
            # (Kafka's default: 9 s).
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "6000",
            # Small threads and buffers: a dev machine runs up to three of these.
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.replica.fetchers": "1",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "4",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        }
        if self.sasl is not None:
            properties.update(self.sasl.server_properties())
        properties.update(self._config)
        return properties

    def _write_config(self) -> None:
        lines = [f"{k}={v}" for k, v in self.server_properties().items()]
        (self.dir / "server.properties").write_text(
            "# Written by devtools/stack/kafka_broker.py at each start.\n" + "\n".join(lines) + "\n"
        )
        (self.dir / "log4j2.properties").write_text(_LOG4J2)

    def _java_command(
        self, main_class: str, *args: str, heap: Sequence[str] | None = None
    ) -> list[str]:
        return [
            str(java_binary()),
            *(self._heap if heap is None else heap),
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.dir}",
            "-cp",
            f"{kafka_libs_dir()}/*",
            main_class,
            *args,
        ]

    def _format_storage(self) -> None:
        """``kafka-storage.sh format`` for new log dirs; formatted ones keep their data.

        The quorum is static (``controller.quorum.voters``), so no ``--standalone`` or
        ``--initial-controllers``: every voter is known before any node starts.
        """
        if (self.data_dir / "meta.properties").is_file():
            return
        started = time.monotonic()
        command = self._java_command(
            "kafka.tools.StorageTool",
            "format",
            # One argument: a random id may start with "-", which argparse takes for an option.
            f"--cluster-id={self._quorum.cluster_id}",
            f"--config={self.dir / 'server.properties'}",
            *(self.sasl.format_arguments() if self.sasl is not None else ()),
            heap=("-Xmx128m",),  # a short JVM: a smaller heap than the broker's
        )
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                cwd=self.dir,
                timeout=60,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DevStackError(
                f"formatting kafka node {self.node_id}'s storage timed out after 60 s"
            ) from None
        with self.log_path.open("a") as log:
            log.write(f"--- kafka-{self.node_id}: storage format\n{result.stdout}{result.stderr}")
        if result.returncode != 0:
            raise DevStackError(
                f"formatting kafka node {self.node_id}'s storage in {self.data_dir} failed "
                f"(exit status {result.returncode}):\n{result.stdout}{result.stderr}".rstrip()
            )
        self.last_format_s = time.monotonic() - started


# --------------------------------------------------------------------------- a cluster


class KafkaCluster(StartStop):
    """``nodes`` combined KRaft nodes with a quorum of ``nodes`` voters, for failover tests.

    Topics get replication factor ``nodes`` by default, ``min.insync.replicas`` is 2 (with
    3 nodes: an ``acks=all`` write still succeeds with one node down), and the offsets and
    transaction topics are replicated to every node. ``advertised_ports``: one per node,
    the ports clients are told to use (proxies in front). Each node, in :attr:`nodes`, can
    be :meth:`~KafkaBroker.kill`\\ ed and :meth:`~KafkaBroker.restart`\\ ed on its log dirs.
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        base_dir: Path | None = None,
        advertised_ports: Sequence[int] | None = None,
        config: Mapping[str, str] | None = None,
        heap: Sequence[str] = DEFAULT_HEAP,
        keep: bool = False,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 20.0,
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster has at least one node")
        if advertised_ports is not None and len(advertised_ports) != nodes:
            raise ValueError(f"advertised_ports names {len(advertised_ports)} ports for {nodes}")
        self._own_dir = base_dir is None
        self._base_dir = base_dir
        self._dir: Path | None = None
        self.keep = keep
        self._start_timeout_s = start_timeout_s
        self._size = nodes
        self._config = config
        self._heap = heap
        self._stop_timeout_s = stop_timeout_s
        self._advertised: list[int | None] = (
            list(advertised_ports) if advertised_ports is not None else [None] * nodes
        )
        self.nodes: list[KafkaBroker] = []
        self.last_start_s: float | None = None
        """Seconds from formatting the first node to every node serving metadata."""

    def __repr__(self) -> str:
        return f"<KafkaCluster {self.bootstrap if self.nodes else 'not started'}>"

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise DevStackError("KafkaCluster is not started")
        return self._dir

    def node(self, node_id: int) -> KafkaBroker:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in {self!r}")

    def start(self) -> None:
        """Format and start every node together; wait until each serves metadata."""
        if self.nodes:
            raise DevStackError(f"{self!r} is already started")
        if self._base_dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="zapstream-kafka-cluster-"))
        else:
            self._dir = Path(self._base_dir)
            self._dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        started = time.monotonic()
        controller_ports = [find_free_port() for _ in range(self._size)]
        quorum = self._quorum_for(controller_ports)
        self.nodes = [
            KafkaBroker(
                base_dir=self._dir / f"node-{i + 1}",
                advertised_port=self._advertised[i],
                node_id=i + 1,
                controller_port=controller_ports[i],
                _quorum=quorum,
                config=self._config,
                heap=self._heap,
                keep=True,  # the cluster removes its directory itself
                start_timeout_s=self._start_timeout_s,
                stop_timeout_s=self._stop_timeout_s,
            )
            for i in range(self._size)
        ]
        try:
            # Formatting is a JVM start per node: in parallel, as are the brokers.
            self._each(lambda node: node.launch())
            self._each(lambda node: node.wait_ready())
        except BaseException:
            self.stop()
            raise
        self.last_start_s = time.monotonic() - started

    def _quorum_for(self, controller_ports: Sequence[int]) -> _Quorum:
        """A new cluster id and the static voters: node ``i + 1`` on ``controller_ports[i]``."""
        voters = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(controller_ports))
        return _Quorum(_random_cluster_id(), voters, len(controller_ports))

    def stop(self) -> None:
        """SIGTERM every node at once (one at a time, the last ones would wait for a quorum
        that has gone), SIGKILL after the bound; remove the directory unless ``keep``."""
        try:
            for node in self.nodes:
                if node.is_running:
                    node.process.kill(signal.SIGTERM)
            self._each(lambda node: node.stop())
        finally:
            self.nodes = []
            if self._dir is not None and self._own_dir and not self.keep:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            atexit.unregister(self.stop)

    def _each(self, action: Callable[[KafkaBroker], None]) -> None:
        """Run ``action`` on every node in threads; re-raise the first failure."""
        errors: list[BaseException] = []

        def run(node: KafkaBroker) -> None:
            try:
                action(node)
            except BaseException as e:  # handed to the caller below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(node,)) for node in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def metadata(self, topics: Sequence[str] | None = ()) -> ClusterMetadata:
        """A Metadata reply from the first running node that answers."""
        problems = []
        for node in self.nodes:
            if not node.is_running:
                continue
            try:
                return kafka_metadata(node.listen_port, topics)
            except (OSError, struct.error, DevStackError) as e:
                problems.append(f"node {node.node_id}: {e!r}")
        raise DevStackError(f"no node of {self!r} answered a Metadata request: {problems}")

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """Partition -> its leader's node id (-1: none) for ``topic``."""
        error_code, partitions = self.metadata([topic]).topics.get(topic, (3, ()))
        if error_code != 0:
            raise DevStackError(f"topic {topic}: metadata error code {error_code}")
        return {p.partition: p.leader for p in partitions}

    def leader_of_most_partitions(self, topic: str) -> KafkaBroker:
        """The node that leads most of ``topic``'s partitions (the lowest id on a tie)."""
        counts = Counter(leader for leader in self.partition_leaders(topic).values() if leader >= 0)
        if not counts:
            raise DevStackError(f"no partition of {topic} has a leader")
        most = max(counts.values())
        return self.node(min(node_id for node_id, n in counts.items() if n == most))
