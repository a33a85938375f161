"""Prometheus metrics of the worker, served on Faust's web port at ``/metrics``."""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

M = TypeVar("M", Counter, Gauge, Histogram)


class Children(Generic[M]):
    """A labelled metric's children, each looked up once.

    prometheus_client's ``labels()`` validates the values and takes the metric's lock on
    every call (about 4 us); the worker counted five labelled series per message. The
    children kept here are the metric's own (the same objects ``labels()`` returns), as
    many as the metric has series; none of these metrics ever removes one.
    """

    __slots__ = ("_metric", "_children")

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


INTENTS = Counter(
    "zapstream_intents_total", "Intents handled by the dispatcher, by decision", ["decision"]
)
ATTEMPTS = Counter(
    "zapstream_gateway_attempts_total",
    "Gateway attempts by gateway, instance and outcome (accepted, transient, permanent, ...)",
    ["gateway", "instance", "outcome"],
)
STATES = Counter(
    "zapstream_job_states_total", "Job state changes written, by new status", ["status"]
)
DEAD = Counter("zapstream_dead_total", "Records published to zapstream.dead")
PARKED = Gauge("zapstream_parked_conversations", "Conversations waiting for a retry (this worker)")
POISON = Counter("zapstream_poison_records_total", "Records sent to zapstream.dead", ["topic"])
COMMITS_HELD = Gauge(
    "zapstream_worker_commits_held_partitions",
    "Partitions whose commits have waited over a minute on records never acknowledged",
)
IN_FLIGHT = Gauge(
    "zapstream_dispatch_in_flight",
    "Intents queued or being sent in conversation lanes, by priority",
    ["priority"],
)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
COMMIT_TO_GATEWAY = Histogram(
    "zapstream_commit_to_gateway_seconds",
    "From the outbox transaction's commit to the gateway's acceptance, by instance and priority",
    ["instance", "priority"],
    buckets=LATENCY_BUCKETS,
)
ACCEPTED_TO_DELIVERED = Histogram(
    "zapstream_accepted_to_delivered_seconds",
    "From the gateway's acceptance to the first receipt saying delivered (or read), by instance",
    ["instance"],
    buckets=(*LATENCY_BUCKETS, 900, 3600),
)
GATEWAY_CALL = Histogram(
    "zapstream_gateway_call_seconds",
    "One send to the gateway, from the request to its answer or failure, by gateway and outcome",
    ["gateway", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INSTANCE_PAUSED = Gauge(
    "zapstream_instance_paused",
    "1 while this worker holds an instance's messages because the gateway refused the instance",
    ["instance"],
)
GATEWAY_ERRORS = Counter(
    "zapstream_gateway_errors_total",
    "Gateway failures by instance and class (transient, uncertain, permanent, instance)",
    ["instance", "class"],
)
RECEIPTS_IGNORED = Counter(
    "zapstream_receipts_ignored_total",
    "Receipts that changed nothing because they are duplicates or about another attempt",
    ["reason"],
)
LISTING_REQUESTS = Counter(
    "zapstream_reconcile_listing_requests_total",
    "Listing requests (pages included) made to reconcile jobs, by gateway and instance",
    ["gateway", "instance"],
)
LISTING_LIMIT = Gauge(
    "zapstream_reconcile_listing_limit_per_minute",
    "The most listing requests one worker makes per instance in any minute "
    "(ZAPSTREAM_WORKER_RECONCILE_LISTINGS_PER_MINUTE)",
    ["gateway"],
)
RECONCILE_GAVE_UP = Counter(
    "zapstream_reconcile_gave_up_total",
    "Jobs made UNCERTAIN because their reconciliation did not conclude within "
    "ZAPSTREAM_WORKER_RECONCILE_MAX_WAIT_S",
    ["instance"],
)
LISTING_UNREADABLE = Counter(
    "zapstream_reconcile_listing_unreadable_total",
    "Reconciliations postponed because the gateway's listing did not parse "
    "(check ZAPSTREAM_STACKZAP_LISTING_FIELDS)",
    ["gateway", "instance"],
)
OPTOUT_SKIPPED = Counter(
    "zapstream_optout_skipped_total",
    "Jobs ended OPTED_OUT without a send: their recipient opted out of the instance, by instance",
    ["instance"],
)
OPTOUTS_LEARNT = Counter(
    "zapstream_optouts_learnt_total",
    "Opt-outs the gateway told of (Meta 131050): the job ended OPTED_OUT, by instance and gateway",
    ["instance", "gateway"],
)
OPTOUTS_KNOWN = Gauge(
    "zapstream_optouts_known",
    "Opted-out (instance, recipient) pairs this worker knows (every instance's)",
)

QUIET_HOURS_HELD = Counter(
    "zapstream_quiet_hours_held_total",
    "Bulk jobs moved to SCHEDULED until the end of their recipient's quiet hours "
    "(ZAPSTREAM_WORKER_QUIET_HOURS); released by the relay like any scheduled job",
)

# The series counted per message, looked up once each (see :class:`Children`).
INTENTS_BY = Children(INTENTS)
ATTEMPTS_BY = Children(ATTEMPTS)
STATES_BY = Children(STATES)
COMMIT_TO_GATEWAY_BY = Children(COMMIT_TO_GATEWAY)
GATEWAY_CALL_BY = Children(GATEWAY_CALL)
