"""Hung peers: a connection that stays open and goes silent is noticed, logged once, recovered.

A :class:`~devtools.simulator.tcp_proxy.TcpProxy` blackhole (nothing forwarded, nothing
closed: a NAT or load balancer that dropped the connection's state, a frozen VM)
sits on each edge in turn, for 30 s mid-stream, on real processes:

- (a) the relay and PostgreSQL (its replication connection and its slot monitor's);
- (b) the state sink and PostgreSQL (with the relay's edge healthy, so states flow);
- (c) the worker and Kafka: the broker advertises the proxy's port, so every Kafka client
  (relay, sink, worker) is behind it, as it would be behind one broken NAT;
- (d) the worker and the gateway simulator.

Each hang must be detected within the bound docs/concepts/failures.md states for that edge (with
the short settings below; the gateway's read deadline counted from the first request
written into the blackhole, as that page states it), by the process's own log line,
written once per edge;
afterwards every message reaches the gateway exactly once, in order per
conversation. The first tests check the two client-side mechanisms alone (the
replication stream's silence deadline, a plain connection's query deadline) and
the TCP options libpq puts on its socket.

Prints: each detection time and log-line count, and sent/accepted/duplicates/order
violations/lost.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import socket
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pydantic import SecretStr

from connectors.cdc.lsn import Lsn
from connectors.cdc.provisioning import ensure_replication
from connectors.cdc.replication_stream import ReplicationStream, ReplicationStreamClosed
from devtools.simulator.tcp_proxy import TcpProxy
from devtools.stack.devstack import ManagedProcess
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.postgres import PostgresSilent, postgres_deadline
from streams.kernel.settings import PostgresSettings
from tests.integration.support import Arrivals, PacedWriter, wait_for_status, wait_until

pytestmark = pytest.mark.integration

BLACKHOLE_S = 30.0
"""How long each edge stays silent: the fault's duration."""
MESSAGES = 7_500
"""Enqueued at ~50 rows/s: enough for the stream to outlast the four blackholes."""

# The short bounds this test runs with, and the detection bound each implies (the table of
# docs/concepts/failures.md, "Hung connections", with these values): the deadline plus
# scheduling slack.
REPLICATION_TIMEOUT_S = 6.0
QUERY_TIMEOUT_S = 4.0
KAFKA_REQUEST_TIMEOUT_S = 8.0
GATEWAY_READ_TIMEOUT_S = 3.0
SLACK_S = 10.0
"""What a bound allows past its deadline: a loaded machine (the suite runs 4 processes on 2
cores) took 4.2 s past a 3 s read timeout. Without the deadline an edge is never detected
within the blackhole (it recovers at 30 s), so the bounds still tell the mechanism apart."""
BOUND_RELAY_S = REPLICATION_TIMEOUT_S + SLACK_S
BOUND_SINK_S = QUERY_TIMEOUT_S + SLACK_S
BOUND_KAFKA_S = KAFKA_REQUEST_TIMEOUT_S + SLACK_S
BOUND_GATEWAY_S = GATEWAY_READ_TIMEOUT_S + SLACK_S

# zapstream's log lines start with the asctime, Faust's (the worker's) with it in brackets.
_STAMP = re.compile(r"^\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]? ", re.M)


# --- the mechanisms alone ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    # Proxied: the broker advertises kafka_proxy's port, so blackholing it silences every
    # Kafka connection. The sink is started by the test, behind its own proxy.
    with LocalPipeline(partitions=4, proxied=True, with_sink=False) as p:
        yield p


def _replication_dsn(pipeline: LocalPipeline, port: int) -> str:
    return PostgresSettings(url=SecretStr(f"postgresql://postgres@127.0.0.1:{port}/postgres")).dsn


def test_a_silent_replication_server_is_detected_within_the_timeout_an_idle_one_is_not(
    pipeline: LocalPipeline,
) -> None:
    slot = publication = "hung_peers_probe"
    ensure_replication(pipeline.dsn, slot=slot, publication=publication)

    async def scenario(proxy: TcpProxy) -> tuple[int, float]:
        stream = ReplicationStream(
            _replication_dsn(pipeline, proxy.port),
            slot=slot,
            publication=publication,
            connect_timeout_s=5,
            silence_timeout_s=1.5,
        )
        async with stream:
            await stream.start(Lsn.ZERO)
            # Idle and healthy for three timeouts: the pings are answered, nothing is raised.
            idle_until = time.monotonic() + 4.5
            while time.monotonic() < idle_until:
                await stream.read(timeout_s=0.5)
            # A caller busy elsewhere for longer than the timeout (the relay waiting for
            # Kafka) is not taken for a silent server: the next reads ping and are answered.
            await asyncio.sleep(2.0)
            busy_until = time.monotonic() + 2.0
            while time.monotonic() < busy_until:
                await stream.read(timeout_s=0.5)
            pings = stream.pings
            proxy.blackhole()
            silenced_at = time.monotonic()
            with pytest.raises(ReplicationStreamClosed, match="presumed hung") as caught:
                while True:
                    await stream.read(timeout_s=0.5)
            assert caught.value.retriable
            return pings, time.monotonic() - silenced_at

    with TcpProxy(pipeline.postgres.port) as proxy:
        pings, detected_s = asyncio.run(scenario(proxy))
    print(f"\n[replication alone] pings while idle={pings} detected after {detected_s:.2f}s")
    assert pings >= 3, f"an idle healthy stream sent {pings} pings in 6.5 s (every 0.5 s expected)"
    assert detected_s <= 1.5 + 1.0, f"detected after {detected_s:.2f}s, bound 2.5s"


def test_a_plain_connection_has_keepalives_and_a_query_deadline(pipeline: LocalPipeline) -> None:
    settings = PostgresSettings(
        url=SecretStr(f"postgresql://postgres@127.0.0.1:{pipeline.postgres.port}/postgres")
    )

    async def scenario(proxy: TcpProxy) -> tuple[dict[str, int], float, bool]:
        dsn = PostgresSettings(
            url=SecretStr(f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres")
        ).dsn
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            sock = socket.socket(fileno=conn.pgconn.socket)
            try:
                options = {
                    "SO_KEEPALIVE": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    "TCP_KEEPIDLE": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    "TCP_KEEPINTVL": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                    "TCP_KEEPCNT": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                    "TCP_USER_TIMEOUT": sock.getsockopt(
                        socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT
                    ),
                }
            finally:
                sock.detach()  # libpq owns the descriptor
            await conn.execute("SELECT 1")
            proxy.blackhole()
            silenced_at = time.monotonic()
            with pytest.raises(PostgresSilent):
                async with postgres_deadline(1.0, "the probe write", conn), conn.transaction():
                    await conn.execute("SELECT 1")
            return options, time.monotonic() - silenced_at, conn.closed

    with TcpProxy(pipeline.postgres.port) as proxy:
        options, detected_s, closed = asyncio.run(scenario(proxy))
    print(f"\n[plain alone] socket options {options}; silent query failed after {detected_s:.2f}s")
    assert options == {
        "SO_KEEPALIVE": 1,
        "TCP_KEEPIDLE": settings.keepalives_idle_s,
        "TCP_KEEPINTVL": settings.keepalives_interval_s,
        "TCP_KEEPCNT": settings.keepalives_count,
        "TCP_USER_TIMEOUT": round(settings.tcp_user_timeout_s * 1000),
    }, options
    # The 1 s deadline hangs the socket up: no cancel request, no wait for one.
    assert detected_s <= 1.0 + 1.0, f"detected after {detected_s:.2f}s"
    assert closed, "the hung connection was left open"


# --- the pipeline, one edge after another ----------------------------------------------------


def _stamp(line_match: re.Match[str], log_text: str) -> float:
    """The epoch time of the log line holding ``line_match`` (its asctime prefix)."""
    start = log_text.rfind("\n", 0, line_match.start()) + 1
    stamp = _STAMP.match(log_text, start)
    assert stamp is not None, log_text[start : start + 200]
    return dt.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


class _Edge:
    """One blackholed edge: the process that must notice, the line that shows it noticed,
    and the line it must write once (per value of its groups, if the pattern has any)."""

    def __init__(
        self,
        name: str,
        proc: ManagedProcess,
        *,
        detect: str,
        once: str,
        bound_s: float,
        per_request: bool = False,
    ) -> None:
        self.name = name
        self.per_request = per_request
        """The deadline is a request's (the gateway's read timeout): it starts when the first
        request goes into the blackhole, which an idle client (a worker still catching up
        after the Kafka outage) sends later than the blackhole came. Streams and clients that
        talk all the time (replication, Kafka) are timed from the blackhole itself."""
        self.proc = proc
        self.detect_pattern = detect
        self.once_pattern = once
        self.bound_s = bound_s
        self.since = 0
        self.detected_s: float | None = None
        self.lines: dict[str, int] = {}

    def _text(self) -> str:
        return self.proc.log_path.read_bytes()[self.since :].decode(errors="replace")

    def arm(self) -> None:
        self.since = self.proc.log_offset()

    def detect(self, proxy: TcpProxy, silenced_at: float, timeout_s: float) -> None:
        self.proc.wait_for_log(self.detect_pattern, timeout_s=timeout_s, since=self.since)
        text = self._text()
        found = re.search(self.detect_pattern, text, re.M)
        assert found is not None
        started = silenced_at
        if self.per_request:
            assert proxy.first_silenced_request_at is not None, f"{self.name}: no request sent"
            started = max(silenced_at, proxy.first_silenced_request_at)
        self.detected_s = _stamp(found, text) - started

    def count(self) -> None:
        counts: dict[str, int] = {}
        for found in re.finditer(self.once_pattern, self._text(), re.M):
            key = "/".join(found.groups()) if found.groups() else "all"
            counts[key] = counts.get(key, 0) + 1
        self.lines = counts

    def report(self) -> str:
        detected = "never" if self.detected_s is None else f"{self.detected_s:.1f}s"
        bound = f"bound {self.bound_s:g}s"
        return f"{self.name}: detected after {detected} ({bound}), lines {self.lines}"


def test_each_edge_blackholed_for_30s_is_detected_logged_once_and_loses_nothing(
    pipeline: LocalPipeline,
) -> None:
    assert pipeline.kafka_proxy is not None
    pg = pipeline.postgres.port
    with (
        TcpProxy(pg) as relay_pg,
        TcpProxy(pg) as sink_pg,
        TcpProxy(pipeline.sim_port) as gateway,
    ):
        short_pg = {
            "ZAPSTREAM_DATABASE_QUERY_TIMEOUT_S": str(QUERY_TIMEOUT_S),
            "ZAPSTREAM_DATABASE_STATEMENT_TIMEOUT_S": "2",
            "ZAPSTREAM_DATABASE_CONNECT_TIMEOUT_S": "2",
            "ZAPSTREAM_KAFKA_REQUEST_TIMEOUT_S": str(KAFKA_REQUEST_TIMEOUT_S),
        }
        sink = pipeline.start_sink(
            "sink-hung",
            env={
                **short_pg,
                "ZAPSTREAM_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{sink_pg.port}/postgres",
                "ZAPSTREAM_SINK_CONNECT_TIMEOUT_S": "2",
            },
        )
        relay = pipeline.start_relay(
            "relay-hung",
            env={
                **short_pg,
                "ZAPSTREAM_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{relay_pg.port}/postgres",
                "ZAPSTREAM_RELAY_REPLICATION_TIMEOUT_S": str(REPLICATION_TIMEOUT_S),
                "ZAPSTREAM_RELAY_SLOT_METRICS_INTERVAL_S": "1",
            },
        )
        worker = pipeline.start_worker(
            "worker-hung",
            env={
                "ZAPSTREAM_KAFKA_REQUEST_TIMEOUT_S": str(KAFKA_REQUEST_TIMEOUT_S),
                "STACKZAP_API_URL": f"http://127.0.0.1:{gateway.port}",
                "ZAPSTREAM_GATEWAY_READ_TIMEOUT_S": str(GATEWAY_READ_TIMEOUT_S),
                "ZAPSTREAM_GATEWAY_CONNECT_TIMEOUT_S": "2",
            },
        )
        edges = {
            "relay-pg": _Edge(
                "relay<->PostgreSQL",
                relay,
                # The relay's PostgreSQL users (its replication connection, slot metrics and
                # scheduled release) share one line: whichever notices the hang first writes it.
                detect=r"PostgreSQL(?: \([a-z ]+\))? unavailable, retrying.*presumed hung",
                once=r"PostgreSQL(?: \([a-z ]+\))? unavailable, retrying",
                bound_s=BOUND_RELAY_S,
            ),
            "sink-pg": _Edge(
                "sink<->PostgreSQL",
                sink,
                detect=r"postgres unavailable, retrying the same batch.*presumed hung",
                once=r"postgres unavailable, retrying the same batch",
                bound_s=BOUND_SINK_S,
            ),
            # aiokafka's request timeout (or the heartbeat session) is the mechanism; its
            # retry lines are counted, not logged: the worker's one line is the Kafka
            # outage's (streams/kernel/kafka_outage.py), once per outage.
            "kafka": _Edge(
                "worker<->Kafka",
                worker,
                detect=r"Kafka unavailable, its clients retrying",
                once=r"Kafka unavailable, its clients retrying",
                bound_s=BOUND_KAFKA_S,
            ),
            "gateway": _Edge(
                "worker<->gateway",
                worker,
                detect=r"gateway failures started",
                # Once per instance and failure class (sends: uncertain, listings: transient).
                once=r"instance (\S+): gateway failures started \((\w+)\)",
                bound_s=BOUND_GATEWAY_S,
                per_request=True,
            ),
        }

        # A steady stream (~50 rows/s), so every blackhole lands mid-stream.
        writer = PacedWriter(
            pipeline.dsn,
            uuid.uuid4().hex[:8],
            messages=MESSAGES,
            conversations=40,
            per_transaction=5,
            pause_s=0.1,
        )
        keys = writer.keys
        writer.start()
        try:
            wait_until(writer.reached(300), 60, "300 rows committed")
            recovered = {
                "relay-pg": (relay, r"PostgreSQL(?: \([a-z ]+\))? available again"),
                "sink-pg": (sink, r"postgres available again"),
            }
            for name, proxy in (
                ("relay-pg", relay_pg),
                ("sink-pg", sink_pg),
                ("kafka", pipeline.kafka_proxy),
                ("gateway", gateway),
            ):
                edge = edges[name]
                edge.arm()
                silenced_at = time.time()
                proxy.blackhole()
                print(f"[hung] {edge.name} blackholed at {writer.committed} committed")
                try:
                    edge.detect(proxy, silenced_at, BLACKHOLE_S)
                finally:
                    time.sleep(max(0.0, silenced_at + BLACKHOLE_S - time.time()))  # the fault
                    proxy.restore()
                if name in recovered:
                    proc, pattern = recovered[name]
                    proc.wait_for_log(pattern, 60, since=edge.since)
                edge.count()
                if name != "gateway":
                    # The next edge goes silent mid-stream too, once this one flows again.
                    more = writer.reached(writer.committed + 150)
                    wait_until(more, 60, "150 more rows committed")
        finally:
            writer.join(timeout=600)
        assert len(keys) == MESSAGES, f"{len(keys)} of {MESSAGES} enqueued"
        report = Arrivals(pipeline).wait_for(keys, timeout_s=300)
        figures = "; ".join(edge.report() for edge in edges.values())
        print(f"[hung] {figures}")
        print(
            f"[hung] sent={len(keys)} accepted={report.accepted_unique} "
            f"duplicates={report.duplicate_count} "
            f"order_violations={len(report.order_violations)} lost={len(report.missing)}"
        )
        wait_for_status(pipeline.dsn, keys, "ACCEPTED", 180)
        for proc in (relay, sink, worker):
            assert proc.is_running, f"{proc.name} exited:\n{proc.log_tail()}"
        assert report.duplicate_count == 0, f"sent twice: {list(report.duplicates)[:5]}; {figures}"
        assert report.order_violations == (), f"{report.order_violations[:5]}; {figures}"
        assert report.accepted_unique == len(keys), figures
        for edge in edges.values():
            assert edge.detected_s is not None and edge.detected_s <= edge.bound_s, figures
        for edge in edges.values():
            assert edge.lines and set(edge.lines.values()) == {1}, f"{edge.name}; {figures}"
