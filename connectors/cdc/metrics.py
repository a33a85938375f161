"""Prometheus metrics of ``zapstream relay``, at ``/metrics`` on ``ZAPSTREAM_RELAY_METRICS_PORT``.

``zapstream_relay_commit_to_ack_seconds`` runs from the transaction's commit
timestamp, as PostgreSQL wrote it in the pgoutput Begin/Commit message (the
server's clock), to the moment Kafka acknowledged the transaction's last record
(the relay's clock): one observation per transaction that produced records.
Across hosts it includes the clock offset between them.

``zapstream_relay_commit_to_read_seconds`` runs from the same commit timestamp
to the relay reading the transaction's Begin: the share of PostgreSQL (decoding,
walsender), which is large e.g. right after a restart, when the walsender decodes
again from the slot's restart_lsn.

Besides the histograms, :class:`LatencyWindow` keeps the exact latencies of the
last transactions (bounded) for the relay's closing summary line, which states
exact p50/p99 where a histogram only gives bucket bounds.

The slot gauges (``zapstream_relay_slot_lag_bytes``,
``zapstream_relay_slot_retained_wal_bytes``) are read from
``pg_replication_slots`` by :class:`~connectors.cdc.slot_monitor.SlotMonitor`
over an ordinary connection of its own, so they keep moving while the relay is
a standby, reconnecting, or waiting for Kafka: the lag of a slot nobody streams
grows there. ``zapstream_relay_active`` tells which relay streams the slot.

The same port answers ``/healthz`` (200 while the process serves) and
``/readyz`` (200 only while this relay streams the slot and Kafka takes its
records; 503 with the reason otherwise: ``standby``, ``connecting``,
``kafka unavailable``).
"""

from __future__ import annotations

import collections
import dataclasses
import time

from prometheus_client import (
    Counter,
    Gauge,
    Histogram,
)

COMMIT_TO_ACK_BUCKETS = (
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)

COMMIT_TO_ACK = Histogram(
    "zapstream_relay_commit_to_ack_seconds",
    "From the outbox transaction's commit (PostgreSQL's commit timestamp) to Kafka's "
    "acknowledgement of its last record, per transaction that produced records",
    buckets=COMMIT_TO_ACK_BUCKETS,
)
COMMIT_TO_READ = Histogram(
    "zapstream_relay_commit_to_read_seconds",
    "From the outbox transaction's commit (PostgreSQL's commit timestamp) to the relay "
    "reading its Begin: PostgreSQL's decoding and delivery, the part of commit->ack "
    "before the relay",
    buckets=COMMIT_TO_ACK_BUCKETS,
)
ROWS = Counter(
    "zapstream_relay_rows_total",
    "Rows of the published tables produced to Kafka (intents, commands and rejections)",
)
ACKED = Counter("zapstream_relay_acked_total", "Records Kafka acknowledged")
CONFIRMED_LSN = Gauge(
    "zapstream_relay_confirmed_lsn",
    "The WAL position (bytes) last confirmed to PostgreSQL: everything before it is in Kafka",
)
INVALID_ROWS = Counter(
    "zapstream_relay_invalid_rows_total",
    "Rows published to zapstream.invalid instead of as an intent or command, by reason: "
    "rule (the row breaks an outbox rule or does not decode), too_large (over "
    "max_record_bytes, reduced), refused (Kafka refused the record; its reference is sent)",
    ["reason"],
)
SLOT_GAPS = Counter(
    "zapstream_relay_slot_gaps_total",
    "Slot gaps the relay found on start or reconnect, by reason: missing (zapstream recreated "
    "the slot), recreated (a slot of another identity), each followed by a restream; behind "
    "(the slot's confirmed position is behind the one recorded: the slot itself streams that "
    "part again, nothing is restreamed)",
    ["reason"],
)
SLOT_GAP_RESTREAMED = Counter(
    "zapstream_relay_slot_gap_restreamed_total",
    "PENDING jobs the relay restreamed (through outbox_replays) after a slot gap",
)
TRANSACTIONS = Counter("zapstream_relay_transactions_total", "Transactions read from the slot")
ACTIVE = Gauge(
    "zapstream_relay_active",
    "1 while this relay streams the slot, 0 in standby (another relay has it) or reconnecting",
)
SLOT_LAG = Gauge(
    "zapstream_relay_slot_lag_bytes",
    "WAL the slot has not confirmed: pg_current_wal_lsn() - confirmed_flush_lsn, read from "
    "PostgreSQL every slot_metrics_interval_s (grows while no relay streams)",
)
SLOT_RETAINED_WAL = Gauge(
    "zapstream_relay_slot_retained_wal_bytes",
    "WAL PostgreSQL keeps on disk for the slot: pg_current_wal_lsn() - restart_lsn",
)
SLOT_METRICS_READ = Gauge(
    "zapstream_relay_slot_metrics_last_read_seconds",
    "Unix time the slot metrics were last read from PostgreSQL (stale: the reads fail)",
)
HEARTBEAT_LAST = Gauge(
    "zapstream_relay_heartbeat_last_seconds",
    "Unix time of the last heartbeat message the relay wrote to the WAL (0: none yet)",
)


class LatencyWindow:
    """The last ``size`` latencies, exactly, for the summary line (each also to ``histogram``)."""

    def __init__(
        self, name: str = "commit->ack", histogram: Histogram = COMMIT_TO_ACK, size: int = 100_000
    ) -> None:
        self.name = name
        self._histogram = histogram
        self._samples: collections.deque[float] = collections.deque(maxlen=size)
        self.count = 0
        """Latencies observed in all (the window holds the last ``size``)."""

    def observe(self, seconds: float) -> None:
        self._histogram.observe(seconds)
        self._samples.append(seconds)
        self.count += 1

    def quantiles(self, *qs: float) -> list[float] | None:
        """Nearest-rank quantiles of the window; None if empty."""
        if not self._samples:
            return None
        ordered = sorted(self._samples)
        n = len(ordered)
        return [ordered[min(n - 1, max(0, round(q * n) - 1))] for q in qs]

    def summary(self) -> str:
        """``commit->ack p50 1.2 ms p99 3.4 ms max 5.6 ms over the last N transactions``."""
        found = self.quantiles(0.5, 0.99, 1.0)
        if found is None:
            return f"{self.name}: no transaction"
        p50, p99, top = (f"{v * 1000:.2f} ms" for v in found)
        return (
            f"{self.name} p50 {p50} p99 {p99} max {top} over the last "
            f"{len(self._samples)} of {self.count} transactions"
        )


@dataclasses.dataclass(slots=True)
class RelayStats:
    """What one relay process did, for its closing summary line."""

    transactions: int = 0
    intents: int = 0
    rejected: int = 0
    reduced: int = 0
    acked: int = 0
    batches: int = 0
    """Partition batches handed to the producer (records sent alone not counted)."""
    kafka_commits: int = 0
    """Kafka transactions committed (``exactly_once``)."""
    skipped: int = 0
    """PostgreSQL transactions replayed by the slot but already in Kafka (``exactly_once``)."""
    started: float = dataclasses.field(default_factory=time.monotonic)
