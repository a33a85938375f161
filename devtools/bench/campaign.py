"""``make bench`` campaign section: operational p99 while a 100,000-message campaign drains.

Issue 9's bound, until now checked only by
``tests/integration/test_flow_control.py::test_operational_messages_overtake_a_100k_bulk_campaign_on_the_same_instance``
with a loose bound for a loaded machine; here it is a target with its figure:

1. relay and worker run, every instance paced at
   :data:`~devtools.bench.operational.PACED_RATE_PER_S` (200/s);
2. ``--campaign-jobs`` (100,000) bulk jobs (priority ``bulk``, purpose ``campaign``)
   for one instance, due now, are inserted by ONE ``INSERT ... SELECT generate_series``;
3. once the relay's slot is confirmed past that insert (the whole campaign is in Kafka:
   the relay confirms only what the broker acknowledged, so operational commits are not
   behind it in the WAL) and the first campaign messages reached the gateway, the
   campaign messages not yet sent are what the operational messages must overtake (the
   bulk topic's end offsets are printed beside, as the broker counts its records);
4. one operational message every 0.2 s goes to the same instance for
   ``--campaign-drain-s`` (30 s): its commit -> gateway p50/p99 with the stages
   (commit -> relay record, relay record -> gateway); target p99 <= 1 s, all delivered.
   The campaign's drain rate at the gateway over the same span is printed next to its pace.

At 200/s the campaign takes over 8 minutes to drain, so it is still going when the
section ends: the operational messages overtake it, they do not wait for its end.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, TextIO

from devtools.bench.operational import (
    PACED_RATE_PER_S,
    campaign_arrivals,
    commit_operational,
    end_offsets,
    fill_campaign,
    meets_bound,
    operational_latency,
    paced_env,
)
from devtools.bench.support import Figure, ms, slot_confirmed, wait_until
from devtools.bench.worker import SLOT
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import BULK_INTENTS, INTENTS


def _log(out: TextIO, text: str) -> None:
    print(f"bench: campaign: {text}", file=out, flush=True)


def run_campaign(
    *, jobs: int, drain_s: float, partitions: int, out: TextIO, broker: str | None = None
) -> dict[str, Any]:
    """One campaign run (see the module docstring): its measurements as a dict."""
    with LocalPipeline(partitions=partitions, broker=broker, worker_env=paced_env()) as pipe:
        pipe.start_relay()
        pipe.start_worker()
        names = pipe.kafka_settings().names.by_logical()
        intents, bulk = names[INTENTS], names[BULK_INTENTS]
        bootstrap = pipe.kafka.bootstrap
        bulk_before = end_offsets(bootstrap, [bulk])
        run = uuid.uuid4().hex[:8]
        started = time.monotonic()
        end_lsn = fill_campaign(pipe.dsn, run=run, jobs=jobs)
        fill_s = time.monotonic() - started
        in_kafka_s = (
            wait_until(
                lambda: slot_confirmed(pipe.dsn, SLOT, end_lsn),
                timeout_s=600,
                what="the relay streaming the campaign into Kafka",
                interval_s=0.2,
            )
            - started
        )
        at_gateway_s = (
            wait_until(
                lambda: bool(campaign_arrivals(pipe)),
                timeout_s=120,
                what="the first campaign messages at the gateway",
                interval_s=0.2,
            )
            - started
        )
        bulk_records = end_offsets(bootstrap, [bulk]) - bulk_before
        sent_before = len(campaign_arrivals(pipe))
        _log(
            out,
            f"{jobs:,} jobs filled in {fill_s:.1f} s, in Kafka after {in_kafka_s:.1f} s "
            f"(the bulk topic's end offsets: {bulk_records:,} records), at the gateway after "
            f"{at_gateway_s:.1f} s; {jobs - sent_before:,} ahead of the operational messages",
        )
        drain_from = time.time()
        committed = commit_operational(pipe.dsn, run=run, seconds=drain_s)
        drain_to = time.time()
        latency = operational_latency(pipe, committed, topic=intents, out=out, label="campaign")
        arrivals = campaign_arrivals(pipe)
    during = sum(1 for t in arrivals if drain_from <= t < drain_to)
    result: dict[str, Any] = {
        "jobs": jobs,
        "drain_s": drain_to - drain_from,
        "paced_msg_s": PACED_RATE_PER_S,
        "fill_s": fill_s,
        "in_kafka_s": in_kafka_s,
        "at_gateway_s": at_gateway_s,
        "bulk_records": bulk_records,
        "sent_before": sent_before,
        "ahead": jobs - sent_before,
        "campaign_during_drain": during,
        "campaign_sent": len(arrivals),
        "drain_msg_s": during / (drain_to - drain_from),
        "committed": latency.committed,
        "delivered": latency.delivered,
        "p50_s": latency.p50_s,
        "p99_s": latency.p99_s,
        "to_relay_p50_s": latency.to_relay_p50_s,
        "to_relay_p99_s": latency.to_relay_p99_s,
        "to_gateway_p50_s": latency.to_gateway_p50_s,
        "to_gateway_p99_s": latency.to_gateway_p99_s,
    }
    _log(
        out,
        f"campaign at the gateway {result['drain_msg_s']:.0f}/s over the operational run "
        f"(paced at {PACED_RATE_PER_S:g}/s), {len(arrivals):,} of {jobs:,} sent in all",
    )
    return result


def campaign_figures(result: dict[str, Any]) -> list[Figure]:
    """The section's rows from :func:`run_campaign`'s result."""
    p99 = result["p99_s"]
    delivered, committed = result["delivered"], result["committed"]
    return [
        Figure(
            "campaign",
            f"operational commit->gateway, same instance, while a {result['jobs']:,}-message "
            f"campaign drains",
            f"p50 {ms(result['p50_s'])} / p99 {ms(p99)}",
            f"{delivered}/{committed} delivered; stages p50/p99: commit->relay record "
            f"{ms(result['to_relay_p50_s'])}/{ms(result['to_relay_p99_s'])}, relay "
            f"record->gateway {ms(result['to_gateway_p50_s'])}/{ms(result['to_gateway_p99_s'])}",
            "p99 <= 1 s, all delivered",
            meets_bound(p99, delivered, committed),
            result,
        ),
        Figure(
            "campaign",
            "campaign drain at the gateway meanwhile",
            f"{result['drain_msg_s']:,.0f} msg/s",
            f"paced at {result['paced_msg_s']:g}/s; {result['campaign_sent']:,} of "
            f"{result['jobs']:,} sent by the end",
        ),
        Figure(
            "campaign",
            "campaign messages in Kafka ahead of the operational ones",
            f"{result['ahead']:,}",
            f"all {result['jobs']:,} in Kafka {result['in_kafka_s']:.1f} s after the fill "
            f"began (one INSERT ... SELECT, {result['fill_s']:.1f} s; bulk topic end offsets "
            f"{result['bulk_records']:,}), {result['sent_before']:,} already at the gateway",
        ),
    ]
