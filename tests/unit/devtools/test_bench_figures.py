"""``make bench``'s figures: each measurement becomes a row with issue 20's target and verdict.

The runs themselves need real processes; what a run's numbers turn into does not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from devtools.bench.campaign import campaign_figures
from devtools.bench.runner import Sizes, reduced, scaling_figures, worker_figures
from devtools.bench.support import Figure


def _zero(msg_s: float, cpu_ms: float, *, baseline_cpu_ms: float | None = 0.25) -> dict[str, Any]:
    run: dict[str, Any] = {
        "messages": 20_000,
        "msg_s": msg_s,
        "cpu_ms_per_msg": cpu_ms,
        "duplicates": 0,
        "order_violations": 0,
        "missing": 0,
        "rss_mib_after_first": 120.0,
    }
    if baseline_cpu_ms is not None:
        run["baseline"] = {"msg_s": 3_200.0, "cpu_ms_per_msg": baseline_cpu_ms}
    return run


def _fifty(msg_s: float) -> dict[str, Any]:
    return {
        "messages": 20_000,
        "msg_s": msg_s,
        "cpu_ms_per_msg": 0.40,
        "duplicates": 0,
        "order_violations": 0,
    }


def _by_what(figures: list[Figure]) -> dict[str, Figure]:
    return {f.what: f for f in figures}


def test_a_worker_within_issue_20s_targets_passes_each() -> None:
    figures = _by_what(worker_figures(_zero(2_600, 0.30), _fifty(2_550), peak_mib=150))

    zero = figures["worker alone, gateway 0 ms, 20,000 intents in Kafka"]
    assert (zero.value, zero.target, zero.verdict) == ("2,600 msg/s", ">= 2,500 msg/s", "PASS")
    cpu = figures["worker CPU per message, gateway 0 ms"]
    assert (cpu.value, cpu.target, cpu.verdict) == ("0.30 ms", "<= 0.35 ms", "PASS")
    ratio = figures["Faust+Table CPU/msg / worker CPU/msg"]
    assert (ratio.value, ratio.target, ratio.verdict) == ("0.83", ">= 0.6", "PASS")
    assert ratio.comparison == "worker 0.30 ms CPU/msg, Faust+Table 0.25 ms CPU/msg"
    fifty = figures["worker alone, gateway 50 ms, 20,000 intents"]
    assert (fifty.target, fifty.verdict) == (">= 2,500 msg/s", "PASS")
    assert fifty.comparison.startswith("0.98x of the 0 ms run; ")
    assert "worker / Faust+Table" not in figures  # the throughput ratio is gone


def test_a_slow_costly_worker_misses_each_target() -> None:
    figures = _by_what(worker_figures(_zero(2_400, 0.50), _fifty(1_200), peak_mib=150))

    assert figures["worker alone, gateway 0 ms, 20,000 intents in Kafka"].verdict == "MISS"
    assert figures["worker CPU per message, gateway 0 ms"].verdict == "MISS"
    ratio = figures["Faust+Table CPU/msg / worker CPU/msg"]
    assert (ratio.value, ratio.verdict) == ("0.50", "MISS")
    fifty = figures["worker alone, gateway 50 ms, 20,000 intents"]
    assert fifty.verdict == "MISS"
    assert fifty.comparison.startswith("0.50x of the 0 ms run; ")


def test_without_the_baseline_there_is_no_cpu_ratio_but_the_cpu_target_stays() -> None:
    figures = _by_what(worker_figures(_zero(3_000, 0.34, baseline_cpu_ms=None), None, 150))

    assert "Faust+Table CPU/msg / worker CPU/msg" not in figures
    assert figures["worker CPU per message, gateway 0 ms"].verdict == "PASS"
    assert not any("50 ms" in what for what in figures)


def _scaling(workers: int, msg_s: float, cpu_ms: float) -> dict[str, Any]:
    return {
        "workers": workers,
        "messages": 20_000,
        "msg_s": msg_s,
        "cpu_ms_per_msg": cpu_ms,
        "per_worker": [20_000 / workers] * workers,
        "machine_busy": 0.9,
        "broker_cpu_ms": 0.1,
        "simulator_cpu_ms": 0.2,
        "duplicates": 0,
        "order_violations": 0,
    }


def test_the_second_scaling_row_compares_its_cpu_per_message_with_one_worker() -> None:
    one, two = scaling_figures([_scaling(1, 2_000, 0.40), _scaling(2, 3_000, 0.50)])

    assert two.value == "3,000 msg/s, 0.50 ms CPU/msg"
    assert two.comparison.startswith(
        "1.50x of 1 worker's msg/s, CPU/msg 1.25x of 1 worker's (flat is the goal); "
    )
    assert "of 1 worker" not in one.comparison


def _campaign(p99_s: float | None, delivered: int = 150) -> dict[str, Any]:
    return {
        "jobs": 100_000,
        "drain_s": 30.0,
        "paced_msg_s": 200.0,
        "fill_s": 1.8,
        "in_kafka_s": 4.2,
        "at_gateway_s": 4.9,
        "bulk_records": 100_000,
        "sent_before": 700,
        "ahead": 99_300,
        "campaign_during_drain": 5_970,
        "campaign_sent": 6_900,
        "drain_msg_s": 199.0,
        "committed": 150,
        "delivered": delivered,
        "p50_s": 0.012,
        "p99_s": p99_s,
        "to_relay_p50_s": 0.004,
        "to_relay_p99_s": 0.009,
        "to_gateway_p50_s": 0.008,
        "to_gateway_p99_s": 0.030,
    }


def test_campaign_rows_say_the_operational_latency_the_drain_and_what_was_ahead() -> None:
    latency, drain, ahead = campaign_figures(_campaign(0.040))

    assert latency.what == (
        "operational commit->gateway, same instance, while a 100,000-message campaign drains"
    )
    assert (latency.value, latency.target, latency.verdict) == (
        "p50 12.0 ms / p99 40.0 ms",
        "p99 <= 1 s, all delivered",
        "PASS",
    )
    assert latency.comparison == (
        "150/150 delivered; stages p50/p99: commit->relay record 4.0 ms/9.0 ms, "
        "relay record->gateway 8.0 ms/30.0 ms"
    )
    assert (drain.value, drain.verdict) == ("199 msg/s", "")
    assert drain.comparison.startswith("paced at 200/s; 6,900 of 100,000 sent")
    assert ahead.value == "99,300"
    assert ahead.comparison == (
        "all 100,000 in Kafka 4.2 s after the fill began (one INSERT ... SELECT, 1.8 s; bulk "
        "topic end offsets 100,000), 700 already at the gateway"
    )


def test_a_slow_or_lost_operational_message_misses_the_campaign_target() -> None:
    assert campaign_figures(_campaign(1.2))[0].verdict == "MISS"
    assert campaign_figures(_campaign(0.040, delivered=149))[0].verdict == "MISS"
    missing = campaign_figures(_campaign(None, delivered=0))[0]
    assert (missing.value, missing.verdict) == ("p50 12.0 ms / p99 n/a", "MISS")


def test_the_second_broker_runs_the_same_campaign_and_old_runs_describe_none() -> None:
    full = Sizes(
        relay_rows=200_000,
        relay_latency_s=20.0,
        rate=500.0,
        worker_messages=20_000,
        memory_jobs=100_000,
        fifty=True,
        baseline=True,
        e2e_seconds=30.0,
        campaign_jobs=100_000,
    )

    second = reduced(full)

    assert (second.campaign_jobs, second.campaign_drain_s) == (100_000, 30.0)
    assert second.describe(["campaign"]) == "campaign 100,000 jobs, operational run 30 s"
    # A results file from before the section has no campaign size: nothing to describe.
    recorded = dataclasses.asdict(full)
    old = Sizes(**{k: v for k, v in recorded.items() if not k.startswith("campaign_")})
    assert old.describe(["relay", "campaign"]).startswith("relay rows 200,000")
    assert "campaign" not in old.describe(["relay", "campaign"])
