"""Settings of ``zapstream sink`` (``ZAPSTREAM_SINK_*``), read once in ``main()``."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from streams.kernel.settings import KafkaSettings, PostgresSettings, SettingsBase


class SinkSettings(SettingsBase):
    """``zapstream sink``: job states from Kafka back into PostgreSQL (``ZAPSTREAM_SINK_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_SINK_", extra="ignore")

    group_id: str = "zapstream-state-sink"
    """The sink's own consumer group on ``zapstream.state`` and ``zapstream.invalid``; on the
    cluster ``ZAPSTREAM_KAFKA_TOPIC_PREFIX`` goes before it (:attr:`consumer_group`)."""
    batch: int = Field(default=500, ge=1)
    """Most records written to PostgreSQL in one transaction."""
    within_s: float = Field(default=0.2, gt=0)
    """How long one poll waits for records before writing what it has."""
    gather_s: float = Field(default=0.1, ge=0)
    """Once a poll brought records, how much longer the sink collects more (up to ``batch``)
    before it writes them: at a low rate, one PostgreSQL transaction and one offset commit
    for a tenth of a second of states rather than for each fetch. A job's state reaches
    ``outbox_jobs`` at most this much later; 0 writes each poll's records at once."""
    retry_initial_s: float = Field(default=0.5, gt=0)
    """First wait before retrying a batch when PostgreSQL or Kafka is unavailable."""
    retry_max_s: float = Field(default=10.0, gt=0)
    """The wait doubles (with jitter) up to this; the sink retries for as long as it takes."""
    connect_timeout_s: int = Field(default=5, ge=1)
    """PostgreSQL connect timeout (libpq ``connect_timeout``)."""
    metrics_port: int = Field(default=6067, ge=0, le=65535)
    """Prometheus metrics at ``http://HOST:PORT/metrics``; 0 switches them off."""
    metrics_bind_local: bool = True
    """Serve metrics on 127.0.0.1 only; false binds 0.0.0.0."""
    pipeline_metrics_interval_s: float = Field(default=15.0, gt=0)
    """How often the pipeline gauges (jobs per status, oldest PENDING job) are read from
    PostgreSQL, on a connection of their own; only while metrics are served."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)

    @property
    def consumer_group(self) -> str:
        """The group id on the cluster: the topic prefix + ``group_id``."""
        return self.kafka.names.group(self.group_id)
