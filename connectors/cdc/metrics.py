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
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

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
TRANSACTIONS = Counter("zapstream_relay_transactions_total", "Transactions read from the slot")


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


class MetricsServer:
    """``/metrics`` over HTTP in prometheus_client's thread; ``port`` 0 means off."""

    def __init__(self, port: int, *, bind_local: bool, log: logging.Logger) -> None:
        self._port = port
        self._host = "127.0.0.1" if bind_local else "0.0.0.0"  # noqa: S104
        self._log = log
        self._server: Any = None

    @property
    def url(self) -> str | None:
        return None if self._server is None else f"http://{self._host}:{self._port}/metrics"

    def start(self) -> None:
        """Serve; raises OSError if the port is taken."""
        if self._port == 0 or self._server is not None:
            return
        from prometheus_client import start_http_server

        self._server, _ = start_http_server(self._port, addr=self._host)
        self._log.info("relay metrics on %s", self.url)

    def stop(self) -> None:
        """Stop serving (idempotent). Blocks for the server thread's poll (<0.5 s)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
