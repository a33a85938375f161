"""Settings of ``zapstream worker`` (``ZAPSTREAM_WORKER_*``), read once in ``main()``."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from streams.kernel.settings import (
    GatewaySettings,
    KafkaSettings,
    LagMonitorSettings,
    PostgresSettings,
    SettingsBase,
)
from streams.quiet_hours import parse_window


class InstanceLimit(BaseModel):
    """One instance's configured send rate (``ZAPSTREAM_WORKER_INSTANCE_RATES``)."""

    rate_per_s: float = Field(ge=0)
    burst: float = Field(default=5.0, ge=1)


class WorkerSettings(SettingsBase):
    """``zapstream worker`` (``ZAPSTREAM_WORKER_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_WORKER_", extra="ignore")

    app_id: str = "zapstream-worker"
    """The Faust app id, which is also the worker's consumer group and starts the names of
    Faust's own topics; ``ZAPSTREAM_KAFKA_TOPIC_PREFIX`` goes before it (:attr:`group_id`)."""
    data_dir: str = "/tmp/zapstream-worker"
    """Faust's data directory (its table state on local disk)."""
    web_port: int = Field(default=6066, ge=1)
    """Port of Faust's web server (``/metrics``, ``/healthz``, ``/readyz``)."""
    web_bind_local: bool = True
    """Bind Faust's web server (metrics) to 127.0.0.1; set false in containers."""
    max_in_flight: int = Field(default=256, ge=1)
    """Intents being sent at once by one worker (across conversations)."""
    max_in_flight_bulk: int = Field(default=128, ge=1)
    """Bulk intents queued or being sent at once; when reached, the bulk topic waits."""
    """Intents being sent at once by one worker (across conversations)."""
    retry_schedule_s: list[float] = Field(
        default_factory=lambda: [60.0, 300.0, 1800.0, 7200.0, 86400.0]
    )
    """Delay before retry n (the outbox article's 1 min, 5 min, 30 min, 2 h, 24 h); the
    last value repeats. JSON list, e.g. ``ZAPSTREAM_WORKER_RETRY_SCHEDULE_S=[1,1,1]``."""
    retry_jitter: float = Field(default=0.2, ge=0, le=1)
    """Each delay is drawn from [delay * (1 - jitter), delay]."""
    retry_scan_interval_s: float = Field(default=0.5, gt=0)
    """How often parked conversations are checked for due retries."""
    breaker_failures: int = Field(default=5, ge=0)
    """Transient gateway failures of one instance in a row after which the instance is
    paused like a refused one (probed every ``instance_probe_s``); 0 switches it off."""
    instance_probe_s: float = Field(default=30.0, gt=0)
    """While the gateway refuses an instance (401/403, unknown instance) its messages
    wait, and one of them is sent this often to find out whether it was fixed."""
    instance_probe_max_s: float = Field(default=300.0, gt=0)
    """An instance paused for a configuration fault (a 404 on the send route, or
    ``systemic_failures``) is probed after ``instance_probe_s``, then twice as long after
    each failed probe, up to this."""
    template_recheck_s: float = Field(default=600.0, gt=0)
    """While Meta has a template paused (error 132015; Meta pauses for 3 or 6 hours) its
    messages wait, and one of them is sent this often to find out whether it works again."""
    systemic_failures: int = Field(default=5, ge=0)
    """The same permanent error (not one about the recipient) for this many sends in a row
    to different recipients of one instance pauses the instance like a wrong base URL: the
    earlier ones are FAILED (reprocess them), this one and the later ones wait; 0: never."""
    start_probe: bool = True
    """At start, make one harmless request per ``probe_instances`` (StackZap: one listing
    page; ZAP API: an empty send body; Meta: the number's node) and log what is wrong with
    the gateway's base URL, credentials or listing; a wrong base URL pauses the instances."""
    probe_instances: list[str] = Field(default_factory=list)
    """Instances the start-up check asks about (JSON list); empty: the keys of
    ``instance_rates``, or else one placeholder id that tells a wrong route only."""
    failure_summary_interval_s: float = Field(default=300.0, gt=0)
    """While a gateway failure class lasts, at most one summary line per instance this often."""
    reconcile_max_wait_s: float = Field(default=600.0, gt=0)
    """How long a job whose outcome is unknown (a crash after the journal write, a timeout
    after the request was written) waits for a gateway listing that concludes; then it is
    UNCERTAIN (counted, alerted) and its conversation moves on. 10 minutes covers a gateway
    restart or a short listing outage, and bounds how long one conversation is held."""
    reconcile_listings_per_minute: int = Field(default=60, ge=1)
    """At most this many listing requests (pages included) per instance in any minute, for
    every job being reconciled together; after a failure the instance's listing backs off
    (2 s doubling to 60 s). One a second is polite to a gateway and, with jobs sharing a
    request, keeps up with a gateway dropping 10% of its responses (12 a minute made each
    uncertain send wait up to a minute for its turn)."""
    failure_quiet_period_s: float = Field(default=60.0, ge=0)
    """A gateway failure class of an instance ends (one INFO line) only at a success this long
    after its last failure; a failure that recurs sooner continues the same outage."""
    commit_interval_s: float = Field(default=1.0, gt=0)
    """How often the worker commits its consumer offsets (Faust's ``broker_commit_interval``)."""
    dedup_horizon_s: float = Field(default=3600.0, ge=0)
    """A settled job leaves the ``jobs`` table (and, by a tombstone, ``zapstream.state``)
    this long after its last change, once the state sink wrote it (default 1 hour: the
    table holds about 0.9 KB per job inside the horizon); 0 keeps every job forever. An
    intent for a forgotten job is checked against ``outbox_jobs`` (``ZAPSTREAM_DATABASE_URL``)."""
    dedup_margin_s: float = Field(default=300.0, ge=0)
    """Intents younger than ``dedup_horizon_s`` minus this are new without a lookup; the
    margin covers clock skew between PostgreSQL and the worker."""
    dedup_scan_interval_s: float = Field(default=1.0, gt=0)
    """How often the horizon timer forgets the settled jobs that fell due; a due job a lane,
    a parked conversation or the state sink holds back is judged again this much later."""
    dedup_scan_keys: int = Field(default=10_000, ge=1)
    """Jobs judged per tick (about 3 µs each, one state decoded): those of the horizon's
    index that fell due, and the keys of the one sweep over the ``jobs`` table after a
    start or a rebalance (it indexes the states recovered from the changelog). It must
    outpace the jobs that settle per interval, or due jobs wait."""
    dedup_lookup_retry_s: float = Field(default=10.0, gt=0)
    """While ``outbox_jobs`` cannot be asked, a late intent's conversation waits this long."""
    dedup_sink_group: str = "zapstream-state-sink"
    """The state sink's consumer group (its ``ZAPSTREAM_SINK_GROUP_ID``): a settled job is
    forgotten only once this group's committed offset shows its last state in PostgreSQL.
    Empty: forget without asking (a job could then be sent twice if it is redelivered
    while the sink is behind)."""
    dedup_sink_margin_s: float = Field(default=10.0, ge=0)
    """A state counts as written when it changed this long before the last record the
    sink committed (covers the moment between a change and its send, and clock skew
    between workers)."""
    dedup_sink_check_s: float = Field(default=5.0, gt=0)
    """How often the sink group's committed offsets are read."""

    instance_rate_per_s: float = Field(default=0.0, ge=0)
    """Sends per second allowed per WhatsApp instance, shared by all workers (each takes
    the share of its partitions); 0: only the gateway's own limits (learnt from 429s)."""
    instance_burst: float = Field(default=5.0, ge=1)
    """Sends an instance may make at once above its rate."""
    instance_rates: dict[str, InstanceLimit] = Field(default_factory=dict)
    """Per-instance overrides, JSON: ``{"inst-1": {"rate_per_s": 20, "burst": 5}}``."""
    recipient_interval_s: float | None = Field(default=None, ge=0)
    """At most one message per this many seconds per conversation (business number/user
    pair), with ``recipient_burst``. None: the gateway's default (Meta 6 s, others none)."""
    recipient_burst: float = Field(default=3.0, ge=1)
    """Messages a conversation may get at once above ``recipient_interval_s``."""
    quiet_hours: str | None = None
    """Local time in which bulk jobs are not sent, ``HH:MM-HH:MM`` (e.g. ``21:00-08:00``,
    may cross midnight), in the recipient's timezone (the intent's ``timezone``, else its
    number's country code): such a job waits SCHEDULED in PostgreSQL until the window's
    end, never past its ``expires_at``. Operational jobs are never held. Unset: off."""
    pacing_wait_operational_s: float = Field(default=1.0, ge=0)
    """An operational send waits this long in its lane for a token; longer, it parks."""
    pacing_wait_bulk_s: float = Field(default=30.0, ge=0)
    """A bulk send waits this long in its lane for a token; longer, it parks."""
    rate_limit_min_block_s: float = Field(default=1.0, gt=0)
    """After a rate limit without ``Retry-After``, the instance waits at least this long."""

    publish_attempts: bool = False
    """Publish every attempt's outcome (``AttemptFinished``) on ``zapstream.results``. Off
    by default: nothing in zapstream reads that topic, and each attempt cost one more
    record in the produce request that waits for the job's state. The attempts stay
    counted in ``zapstream_worker_attempts_total`` either way; turn this on for a consumer
    of your own (an audit trail, analytics)."""
    lag_monitor: bool = True
    """Export the consumer lag of this worker's group (every partition, whichever worker
    owns it) on ``/metrics``, read every ``ZAPSTREAM_LAG_INTERVAL_S``; ``zapstream
    lag-monitor`` exports the same while every worker is down."""
    lag: LagMonitorSettings = Field(default_factory=LagMonitorSettings)
    """Only ``interval_s`` and ``read_timeout_s`` (``ZAPSTREAM_LAG_*``) apply to a worker."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    """Only for late redeliveries (connected on first use)."""

    @field_validator("quiet_hours")
    @classmethod
    def _quiet_hours_window(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parse_window(value)  # ValueError: "... are not HH:MM-HH:MM (e.g. 21:00-08:00)"
        return value.strip()

    @model_validator(mode="after")
    def _app_id_names_topics(self) -> Self:
        from streams.kernel.contract import topic_name_problem

        # Faust names its leader topic after the app id (faust/assignor/leader_assignor.py).
        problem = topic_name_problem(self.group_id, FAUST_TOPIC_SUFFIX)
        if problem is not None:
            raise ValueError(
                f"ZAPSTREAM_KAFKA_TOPIC_PREFIX + ZAPSTREAM_WORKER_APP_ID "
                f"({self.group_id[:40]!r}) names Faust's topics and {problem}"
            )
        return self

    @property
    def group_id(self) -> str:
        """The Faust app id and consumer group on the cluster: the topic prefix + ``app_id``."""
        return self.kafka.names.group(self.app_id)

    @property
    def sink_group_id(self) -> str:
        """``dedup_sink_group`` on the cluster (the topic prefix before it); empty stays empty."""
        return self.kafka.names.group(self.dedup_sink_group) if self.dedup_sink_group else ""


FAUST_TOPIC_SUFFIX = "-__assignor-__leader"
"""The longest ending Faust gives a topic named after the app id (its leader topic)."""
