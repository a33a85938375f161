"""The whole pipeline on throwaway local processes, for ``make dev`` and the tests.

:class:`LocalPipeline` starts a private PostgreSQL cluster (wal_level=logical)
and a broker on free ports in its own directory, applies the schema,
creates the topics, and runs the gateway simulator, the state sink, relays and
workers (and, on demand, the lag monitor, the console and the webhook receiver) as
real ``zapstream`` subprocesses that tests can SIGKILL and restart.

The broker is Apache Kafka by default (:class:`devtools.stack.kafka_broker.KafkaBroker`, one
KRaft node; or the process's shared one, :mod:`devtools.stack.shared_broker`), or Tansu with
``broker="tansu"`` or ``DEVSTACK_BROKER=tansu``.
Tansu differs from Apache Kafka (docs/guides/development.md):
Kafka-only features are switched off through ``ZAPSTREAM_KAFKA_FLAVOR=tansu``,
and short session timeouts keep group joins at a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from connectors.ops.topics import ensure_topics
from connectors.outbox.migrate import migrate
from devtools.simulator.tcp_proxy import TcpProxy
from devtools.stack import shared_broker
from devtools.stack.devstack import ManagedProcess, PostgresCluster, TansuBroker, find_free_port
from devtools.stack.kafka_broker import BrokerSasl, KafkaBroker, KafkaCluster, kafka_version
from devtools.stack.tls import Pki
from streams.kernel.contract import TopicNames
from streams.kernel.kafka_access import access_table, acl_bindings
from streams.kernel.settings import BrokerFlavor, KafkaSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
SIM_API_KEY = "dev-stackzap-key"
SIM_TOKEN = "dev-zap-token"
WEBHOOK_SECRET = "dev-webhook-secret-for-local-tests-only"
"""At least 32 characters, as ``zapstream webhook`` requires."""
REFERENCE_KEY = "dev-reference-key-for-local-tests-only"
"""``ZAPSTREAM_REFERENCE_KEY`` of the workers and the webhook (at least 32 characters)."""
META_APP_SECRET = "dev-meta-app-secret"
META_VERIFY_TOKEN = "dev-meta-verify-token"
CONSOLE_DEMO_TOKEN = "dev-console-demo-token-not-a-secret"
"""The console login of ``make dev`` (operator ``demo``): a fixed demo value, not a secret."""
CONSOLE_DEMO_TOKENS = {CONSOLE_DEMO_TOKEN: {"operator": "demo", "role": "operator"}}
LOGIN_ROLES = {
    "relay": "zs_relay",
    "worker": "zs_worker",
    "sink": "zs_sink",
    "webhook": "zs_webhook",
    "console": "zs_console",
    "operator": "zs_operator",
    "app": "zs_app",
    "prune": "zs_prune",
}
"""The login role of each component with ``per_component_roles`` (a member of its
``zapstream_<component>`` group role)."""
BROKERS = ("tansu", "kafka")
BROKER_ENV = "DEVSTACK_BROKER"
"""Picks the broker of a pipeline that was not given one: ``kafka`` (default) or ``tansu``.
Not ``ZAPSTREAM_*``: zapstream refuses to start with a ``ZAPSTREAM_`` variable no setting reads,
and every service the tests start inherits the environment."""


def default_broker() -> str:
    """``DEVSTACK_BROKER`` if set (``kafka`` or ``tansu``), else ``kafka`` (Apache Kafka)."""
    broker = os.environ.get(BROKER_ENV, "").strip().lower() or "kafka"
    if broker not in BROKERS:
        raise ValueError(f"{BROKER_ENV}={broker!r}: expected one of {', '.join(BROKERS)}")
    return broker


class LocalPipeline:
    """PostgreSQL + a broker (Tansu or Apache Kafka) + simulator, and relay/worker processes
    on demand."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        partitions: int = 8,
        log_level: str = "info",
        worker_env: dict[str, str] | None = None,
        keep: bool = False,
        with_sink: bool = True,
        proxied: bool = False,
        tls: Pki | None = None,
        broker: str | None = None,
        kafka_nodes: int = 1,
        topic_prefix: str = "",
        own_broker: bool = False,
        per_component_roles: bool = False,
        sasl: bool = False,
        postgres: PostgresCluster | None = None,
    ) -> None:
        """``postgres``: the (not yet started) cluster to run, default a
        :class:`~devtools.stack.devstack.PostgresCluster` of ``DEVSTACK_POSTGRES``'s version;
        a test may replace :attr:`postgres` later by a cluster on the same port (an upgrade).

        ``broker``: ``"tansu"`` or ``"kafka"`` (Apache Kafka, one KRaft node); default
        :func:`default_broker` (``DEVSTACK_BROKER``, else Apache Kafka). ``kafka_nodes`` (with
        ``broker="kafka"``): 3 runs :class:`~devtools.stack.kafka_broker.KafkaCluster` (replication
        factor 3, ``min.insync.replicas`` 2; the topics and Faust's changelogs get RF 3).

        ``with_sink``: :meth:`start` also runs ``zapstream sink`` (states into PostgreSQL).

        ``per_component_roles``: the recommended production setup. :meth:`start` applies
        the group roles (:mod:`connectors.outbox.roles`), creates the publication and the
        slot as the owner (what ``zapstream db migrate`` does), and one login role per
        component (:data:`LOGIN_ROLES`, the relay's with REPLICATION); each service then
        connects as its own (:meth:`component_dsn`), never as the superuser.

        ``topic_prefix``: ``ZAPSTREAM_KAFKA_TOPIC_PREFIX`` of :meth:`start`'s ``topics ensure``,
        of every service and of :meth:`kafka_settings` (every topic and group named with it).

        ``own_broker``: never the process's shared broker (:mod:`devtools.stack.shared_broker`),
        for a test that kills, restarts or reconfigures its broker. When sharing is on
        (the integration tests turn it on) a plain one-node Apache Kafka pipeline uses the
        shared broker under a topic prefix of its own (``topic_prefix`` if given) and
        deletes its topics when it stops; :attr:`topics` names them.

        ``proxied``: the services reach PostgreSQL and Kafka through
        :class:`~devtools.simulator.tcp_proxy.TcpProxy` instances (``pg_proxy``,
        ``kafka_proxy``) that tests can cut; the broker advertises the proxy's port.
        The test's own connections (:attr:`dsn`) go direct.
        ``tls``: Kafka speaks TLS only (the broker's certificate signed by ``tls.ca_file``);
        every service, and :meth:`kafka_settings`, connects with
        ``ZAPSTREAM_KAFKA_SECURITY_PROTOCOL=SSL`` and that CA file.
        ``sasl`` (Apache Kafka, one node of its own): clients log in (SASL_PLAINTEXT,
        SCRAM-SHA-512) and the broker authorizes them with the ACLs of
        :func:`streams.kernel.kafka_access.access_table` for this pipeline's names: one user
        per component (:attr:`kafka_users`). Each service started here runs as its
        component's user (the relay as ``zapstream-relay`` ...); :meth:`start`'s topics and
        :meth:`kafka_settings` use the ``admin`` component's (``zapstream topics ensure``).
        """
        if sasl and (broker == "tansu" or proxied or tls is not None or kafka_nodes != 1):
            raise ValueError("sasl needs one Apache Kafka node, neither proxied nor TLS")
        if tls is not None and proxied:
            raise ValueError("a TLS pipeline is not proxied")
        # kafka_nodes > 1: Apache Kafka's KafkaCluster (RF kafka_nodes, min.insync 2), direct.
        if kafka_nodes != 1 and (broker != "kafka" or proxied or tls is not None):
            raise ValueError("kafka_nodes > 1 needs broker='kafka', neither proxied nor TLS")
        self.kafka_nodes = kafka_nodes
        self.topic_prefix = topic_prefix
        self.broker = broker if broker is not None else default_broker()
        if self.broker not in BROKERS:
            raise ValueError(f"broker={self.broker!r}: expected one of {', '.join(BROKERS)}")
        self.shares_broker = (
            shared_broker.sharing()
            and not own_broker
            and self.broker == "kafka"
            and kafka_nodes == 1
            and not proxied
            and tls is None
            and not sasl
        )
        if self.shares_broker and not self.topic_prefix:
            self.topic_prefix = shared_broker.next_prefix()
        self.topics = TopicNames(self.topic_prefix)
        """The names of this pipeline's topics and groups (its prefix applied)."""
        self.tls = tls
        self.kafka_access = access_table(self.topics) if sasl else {}
        """Component -> its Kafka access (empty without ``sasl``)."""
        self.kafka_users = {
            access.user: f"{access.user}-{secrets.token_hex(8)}"
            for access in self.kafka_access.values()
        }
        """Kafka user -> password (``sasl``)."""
        self._own_dir = base_dir is None
        self.dir = Path(base_dir or tempfile.mkdtemp(prefix="zapstream-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.partitions = partitions
        self.log_level = log_level
        self.worker_env = dict(worker_env or {})
        self.keep = keep
        # Not under self.dir: mkdtemp makes it 0700, which the postgres OS user cannot enter.
        self.postgres = postgres if postgres is not None else PostgresCluster()
        self.pg_proxy: TcpProxy | None = None
        self.kafka_proxy: TcpProxy | None = None
        self.kafka: TansuBroker | KafkaBroker | KafkaCluster
        server_tls = tls.server if tls is not None else None
        if proxied:
            kafka_port = find_free_port()
            self.pg_proxy = TcpProxy(self.postgres.port, port=find_free_port())
            self.kafka_proxy = TcpProxy(kafka_port, port=find_free_port())
            if self.broker == "kafka":
                self.kafka = KafkaBroker(
                    kafka_port, base_dir=self.dir / "kafka", advertised_port=self.kafka_proxy.port
                )
            else:
                self.kafka = TansuBroker(
                    kafka_port,
                    log_path=self.dir / "tansu.log",
                    advertised_port=self.kafka_proxy.port,
                )
        elif self.shares_broker:
            self.kafka = shared_broker.shared_broker()
        elif self.broker == "kafka" and kafka_nodes > 1:
            self.kafka = KafkaCluster(nodes=kafka_nodes, base_dir=self.dir / "kafka")
        elif self.broker == "kafka":
            self.kafka = KafkaBroker(
                base_dir=self.dir / "kafka",
                tls=server_tls,
                sasl=BrokerSasl(self.kafka_users) if sasl else None,
            )
        else:
            self.kafka = TansuBroker(log_path=self.dir / "tansu.log", tls=server_tls)
        self.sim_port = find_free_port()
        self.simulator: ManagedProcess | None = None
        self.processes: list[ManagedProcess] = []
        self.with_sink = with_sink
        self.sink: ManagedProcess | None = None
        self.per_component_roles = per_component_roles

    # --- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> LocalPipeline:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for proxy in (self.pg_proxy, self.kafka_proxy):
            if proxy is not None:
                proxy.start()
        self.postgres.start()
        if not self.shares_broker:
            self.kafka.start()
        if self.kafka_access:
            assert isinstance(self.kafka, KafkaBroker)
            self.kafka.create_acls(acl_bindings(self.kafka_access))
        migrate(self.dsn)
        if self.per_component_roles:
            self.create_component_roles()
        asyncio.run(ensure_topics(self.kafka_settings()))
        self.simulator = self.process(
            "gateway-sim",
            [
                "--port",
                str(self.sim_port),
                "--api-key",
                SIM_API_KEY,
                "--token",
                SIM_TOKEN,
            ],
            module="devtools.simulator.gateway_sim",
        )
        self.simulator.start()
        self.simulator.wait_for_log(r"listening|started|port", timeout_s=30)
        self.wait_sim_ready()
        if self.with_sink:
            self.start_sink()

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
        for proxy in (self.pg_proxy, self.kafka_proxy):
            if proxy is not None:
                proxy.stop()
        if self.shares_broker:
            shared_broker.delete_namespace(self.kafka.bootstrap, self.topic_prefix)
        else:
            self.kafka.stop()
        self.postgres.stop()
        if self._own_dir and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- configuration ----------------------------------------------------------------

    @property
    def dsn(self) -> str:
        return self.postgres.dsn()

    @property
    def service_dsn(self) -> str:
        """The DSN the services use: through ``pg_proxy`` when proxied."""
        if self.pg_proxy is None:
            return self.dsn
        return f"postgresql://postgres@127.0.0.1:{self.pg_proxy.port}/postgres"

    def component_dsn(self, component: str) -> str:
        """The DSN ``component`` connects with: its own login role with ``per_component_roles``
        (through ``pg_proxy`` when proxied), else :attr:`service_dsn` (the superuser)."""
        if not self.per_component_roles:
            return self.service_dsn
        port = self.pg_proxy.port if self.pg_proxy is not None else self.postgres.port
        return f"postgresql://{LOGIN_ROLES[component]}@127.0.0.1:{port}/postgres"

    def _database_env(self, component: str) -> dict[str, str]:
        if not self.per_component_roles:
            return {}
        return {"ZAPSTREAM_DATABASE_URL": self.component_dsn(component)}

    def create_component_roles(self) -> None:
        """Group roles and grants, publication and slot as the owner, and one login role per
        component in :data:`LOGIN_ROLES` (the cluster trusts local connections: no passwords)."""
        from connectors.cdc.provisioning import ensure_replication
        from connectors.cdc.settings import RelaySettings
        from connectors.outbox.roles import apply_roles, component_role

        apply_roles(self.dsn)
        defaults = RelaySettings.model_fields
        ensure_replication(
            self.dsn,
            slot=str(defaults["slot"].default),
            publication=str(defaults["publication"].default),
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for component, login in LOGIN_ROLES.items():
                spec = component_role(component)
                replication = " REPLICATION" if spec.replication else ""
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN{} IN ROLE {}").format(
                        sql.Identifier(login), sql.SQL(replication), sql.Identifier(spec.role)
                    )
                )

    @property
    def service_brokers(self) -> str:
        """The bootstrap servers the services use: through ``kafka_proxy`` when proxied."""
        if self.kafka_proxy is None:
            return self.kafka.bootstrap
        return f"127.0.0.1:{self.kafka_proxy.port}"

    @property
    def flavor(self) -> BrokerFlavor:
        """``ZAPSTREAM_KAFKA_FLAVOR`` of the services: what the broker supports."""
        return BrokerFlavor.KAFKA if self.broker == "kafka" else BrokerFlavor.TANSU

    @property
    def broker_description(self) -> str:
        """The broker in words, for the lines that say what a run ran on."""
        if self.broker == "kafka":
            nodes = "1 node" if self.kafka_nodes == 1 else f"{self.kafka_nodes} nodes"
            return f"Apache Kafka {kafka_version()} (KRaft, {nodes})"
        return "Tansu"

    @property
    def sim_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    def kafka_settings(self) -> KafkaSettings:
        security: dict[str, Any] = {}
        if self.tls is not None:
            security = {"security_protocol": "SSL", "ssl_cafile": self.tls.ca_file}
        if self.kafka_access:
            user = self.kafka_access["admin"].user
            security = {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": user,
                "sasl_password": self.kafka_users[user],
            }
        return KafkaSettings(
            brokers=self.kafka.bootstrap,
            flavor=self.flavor,
            partitions=self.partitions,
            replication_factor=self.kafka_nodes,
            topic_prefix=self.topic_prefix,
            session_timeout_s=6,
            heartbeat_interval_s=1,
            **security,
        )

    def kafka_security_env(self) -> dict[str, str]:
        """``ZAPSTREAM_KAFKA_SECURITY_PROTOCOL`` and the CA file when Kafka speaks TLS; the
        protocol and mechanism with ``sasl`` (the user: :meth:`kafka_user_env`)."""
        if self.kafka_access:
            return {
                "ZAPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "ZAPSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            }
        if self.tls is None:
            return {}
        return {
            "ZAPSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
            "ZAPSTREAM_KAFKA_SSL_CAFILE": str(self.tls.ca_file),
        }

    def env(self) -> dict[str, str]:
        return {
            "ZAPSTREAM_DATABASE_URL": self.service_dsn,
            "ZAPSTREAM_KAFKA_BROKERS": self.service_brokers,
            "ZAPSTREAM_KAFKA_FLAVOR": self.flavor.value,
            "ZAPSTREAM_KAFKA_PARTITIONS": str(self.partitions),
            "ZAPSTREAM_KAFKA_REPLICATION_FACTOR": str(self.kafka_nodes),
            "ZAPSTREAM_KAFKA_TOPIC_PREFIX": self.topic_prefix,
            "ZAPSTREAM_KAFKA_SESSION_TIMEOUT_S": "6",
            "ZAPSTREAM_KAFKA_HEARTBEAT_INTERVAL_S": "1",
            "ZAPSTREAM_GATEWAY": "stackzap",
            "STACKZAP_API_URL": self.sim_url,
            "STACKZAP_API_KEY": SIM_API_KEY,
            "ZAP_API_URL": self.sim_url,
            "ZAP_TOKEN": SIM_TOKEN,
            "ZAPSTREAM_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "ZAPSTREAM_REFERENCE_KEY": REFERENCE_KEY,
            # The simulator speaks the Cloud API too (ZAPSTREAM_GATEWAY=meta picks it).
            "META_GRAPH_URL": self.sim_url,
            "META_ACCESS_TOKEN": SIM_TOKEN,
            "META_APP_SECRET": META_APP_SECRET,
            "META_VERIFY_TOKEN": META_VERIFY_TOKEN,
            **self.kafka_security_env(),
        }

    def kafka_user_env(self, component: str) -> dict[str, str]:
        """``ZAPSTREAM_KAFKA_SASL_USERNAME``/``_PASSWORD`` of ``component``'s Kafka user
        (``sasl``); empty without ``sasl``."""
        access = self.kafka_access.get(component)
        if access is None:
            return {}
        return {
            "ZAPSTREAM_KAFKA_SASL_USERNAME": access.user,
            "ZAPSTREAM_KAFKA_SASL_PASSWORD": self.kafka_users[access.user],
        }

    # --- processes ----------------------------------------------------------------------

    def process(
        self,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        *,
        module: str = "connectors.cli",
        kafka_user: str | None = None,
    ) -> ManagedProcess:
        """A ``python -m module`` subprocess (``zapstream`` by default) with the pipeline's env.

        The repository root goes on ``PYTHONPATH`` so the development tools in
        ``devtools/``, which the package does not ship, import in the child too.
        """
        pythonpath = os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        full_env = {
            **os.environ,
            **self.env(),
            **(self.kafka_user_env(kafka_user) if kafka_user else {}),
            "PYTHONPATH": pythonpath,
            **(env or {}),
        }
        proc = ManagedProcess(
            [sys.executable, "-m", module, "--log-level", self.log_level, *args],
            env=full_env,
            log_path=self.dir / f"{name}.log",
            name=name,
        )
        self.processes.append(proc)
        return proc

    def start_relay(
        self, name: str = "relay", *, wait: bool = True, env: dict[str, str] | None = None
    ) -> ManagedProcess:
        """Run a relay; ``env`` adds to (and overrides) its settings."""
        proc = self.process(
            name,
            ["relay"],
            {
                "ZAPSTREAM_RELAY_STATUS_INTERVAL_S": "0.5",
                **self._database_env("relay"),
                **(env or {}),
            },
            kafka_user="relay",
        )
        proc.start()
        if wait:
            proc.wait_for_log(r"relay (streaming|standby)", timeout_s=60)
        return proc

    def start_worker(
        self, name: str = "worker", *, wait: bool = True, env: dict[str, str] | None = None
    ) -> ManagedProcess:
        """Run a worker; ``env`` adds to (and overrides) the pipeline's ``worker_env``."""
        full_env = {
            "ZAPSTREAM_WORKER_WEB_PORT": str(find_free_port()),
            "ZAPSTREAM_WORKER_DATA_DIR": str(self.dir / name),
            **self._database_env("worker"),
            **self.worker_env,
            **(env or {}),
        }
        proc = self.process(name, ["worker"], full_env, kafka_user="worker")
        proc.start()
        if wait:
            proc.wait_for_log(r"\[\^Worker\]: Ready", timeout_s=120)
        return proc

    def start_sink(
        self, name: str = "sink", *, wait: bool = True, env: dict[str, str] | None = None
    ) -> ManagedProcess:
        """Run ``zapstream sink``, the state write-back, as its own process.

        ``env`` adds to (and overrides) its settings; its metrics port is a free one.
        """
        full_env = {
            "ZAPSTREAM_SINK_METRICS_PORT": str(find_free_port()),
            "ZAPSTREAM_SINK_RETRY_MAX_S": "2",
            **self._database_env("sink"),
            **(env or {}),
        }
        proc = self.process(name, ["sink"], full_env, kafka_user="sink")
        proc.start()
        if wait:
            proc.wait_for_log(r"state sink consuming", timeout_s=60)
        self.sink = proc
        return proc

    def start_lag_monitor(
        self, name: str = "lag-monitor", *, env: dict[str, str] | None = None
    ) -> tuple[ManagedProcess, str]:
        """Run ``zapstream lag-monitor`` on a free metrics port; return it and its metrics URL.

        ``env`` adds to (and overrides) its settings (e.g. ``ZAPSTREAM_LAG_INTERVAL_S``).
        """
        port = find_free_port()
        proc = self.process(
            name,
            ["lag-monitor"],
            {"ZAPSTREAM_LAG_METRICS_PORT": str(port), **(env or {})},
            kafka_user="lag-monitor",
        )
        proc.start()
        proc.wait_for_log(r"lag monitor watching", timeout_s=30)
        return proc, f"http://127.0.0.1:{port}/metrics"

    def start_console(
        self,
        tokens: dict[str, dict[str, str]] | None = None,
        *,
        lag_url: str = "",
        name: str = "console",
        port: int | None = None,
    ) -> tuple[ManagedProcess, str]:
        """Run ``zapstream console``; return it and its URL once it listens.

        ``tokens``: ``ZAPSTREAM_CONSOLE_TOKENS`` (default :data:`CONSOLE_DEMO_TOKENS`);
        ``lag_url``: the lag monitor's metrics URL (:meth:`start_lag_monitor`), empty: no
        lag shown; ``port``: default a free one.
        """
        port = port or find_free_port()
        proc = self.process(
            name,
            ["console"],
            {
                "ZAPSTREAM_CONSOLE_TOKENS": json.dumps(tokens or CONSOLE_DEMO_TOKENS),
                "ZAPSTREAM_CONSOLE_PORT": str(port),
                "ZAPSTREAM_CONSOLE_LAG_URL": lag_url,
                **self._database_env("console"),
            },
        )
        proc.start()
        proc.wait_for_log(r"console listening", timeout_s=30)
        return proc, f"http://127.0.0.1:{port}"

    def start_webhook(self, name: str = "webhook", *, env: dict[str, str] | None = None) -> str:
        """Run ``zapstream webhook`` and point the simulator's callbacks at it; return its URL.

        ``env`` adds to (and overrides) its settings."""
        port = find_free_port()
        proc = self.process(
            name,
            ["webhook"],
            {
                "ZAPSTREAM_WEBHOOK_PORT": str(port),
                **self._database_env("webhook"),
                **(env or {}),
            },
            kafka_user="webhook",
        )
        proc.start()
        url = f"http://127.0.0.1:{port}"
        import time

        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/v1/webhooks/health", timeout=1.0).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or not proc.is_running:
                    raise
                time.sleep(0.1)
        self.sim_config(
            callback_url=f"{url}/v1/webhooks/stackzap",
            callback_secret=WEBHOOK_SECRET,
            meta_callback_url=f"{url}/v1/webhooks/meta",
            meta_app_secret=META_APP_SECRET,
        )
        return url

    # --- the simulator's control API -------------------------------------------------------

    def wait_sim_ready(self, timeout_s: float = 15.0) -> None:
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                httpx.get(f"{self.sim_url}/_sim/stats", timeout=1.0).raise_for_status()
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def sim_messages(self, since: int = 0) -> list[dict[str, Any]]:
        """Messages the simulator accepted, in arrival order, from sequence ``since`` on."""
        response = httpx.get(f"{self.sim_url}/_sim/messages", params={"since": since}, timeout=30.0)
        response.raise_for_status()
        data = response.json()
        return list(data["messages"] if isinstance(data, dict) else data)

    def sim_config(self, **config: Any) -> None:
        httpx.post(f"{self.sim_url}/_sim/config", json=config, timeout=5.0).raise_for_status()
