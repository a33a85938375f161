"""Configuration blocks shared by several zapstream deployables: Kafka, PostgreSQL, gateway.

Each deployable has its own settings class beside its code
(:mod:`streams.worker_settings`, :mod:`connectors.cdc.settings`,
:mod:`connectors.sink.settings`, :mod:`connectors.webhook.settings`), nests
these blocks, and is built once in ``main()`` and passed down. Nothing else
reads ``os.environ``. Secrets are ``SecretStr``
and can come from a secrets directory (``ZAPSTREAM_SECRETS_DIR``, e.g. a
Kubernetes volume with one file per variable name).

Our variables never use the ``FAUST_``/``F_`` prefixes: Faust reads those itself.
"""

from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, Any, Self

from pydantic import AliasChoices, Field, FilePath, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    import ssl

    from streams.kernel.contract import TopicNames


def _secrets_dir() -> str | None:
    # The one place besides pydantic that looks at the environment: where secrets live.
    path = os.environ.get("ZAPSTREAM_SECRETS_DIR")
    return path if path and os.path.isdir(path) else None


class SettingsBase(BaseSettings):
    model_config = SettingsConfigDict(
        extra="ignore", populate_by_name=True, use_attribute_docstrings=True
    )

    def __init__(self, **values: Any) -> None:
        super().__init__(_secrets_dir=_secrets_dir(), **values)


class BrokerFlavor(enum.StrEnum):
    """Which Kafka-protocol broker we talk to. Kafka-only features follow it."""

    KAFKA = "kafka"
    TANSU = "tansu"


class EndOffsetSource(enum.StrEnum):
    """Where a partition's latest offset (its high watermark) is read from."""

    LIST_OFFSETS = "list_offsets"
    """The ListOffsets request (``consumer.end_offsets``): one request for every partition."""
    HIGH_WATERMARK = "high_watermark"
    """The high watermark of a fetch response (``consumer.highwater``): one fetch per
    partition. Tansu answers ListOffsets wrong after multi-record batches (the last
    batch's base offset + 1); its fetch responses are right."""


class KafkaSecurityProtocol(enum.StrEnum):
    """How clients talk to the brokers: Kafka's ``security.protocol`` values."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (KafkaSecurityProtocol.SSL, KafkaSecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (KafkaSecurityProtocol.SASL_PLAINTEXT, KafkaSecurityProtocol.SASL_SSL)


class SaslMechanism(enum.StrEnum):
    """The SASL mechanisms zapstream offers (aiokafka's username/password ones)."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


_KAFKA = "ZAPSTREAM_KAFKA_"


class KafkaSettings(SettingsBase):
    """The Kafka cluster (``ZAPSTREAM_KAFKA_*``).

    Every Kafka client zapstream creates (the worker's Faust app, the relay's and
    the webhook's producers, the sink, the admin clients, the group-less readers)
    connects with :meth:`client_options`: the brokers, and TLS and SASL as
    ``security_protocol`` says.
    """

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_KAFKA_", extra="ignore")

    brokers: str = "127.0.0.1:9092"
    """Comma-separated ``host:port`` bootstrap brokers."""
    flavor: BrokerFlavor = BrokerFlavor.KAFKA
    """``kafka`` (Apache Kafka) or ``tansu``: Kafka-only features (transactions, the idempotent
    producer) follow it."""
    topic_prefix: str = ""
    """Prepended verbatim to every topic name (``staging-`` -> ``staging-zapstream.intents``),
    consumer group id and Faust app id (``staging-zapstream-worker``, and so its internal
    topics), so several deployments (staging and production, tenants) share one cluster
    without sharing a topic, group or offset. Kafka topic characters only
    (``[a-zA-Z0-9._-]``). Every deployable of one deployment must have the same."""
    partitions: int = Field(default=12, ge=1)
    """Partitions of the intent, results, state and parked topics (and Faust's changelogs) that
    ``zapstream topics ensure`` creates and the worker expects."""
    replication_factor: int = Field(default=1, ge=1)
    """Replicas of every topic zapstream creates."""
    session_timeout_s: float = Field(default=30.0, gt=0)
    """Consumer group session timeout: a member silent this long is removed from its group."""
    heartbeat_interval_s: float = Field(default=3.0, gt=0)
    """How often a group member sends its heartbeat to the group coordinator."""
    request_timeout_s: float = Field(default=40.0, gt=0)
    """How long any request to a broker waits for its answer (aiokafka ``request_timeout_ms``,
    Faust's ``broker_request_timeout``); past it the connection is closed and the request
    retried on a new one, so a broker that went silent without closing is noticed within
    this. At least ``session_timeout_s`` (Faust's rule) and above the fetch wait. The
    worker's producer keeps Faust's own ``producer_request_timeout`` (20 min), because
    aiokafka also expires unsent batches after it."""
    metadata_max_age_s: float = Field(default=60.0, gt=0)
    """Cluster metadata is refreshed at least this often (aiokafka ``metadata_max_age_ms``,
    default 5 min), so a moved or returning broker is found within a minute."""
    connections_max_idle_s: float = Field(default=300.0, gt=0)
    """An idle broker connection is closed after this (aiokafka ``connections_max_idle_ms``,
    default 9 min): below the idle timeouts of common NATs and load balancers (AWS NAT
    gateway: 350 s), so a connection they forgot is not reused."""
    idempotent_producer: bool | None = None
    """None: on for Apache Kafka, off for Tansu (it rejects InitProducerId)."""
    one_record_per_batch: bool = False
    """Test-only: send state/changelog records one per produce request, because Tansu's
    ListOffsets is wrong after multi-record batches and Faust recovery reads up to it."""
    fetch_max_wait_ms: int | None = Field(default=None, ge=1)
    """How long a consumer's fetch may wait on the broker for data. None: 1500 (Faust's own
    choice) for Apache Kafka, which answers a fetch as soon as data arrives so the wait only
    matters when idle; 10 for Tansu, which does not answer a waiting fetch early, so every
    consuming hop would otherwise wait the full time."""

    end_offsets: EndOffsetSource | None = None
    """How the lag monitor reads a partition's latest offset. None: ``list_offsets`` for
    Apache Kafka, ``high_watermark`` for Tansu."""

    security_protocol: KafkaSecurityProtocol = KafkaSecurityProtocol.PLAINTEXT
    """PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL over TLS): as the brokers'
    listener is configured. Managed clusters use SASL_SSL or SSL."""
    sasl_mechanism: SaslMechanism | None = None
    """PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; None: PLAIN. Only with a SASL_* protocol."""
    sasl_username: str = ""
    """The SASL user (Confluent Cloud: the API key). Required with a SASL_* protocol."""
    sasl_password: SecretStr = SecretStr("")
    """The SASL password (Confluent Cloud: the API secret); a secret, also read from
    ``ZAPSTREAM_SECRETS_DIR``. Required with a SASL_* protocol."""
    ssl_cafile: FilePath | None = None
    """PEM file of the certificate authorities that signed the brokers' certificates;
    None: the system's trust store (enough for public CAs, e.g. Confluent Cloud)."""
    ssl_certfile: FilePath | None = None
    """PEM client certificate (mutual TLS, e.g. Aiven's ``service.cert``, MSK port 9094)."""
    ssl_keyfile: FilePath | None = None
    """PEM private key of ``ssl_certfile`` (unencrypted); None: it is in ``ssl_certfile``."""
    ssl_check_hostname: bool = True
    """The broker's certificate must name the host connected to. Turn off only for
    brokers reached by an address their certificate does not name."""

    @field_validator("topic_prefix")
    @classmethod
    def _valid_topic_prefix(cls, prefix: str) -> str:
        from streams.kernel.contract import LOGICAL_TOPICS, topic_name_problem

        problem = topic_name_problem(prefix, max(LOGICAL_TOPICS, key=len))
        if problem is not None:
            raise ValueError(problem)
        return prefix

    @model_validator(mode="after")
    def _security_consistent(self) -> Self:
        protocol = self.security_protocol
        using = f"{_KAFKA}SECURITY_PROTOCOL={protocol.value}"
        if protocol.uses_sasl:
            missing = [
                f"{_KAFKA}{name}"
                for name, value in (
                    ("SASL_USERNAME", self.sasl_username),
                    ("SASL_PASSWORD", self.sasl_password.get_secret_value()),
                )
                if not value
            ]
            if missing:
                raise ValueError(f"{' and '.join(missing)} must be set with {using}")
        else:
            sasl = [
                f"{_KAFKA}{name}"
                for name, value in (
                    ("SASL_MECHANISM", self.sasl_mechanism),
                    ("SASL_USERNAME", self.sasl_username),
                    ("SASL_PASSWORD", self.sasl_password.get_secret_value()),
                )
                if value
            ]
            if sasl:
                raise ValueError(
                    f"{', '.join(sasl)} set, but {using} does not use SASL: "
                    f"set {_KAFKA}SECURITY_PROTOCOL=SASL_SSL (or SASL_PLAINTEXT)"
                )
        if not protocol.uses_tls:
            tls = [
                f"{_KAFKA}{name}"
                for name, value in (
                    ("SSL_CAFILE", self.ssl_cafile),
                    ("SSL_CERTFILE", self.ssl_certfile),
                    ("SSL_KEYFILE", self.ssl_keyfile),
                )
                if value is not None
            ]
            if tls:
                raise ValueError(
                    f"{', '.join(tls)} set, but {using} does not use TLS: "
                    f"set {_KAFKA}SECURITY_PROTOCOL=SSL (or SASL_SSL)"
                )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError(f"{_KAFKA}SSL_KEYFILE needs {_KAFKA}SSL_CERTFILE (its certificate)")
        return self

    @model_validator(mode="after")
    def _request_timeout_long_enough(self) -> Self:
        if self.request_timeout_s < self.session_timeout_s:
            raise ValueError(
                f"{_KAFKA}REQUEST_TIMEOUT_S={self.request_timeout_s:g} must be at least "
                f"{_KAFKA}SESSION_TIMEOUT_S={self.session_timeout_s:g}"
            )
        if self.request_timeout_s * 1000 <= self.consumer_fetch_max_wait_ms:
            raise ValueError(
                f"{_KAFKA}REQUEST_TIMEOUT_S={self.request_timeout_s:g} must be longer than "
                f"the fetch wait ({_KAFKA}FETCH_MAX_WAIT_MS={self.consumer_fetch_max_wait_ms})"
            )
        return self

    @property
    def mechanism(self) -> SaslMechanism:
        return self.sasl_mechanism or SaslMechanism.PLAIN

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: the CA file (or the system's), the client certificate."""
        from aiokafka.helpers import create_ssl_context

        context: ssl.SSLContext = create_ssl_context(
            cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
        )
        context.check_hostname = self.ssl_check_hostname
        return context

    def security_options(self) -> dict[str, Any]:
        """aiokafka's security keyword arguments (``security_protocol``, ``ssl_context``,
        ``sasl_*``), the same for a producer, a consumer and an admin client."""
        protocol = self.security_protocol
        options: dict[str, Any] = {"security_protocol": protocol.value}
        if protocol.uses_tls:
            options["ssl_context"] = self.ssl_context()
        if protocol.uses_sasl:
            options["sasl_mechanism"] = self.mechanism.value
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return options

    def deadline_options(self) -> dict[str, Any]:
        """aiokafka's ``request_timeout_ms``, ``metadata_max_age_ms`` and
        ``connections_max_idle_ms``: what our own clients are given besides
        :meth:`client_options` (a client with a tighter bound of its own sets it instead)."""
        return {
            "request_timeout_ms": round(self.request_timeout_s * 1000),
            "metadata_max_age_ms": round(self.metadata_max_age_s * 1000),
            "connections_max_idle_ms": round(self.connections_max_idle_s * 1000),
        }

    def client_options(self) -> dict[str, Any]:
        """``bootstrap_servers`` and :meth:`security_options`: what every aiokafka client
        (producer, consumer, admin) zapstream creates is given, once."""
        return {"bootstrap_servers": self.bootstrap_servers, **self.security_options()}

    @property
    def end_offset_source(self) -> EndOffsetSource:
        if self.end_offsets is not None:
            return self.end_offsets
        if self.flavor is BrokerFlavor.KAFKA:
            return EndOffsetSource.LIST_OFFSETS
        return EndOffsetSource.HIGH_WATERMARK

    @property
    def consumer_fetch_max_wait_ms(self) -> int:
        if self.fetch_max_wait_ms is not None:
            return self.fetch_max_wait_ms
        return 1500 if self.flavor is BrokerFlavor.KAFKA else 10

    @property
    def consumer_isolation_level(self) -> str:
        """``read_committed`` on Apache Kafka, ``read_uncommitted`` on Tansu (no transactions).

        Every consumer of records the relay produces (the worker, the state sink, the
        group-less readers) reads committed: with ``ZAPSTREAM_RELAY_EXACTLY_ONCE`` an aborted
        transaction's records are never seen. Without transactions it changes nothing: the
        last stable offset is the high watermark (and ListOffsets answers it)."""
        return "read_committed" if self.flavor is BrokerFlavor.KAFKA else "read_uncommitted"

    @property
    def use_idempotent_producer(self) -> bool:
        if self.idempotent_producer is not None:
            return self.idempotent_producer
        return self.flavor is BrokerFlavor.KAFKA

    @property
    def bootstrap_servers(self) -> list[str]:
        return [b.strip() for b in self.brokers.split(",") if b.strip()]

    @property
    def names(self) -> TopicNames:
        """Every topic and group name under ``topic_prefix``: the one place clients get them."""
        from streams.kernel.contract import TopicNames

        return TopicNames(self.topic_prefix)


def _default_lag_groups() -> dict[str, list[str]]:
    from streams.kernel.contract import BULK_INTENTS, INTENTS, INVALID, STATE

    return {"zapstream-worker": [INTENTS, BULK_INTENTS], "zapstream-state-sink": [STATE, INVALID]}


class LagMonitorSettings(SettingsBase):
    """Consumer lag (``ZAPSTREAM_LAG_*``): ``zapstream lag-monitor``, and each worker's own."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_LAG_", extra="ignore")

    interval_s: float = Field(default=10.0, gt=0)
    """How often committed offsets, latest offsets and the oldest unconsumed records are read."""
    read_timeout_s: float = Field(default=5.0, gt=0)
    """How long one reading waits for Kafka's answers before it keeps the last values."""
    groups: dict[str, list[str]] = Field(default_factory=_default_lag_groups)
    """``zapstream lag-monitor`` only: the consumer groups watched and the topics each
    consumes, JSON (default: the worker's and the state sink's groups). A worker watches
    its own group (``ZAPSTREAM_WORKER_APP_ID``) on the intent topics. Names before
    ``ZAPSTREAM_KAFKA_TOPIC_PREFIX``: the prefix is prepended to each group and topic
    (:meth:`watched`)."""
    metrics_port: int = Field(default=6068, ge=1, le=65535)
    """``zapstream lag-monitor`` serves its metrics at ``http://HOST:PORT/metrics``."""
    metrics_bind_local: bool = True
    """Serve metrics on 127.0.0.1 only; false binds 0.0.0.0 (containers)."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)

    def watched(self) -> dict[str, list[str]]:
        """:attr:`groups` as named on the cluster: the topic prefix on every group and topic."""
        names = self.kafka.names
        return {
            names.group(g): [names.prefix + t for t in topics] for g, topics in self.groups.items()
        }


class PostgresSettings(SettingsBase):
    """The application's PostgreSQL (``ZAPSTREAM_DATABASE_URL``), and how long its
    connections may stay silent (``ZAPSTREAM_DATABASE_*_S``).

    :attr:`dsn` is the URL with libpq's ``connect_timeout``, TCP keepalives and
    ``tcp_user_timeout`` added, so every connection (replication and plain) notices a
    peer that vanished without closing; a parameter the URL sets itself is kept as the
    user wrote it. :attr:`service_dsn` adds server-side ``statement_timeout`` and
    ``lock_timeout`` for the services' short queries (not for slot creation, migrations
    or operator commands, which may rightly run long).
    """

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_DATABASE_", extra="ignore")

    url: SecretStr = SecretStr("postgresql://postgres@127.0.0.1:5432/postgres")
    """The application database's libpq URL (``postgresql://user:password@host:5432/db``); a secret,
    also read from ``ZAPSTREAM_SECRETS_DIR``."""

    @field_validator("url")
    @classmethod
    def _a_connection_string(cls, url: SecretStr) -> SecretStr:
        """Refused at load, never at first use: libpq's own message quotes the whole string,
        password included, so the refusal names the form and not the value."""
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(url.get_secret_value())
        except ProgrammingError:
            raise ValueError(
                "not a connection string libpq reads (the value is not shown): "
                "write postgresql://user:password@host:5432/database"
            ) from None
        return url

    connect_timeout_s: int = Field(default=10, ge=2)
    """libpq ``connect_timeout``: the longest a connection attempt (TCP, TLS, login) waits."""
    keepalives_idle_s: int = Field(default=15, ge=1)
    """libpq ``keepalives_idle``: TCP keepalive probes start after this much silence on an
    idle connection; with the interval and count below a dead peer is noticed in
    15 + 5 x 3 = 30 s."""
    keepalives_interval_s: int = Field(default=5, ge=1)
    """libpq ``keepalives_interval``: between unanswered keepalive probes."""
    keepalives_count: int = Field(default=3, ge=1)
    """libpq ``keepalives_count``: unanswered probes before the connection is dropped."""
    tcp_user_timeout_s: float = Field(default=30.0, ge=0)
    """libpq ``tcp_user_timeout`` (Linux): data we sent that the peer has not acknowledged
    for this long drops the connection (what keepalives cannot see: a busy connection
    whose peer vanished); 0: the kernel's default (~15 minutes of retransmissions)."""
    statement_timeout_s: float = Field(default=30.0, ge=0)
    """Server-side ``statement_timeout`` of the services' queries (:attr:`service_dsn`);
    0: not sent (e.g. a PgBouncer in transaction mode that refuses ``options``)."""
    lock_timeout_s: float = Field(default=10.0, ge=0)
    """Server-side ``lock_timeout`` of the services' queries (:attr:`service_dsn`): a row an
    operator's transaction holds fails the write (retried) instead of blocking it; 0: not sent."""
    query_timeout_s: float = Field(default=45.0, gt=0)
    """Client-side deadline on one query or write of the state sink and the services' timers:
    longer than ``statement_timeout_s`` so the server's own timeout answers first; this one
    fires only when the server is silent (a hung connection), which is then dropped and
    reopened."""

    @property
    def dsn(self) -> str:
        """The URL with the connection deadlines added (see the class docstring)."""
        return with_connection_deadlines(self.url.get_secret_value(), self.connection_options())

    @property
    def service_dsn(self) -> str:
        """:attr:`dsn` with ``statement_timeout`` and ``lock_timeout`` in ``options``."""
        settings = []
        if self.statement_timeout_s > 0:
            settings.append(f"statement_timeout={round(self.statement_timeout_s * 1000)}")
        if self.lock_timeout_s > 0:
            settings.append(f"lock_timeout={round(self.lock_timeout_s * 1000)}")
        return with_server_settings(self.dsn, settings)

    def connection_options(self) -> dict[str, str]:
        """libpq parameters every connection gets unless the URL sets them."""
        options = {
            "connect_timeout": str(self.connect_timeout_s),
            "keepalives": "1",
            "keepalives_idle": str(self.keepalives_idle_s),
            "keepalives_interval": str(self.keepalives_interval_s),
            "keepalives_count": str(self.keepalives_count),
        }
        if self.tcp_user_timeout_s > 0:
            options["tcp_user_timeout"] = str(round(self.tcp_user_timeout_s * 1000))
        return options


def with_connection_deadlines(dsn: str, options: dict[str, str]) -> str:
    """``dsn`` (a URL or key=value string) with ``options`` added where it sets none of its own."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    missing = {k: v for k, v in options.items() if k not in params}
    if not missing:
        return dsn
    return make_conninfo(dsn, **missing)


def with_server_settings(dsn: str, settings: list[str]) -> str:
    """``dsn`` with ``-c name=value`` appended to its ``options`` for each setting it lacks."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    existing = str(conninfo_to_dict(dsn).get("options") or "")
    added = [s for s in settings if f"{s.split('=', 1)[0]}=" not in existing]
    if not added:
        return dsn
    options = " ".join([existing, *(f"-c {s}" for s in added)]).strip()
    return make_conninfo(dsn, options=options)


class GatewayKind(enum.StrEnum):
    STACKZAP = "stackzap"
    ZAPAPI = "zapapi"
    META = "meta"


def _default_stackzap_labels() -> dict[str, str]:
    return {
        "queued": "ACCEPTED",
        "pending": "ACCEPTED",
        "scheduled": "ACCEPTED",
        "processing": "ACCEPTED",
        "sending": "ACCEPTED",
        "sent": "ACCEPTED",
        "delivered": "DELIVERED",
        "read": "READ",
        "failed": "FAILED",
        "error": "FAILED",
        "cancelled": "CANCELLED",
        "canceled": "CANCELLED",
    }


def _default_zapapi_labels() -> dict[str, str]:
    return {
        "queued": "ACCEPTED",
        "pending": "ACCEPTED",
        "sent": "ACCEPTED",
        "server_ack": "ACCEPTED",
        "delivered": "DELIVERED",
        "delivery_ack": "DELIVERED",
        "read": "READ",
        "played": "READ",
        "failed": "FAILED",
        "error": "FAILED",
    }


def _default_meta_labels() -> dict[str, str]:
    """Meta's message statuses (send answer's ``message_status`` and status webhooks)."""
    return {
        "accepted": "ACCEPTED",
        "held_for_quality_assessment": "ACCEPTED",
        "sent": "ACCEPTED",
        "delivered": "DELIVERED",
        "read": "READ",
        "played": "READ",
        "failed": "FAILED",
    }


LISTING_QUERY_PARAMS = frozenset({"reference_param", "since_param"})
"""Listing fields that name query parameters; empty means the API has no such filter."""


def default_listing_fields() -> dict[str, str]:
    """The StackZap listing's names: the answer's keys and the narrowing query parameters.

    ``items`` (the array of jobs), ``id``, ``reference`` (our ``Idempotency-Key``),
    ``to``, ``text``, ``status``, ``created_at`` (in each job), ``next_page``,
    ``page``, ``page_size``, ``total``, ``counts`` (the page); ``reference_param``
    (repeatable ``?reference=<attempt id>``) and ``since_param`` (``?since=<ISO 8601>``)
    narrow the listing to the job being reconciled; "" when the API lacks the filter.
    """
    return {
        "items": "items",
        "id": "id",
        "reference": "reference",
        "to": "to",
        "text": "text",
        "status": "status",
        "created_at": "created_at",
        "next_page": "next_page",
        "page": "page",
        "page_size": "page_size",
        "total": "total",
        "counts": "counts",
        "reference_param": "reference",
        "since_param": "since",
    }


class GatewaySettings(SettingsBase):
    """Which gateway to call and how (``ZAPSTREAM_GATEWAY``, ``STACKZAP_*``, ``ZAP_*``,
    ``META_*``)."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    kind: GatewayKind = Field(
        default=GatewayKind.STACKZAP, validation_alias=AliasChoices("ZAPSTREAM_GATEWAY", "kind")
    )
    """Which gateway messages are sent through: ``stackzap``, ``zapapi`` or ``meta``."""
    stackzap_api_url: str = Field(
        default="http://127.0.0.1:8088",
        validation_alias=AliasChoices("STACKZAP_API_URL", "stackzap_api_url"),
    )
    """StackZap's base URL."""
    stackzap_api_key: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("STACKZAP_API_KEY", "stackzap_api_key"),
    )
    """StackZap's API key; a secret, also read from ``ZAPSTREAM_SECRETS_DIR``."""
    stackzap_labels: dict[str, str] = Field(
        default_factory=_default_stackzap_labels,
        validation_alias=AliasChoices("ZAPSTREAM_STACKZAP_LABELS", "stackzap_labels"),
    )
    """StackZap status label -> job status (JSON object; replaces the default map)."""
    zap_api_url: str = Field(
        default="http://127.0.0.1:8088", validation_alias=AliasChoices("ZAP_API_URL", "zap_api_url")
    )
    """The ZAP API's base URL."""
    zap_token: SecretStr = Field(
        default=SecretStr(""), validation_alias=AliasChoices("ZAP_TOKEN", "zap_token")
    )
    """The ZAP API's token; a secret, also read from ``ZAPSTREAM_SECRETS_DIR``."""
    zapapi_labels: dict[str, str] = Field(
        default_factory=_default_zapapi_labels,
        validation_alias=AliasChoices("ZAPSTREAM_ZAPAPI_LABELS", "zapapi_labels"),
    )
    """ZAP API status label -> job status (JSON object; replaces the default map)."""
    meta_graph_url: str = Field(
        default="https://graph.facebook.com",
        validation_alias=AliasChoices("META_GRAPH_URL", "meta_graph_url"),
    )
    """The Graph API's base URL (the simulator's URL in tests and ``make dev``)."""
    meta_api_version: str = Field(
        default="v21.0",
        pattern=r"^v\d+\.\d+$",
        validation_alias=AliasChoices("META_API_VERSION", "meta_api_version"),
    )
    """The Graph API version in every request's path (``vNN.N``)."""
    meta_access_token: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("META_ACCESS_TOKEN", "meta_access_token"),
    )
    """A system user's access token with ``whatsapp_business_messaging``."""
    meta_app_secret: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("META_APP_SECRET", "meta_app_secret"),
    )
    """The app secret Meta signs webhooks with (``X-Hub-Signature-256``); empty: every
    Meta callback is refused with 401."""
    meta_verify_token: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("META_VERIFY_TOKEN", "meta_verify_token"),
    )
    """The token typed into the app dashboard for the webhook subscription handshake
    (``hub.verify_token``); empty: the handshake is refused."""
    reference_key: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=AliasChoices("ZAPSTREAM_REFERENCE_KEY", "reference_key"),
    )
    """The key of the attempt references the gateway is told (``<job>-<seq>-<HMAC tag>``,
    :mod:`streams.kernel.attempt_reference`): the worker makes them, the webhook verifies
    receipts with them. The same value on every worker and webhook of a deployment, at least
    32 characters (both refuse to start otherwise), different between deployments; a
    secret, also read from ``ZAPSTREAM_SECRETS_DIR``. Changing it makes the receipts of
    attempts in flight unbound (they change nothing)."""
    meta_labels: dict[str, str] = Field(
        default_factory=_default_meta_labels,
        validation_alias=AliasChoices("ZAPSTREAM_META_LABELS", "meta_labels"),
    )
    """Meta message status -> job status (JSON object; replaces the default map)."""
    connect_timeout_s: float = Field(
        default=5.0,
        gt=0,
        validation_alias=AliasChoices("ZAPSTREAM_GATEWAY_CONNECT_TIMEOUT_S", "connect_timeout_s"),
    )
    """Longest wait for a TCP (and TLS) connection to the gateway; past it the send is transient."""
    read_timeout_s: float = Field(
        default=15.0,
        gt=0,
        validation_alias=AliasChoices("ZAPSTREAM_GATEWAY_READ_TIMEOUT_S", "read_timeout_s"),
    )
    """Longest wait for the gateway's answer once the request was written; past it the outcome is
    uncertain and is reconciled."""
    pool_timeout_s: float = Field(
        default=5.0,
        gt=0,
        validation_alias=AliasChoices("ZAPSTREAM_GATEWAY_POOL_TIMEOUT_S", "pool_timeout_s"),
    )
    """Longest wait for a free pooled connection (``max_connections``); past it the send is
    transient."""
    max_connections: int = Field(
        default=256,
        ge=1,
        validation_alias=AliasChoices("ZAPSTREAM_GATEWAY_MAX_CONNECTIONS", "max_connections"),
    )
    """Open connections to the gateway at most (the gateway client's pool). Every in-flight
    send holds one for the gateway's whole latency, so the pool caps throughput at
    ``max_connections / latency``: 256 (= ``ZAPSTREAM_WORKER_MAX_IN_FLIGHT``'s default)
    allows ~5,000 sends/s at 50 ms; keep it >= the worker's max in flight. A send that
    waits longer than ``pool_timeout_s`` for one is transient (nothing was written)."""

    listing_authoritative: bool = Field(
        default=True,
        validation_alias=AliasChoices(
            "ZAPSTREAM_GATEWAY_LISTING_AUTHORITATIVE", "listing_authoritative"
        ),
    )
    """The gateway's job listing shows every job it accepted (StackZap's does): when
    reconciliation finds no match, the message was not accepted and may be resent.
    False: no match is UNCERTAIN, never resent automatically."""

    stackzap_listing_fields: dict[str, str] = Field(
        default_factory=default_listing_fields,
        validation_alias=AliasChoices(
            "ZAPSTREAM_STACKZAP_LISTING_FIELDS", "stackzap_listing_fields"
        ),
    )
    """How the StackZap listing names things (JSON; keys not given keep their default, see
    :func:`default_listing_fields`). A listing that does not parse with these names
    postpones reconciliation (logged and counted), it never makes a job UNCERTAIN."""

    @field_validator("stackzap_listing_fields")
    @classmethod
    def _listing_fields_known(cls, value: dict[str, str]) -> dict[str, str]:
        fields = default_listing_fields()
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(f"unknown listing field(s) {unknown}; known: {sorted(fields)}")
        for key, name in value.items():
            if not isinstance(name, str) or (not name and key not in LISTING_QUERY_PARAMS):
                raise ValueError(f"listing field {key!r} needs a non-empty name")
        fields.update(value)
        return fields

    @field_validator("stackzap_labels", "zapapi_labels", "meta_labels")
    @classmethod
    def _labels_are_statuses(cls, value: dict[str, str]) -> dict[str, str]:
        from streams.kernel.contract import JobStatus

        for label, status in value.items():
            if status not in JobStatus.__members__:
                raise ValueError(f"label {label!r} maps to unknown status {status!r}")
        return {k.lower(): v for k, v in value.items()}
