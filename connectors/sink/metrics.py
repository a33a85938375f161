"""Prometheus metrics of ``zapstream sink``, at ``/metrics`` on ``ZAPSTREAM_SINK_METRICS_PORT``."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

STATES = Counter(
    "zapstream_sink_states_applied_total",
    "State records written to PostgreSQL (replays included; the version guard drops stale ones)",
)
JOBS_MOVED = Counter(
    "zapstream_sink_jobs_moved_total", "outbox_jobs rows moved forward by a state record"
)
BATCHES = Counter("zapstream_sink_batches_total", "Batches written to PostgreSQL and committed")
REJECTED = Counter(
    "zapstream_sink_rejected_rows_total",
    "Records of zapstream.invalid by what the sink did: invalid (job set INVALID), "
    "settled (job not PENDING or unknown: left alone), command (a rejected command row), "
    "no_job_id (cannot be tied to a job)",
    ["result"],
)
POISON = Counter(
    "zapstream_sink_poison_records_total",
    "Records that did not decode, sent to zapstream.dead",
    ["topic"],
)
RETRIES = Counter(
    "zapstream_sink_retries_total", "Failed attempts retried during an outage", ["dependency"]
)
OUTAGE = Gauge(
    "zapstream_sink_outage", "1 while the sink cannot reach a dependency", ["dependency"]
)
OUTAGE_SECONDS = Counter(
    "zapstream_sink_outage_seconds_total",
    "Seconds spent waiting out outages (added when each ends)",
    ["dependency"],
)

# The pipeline as PostgreSQL sees it, read every ZAPSTREAM_SINK_PIPELINE_METRICS_INTERVAL_S
# on a connection of its own (connectors.sink.pipeline_metrics).
JOBS = Gauge(
    "zapstream_jobs",
    "outbox_jobs rows by status (every status, 0 included), as of the last read",
    ["state"],
)
OLDEST_PENDING = Gauge(
    "zapstream_oldest_pending_seconds",
    "Age of the oldest PENDING job per instance and purpose ('' without one); no series "
    "when none is pending. Grows between reads",
    ["instance", "purpose"],
)
OLDEST_PENDING_MAX = Gauge(
    "zapstream_oldest_pending_max_seconds",
    "Age of the oldest PENDING job over every instance and purpose (0 when none). Grows "
    "between reads",
)
PIPELINE_READ_SECONDS = Gauge(
    "zapstream_pipeline_metrics_read_seconds",
    "How long the last read of the pipeline gauges took in PostgreSQL",
)
PIPELINE_READ_TIMESTAMP = Gauge(
    "zapstream_pipeline_metrics_last_success_timestamp_seconds",
    "Unix time of the last successful read of the pipeline gauges (0: never); "
    "alert when it falls behind",
)
PIPELINE_READ_FAILURES = Counter(
    "zapstream_pipeline_metrics_failures_total",
    "Reads of the pipeline gauges that failed (the gauges keep their last values)",
)
