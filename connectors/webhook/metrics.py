"""The webhook intake's Prometheus collectors (served on its ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter

REJECTED = Counter(
    "zapstream_webhook_rejected_total",
    "Callbacks refused before anything was published, by gateway path and reason "
    "(invalid signature, malformed, too deep, too long)",
    ["gateway", "reason"],
)
UNBOUND = Counter(
    "zapstream_webhook_receipts_unbound_total",
    "Verified callbacks that do not bind to their job (a reference that does not verify, "
    "another Meta phone number id): dead-lettered, never applied",
    ["gateway", "reason"],
)
META_REPLAYS = Counter(
    "zapstream_webhook_meta_replays_total",
    "Meta statuses (message id and status) published recently and received again: "
    "answered 200, not published again",
)
