"""``make bench``: throughput, latency and memory, each figure next to its comparison.

Sections (``--only`` picks some), each run once per broker (``--broker``: Apache
Kafka, one KRaft node, then Tansu by default); each run starts its own throwaway
PostgreSQL, broker and gateway simulator so none sees another's data:

- ``relay``: relay rows/s over ``--relay-rows`` pre-filled rows until Kafka
  acknowledged and the slot is confirmed, next to ``pg_recvlogical`` on an
  identical slot, the outbox article's polling worker on an identical copy and a
  librdkafka producer (confluent-kafka, acks=all, idempotent) producing the same
  rows (:mod:`devtools.bench.librdkafka`, the client ceiling);
  commit -> Kafka p50/p99 at ``--rate`` rows/s (:mod:`devtools.bench.relay`);
- ``worker``: worker-alone msg/s and CPU ms/msg at gateway latency 0 ms and
  50 ms next to a bare Faust agent with one Table update per message; worker
  RSS after ``--worker-messages`` and after ``--memory-jobs`` jobs
  (:mod:`devtools.bench.worker`);
- ``scaling``: 1 then 2 workers of one consumer group on ``--worker-messages``
  intents, started before the intents arrive: msg/s, CPU per message, each
  worker's share and how busy the machine's cores were;
- ``e2e``: commit -> gateway p50/p99/p999 at ``--rate`` msg/s for ``--e2e-seconds``;
- ``campaign``: the operational commit -> gateway p50/p99 (and its stages) on an
  instance paced at 200/s while a ``--campaign-jobs`` (100,000) bulk campaign, due
  now, drains on it for ``--campaign-drain-s``; the campaign's drain rate and how many
  of its messages were in Kafka ahead (:mod:`devtools.bench.campaign`);
- ``scheduled`` (only with ``--only scheduled``: it takes minutes of its own):
  ``--scheduled-jobs`` (1,000,000) bulk jobs scheduled a minute ahead by one
  SQL statement: the worker's RSS before they are due next to an idle worker's, the records
  they add to Kafka while waiting (none), then the operational p99 on the same instance
  while they drain through pacing (:mod:`devtools.bench.scheduled`).

Prints one table, a value and verdict column per broker side by side (figure,
target, Apache Kafka, Tansu, the comparisons of each broker's run) and writes it
as JSON to ``bench/results/<UTC timestamp>.json``. The first broker runs the
sizes given; the others run :func:`reduced` sizes (``--same-sizes``: the same) so
that the default run stays near 15 minutes. A MISS fails the run only with
``--strict``; a section that failed on a broker shows as an ERROR row and makes the
run exit 1. Speed targets belong here, never in timed unit tests. ``--profile`` says
where a MISS's time goes: py-spy samples the worker of the worker and e2e sections
while busy (:mod:`devtools.bench.profile`), printed below the table and kept in the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from devtools.bench.campaign import campaign_figures, run_campaign
from devtools.bench.profile import Profiler, find_py_spy
from devtools.bench.relay import run_relay_section
from devtools.bench.scheduled import run_scheduled_section
from devtools.bench.support import Figure, ms
from devtools.bench.worker import run_end_to_end, run_worker_alone, run_worker_scaling
from devtools.stack.kafka_broker import kafka_version
from devtools.stack.local_pipeline import BROKERS

SECTIONS = ("relay", "worker", "scaling", "e2e", "campaign")
"""The default run's sections (near 15 minutes on both brokers)."""
OPT_IN_SECTIONS = ("scheduled",)
"""Sections run only when asked for (``--only scheduled``): minutes of their own."""
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BROKERS = ("kafka", "tansu")
"""The table's columns, in order: Apache Kafka (production's broker) first, at full sizes."""


def _mb(mib: float) -> float:
    return mib * 1.048576


WORKER_MSG_S = 2_500
"""Issue 20: the worker alone at this rate, at gateway 0 ms and at 50 ms alike (concurrency,
not CPU, covers the gateway's latency)."""
WORKER_CPU_MS = 0.35
"""Issue 20: the worker's CPU per message at gateway 0 ms."""
BASELINE_CPU_RATIO = 0.6
"""Issue 20: Faust+Table CPU/msg over the worker's, in the same run (the worker within
1/0.6 of the bare agent's cost)."""


def worker_figures(
    zero: dict[str, Any], fifty: dict[str, Any] | None, peak_mib: float
) -> list[Figure]:
    sec = "worker"
    figures: list[Figure] = []
    base = zero.get("baseline") or {}
    base_rate = base.get("msg_s")
    base_cpu = base.get("cpu_ms_per_msg")
    cpu = zero["cpu_ms_per_msg"]
    base_text = (
        f"Faust+Table {base_rate:,.0f} msg/s, {base_cpu:.2f} ms CPU/msg"
        if base_rate and base_cpu
        else "Faust+Table baseline not run"
    )
    figures.append(
        Figure(
            sec,
            f"worker alone, gateway 0 ms, {zero['messages']:,} intents in Kafka",
            f"{zero['msg_s']:,.0f} msg/s",
            base_text,
            f">= {WORKER_MSG_S:,} msg/s",
            zero["msg_s"] >= WORKER_MSG_S,
            zero,
        )
    )
    figures.append(
        Figure(
            sec,
            "worker CPU per message, gateway 0 ms",
            f"{cpu:.2f} ms",
            f"Faust+Table {base_cpu:.2f} ms" if base_cpu else "",
            f"<= {WORKER_CPU_MS:g} ms",
            cpu <= WORKER_CPU_MS,
        )
    )
    if base_cpu:
        ratio = base_cpu / cpu
        figures.append(
            Figure(
                sec,
                "Faust+Table CPU/msg / worker CPU/msg",
                f"{ratio:.2f}",
                f"worker {cpu:.2f} ms CPU/msg, Faust+Table {base_cpu:.2f} ms CPU/msg",
                f">= {BASELINE_CPU_RATIO:g}",
                ratio >= BASELINE_CPU_RATIO,
            )
        )
    figures.append(
        Figure(
            sec,
            "worker order/duplicates, gateway 0 ms",
            f"{zero['duplicates']} dup, {zero['order_violations']} order, "
            f"{zero['missing']} missing",
        )
    )
    if fifty is not None:
        figures.append(
            Figure(
                sec,
                f"worker alone, gateway 50 ms, {fifty['messages']:,} intents",
                f"{fifty['msg_s']:,.0f} msg/s",
                f"{fifty['msg_s'] / zero['msg_s']:.2f}x of the 0 ms run; "
                f"{fifty['cpu_ms_per_msg']:.2f} ms CPU/msg; "
                f"{fifty['duplicates']} dup, {fifty['order_violations']} order",
                f">= {WORKER_MSG_S:,} msg/s",
                fifty["msg_s"] >= WORKER_MSG_S,
                fifty,
            )
        )
    first = zero["rss_mib_after_first"]
    figures.append(
        Figure(
            sec,
            f"worker RSS after {zero['messages']:,} jobs",
            f"{first:.0f} MiB",
            target="<= 300 MB",
            passed=_mb(first) <= 300,
        )
    )
    if "rss_mib_after_total" in zero:
        total = zero["rss_mib_after_total"]
        figures.append(
            Figure(
                sec,
                f"worker RSS after {zero['memory_total']:,} jobs "
                f"(dedup horizon {zero.get('memory_horizon_s', 0):g} s)",
                f"{total:.0f} MiB",
                f"{(total - first) / (zero['memory_total'] - zero['messages']) * 1024:.1f} "
                f"KiB per extra job",
                "<= 300 MB",
                _mb(total) <= 300,
            )
        )
    figures.append(
        Figure(
            sec,
            "worker peak RSS (VmHWM)",
            f"{peak_mib:.0f} MiB",
            target="<= 300 MB",
            passed=_mb(peak_mib) <= 300,
        )
    )
    return figures


def scaling_figures(runs: Sequence[dict[str, Any]]) -> list[Figure]:
    """A row per worker count; each after the first compares its msg/s and its CPU per
    message (summed over the workers) with one worker's: flat CPU/msg is the goal."""
    figures: list[Figure] = []
    one = runs[0]
    for run in runs:
        n = run["workers"]
        shares = "/".join(f"{int(x):,}" for x in run["per_worker"])
        comparison = (
            f"{run['msg_s'] / one['msg_s']:.2f}x of 1 worker's msg/s, CPU/msg "
            f"{run['cpu_ms_per_msg'] / one['cpu_ms_per_msg']:.2f}x of 1 worker's "
            f"(flat is the goal); "
            if run is not one
            else ""
        ) + (
            f"intents per worker {shares}; machine busy {run['machine_busy']:.0%} of "
            f"{os.cpu_count()} cores; CPU/msg broker {run['broker_cpu_ms']:.2f} ms, "
            f"simulator {run['simulator_cpu_ms']:.2f} ms; "
            f"{run['duplicates']} dup, {run['order_violations']} order"
        )
        figures.append(
            Figure(
                "scaling",
                f"{n} worker{'s' if n > 1 else ''}, gateway 0 ms, {run['messages']:,} intents",
                f"{run['msg_s']:,.0f} msg/s, {run['cpu_ms_per_msg']:.2f} ms CPU/msg",
                comparison,
                raw=run,
            )
        )
    return figures


def e2e_figures(e2e: dict[str, Any]) -> list[Figure]:
    p99 = e2e["p99_s"]
    return [
        Figure(
            "e2e",
            f"commit->gateway at {e2e['offered_msg_s']:.0f} msg/s offered, gateway 0 ms",
            f"p50 {ms(e2e['p50_s'])} / p99 {ms(p99)} / p999 {ms(e2e['p999_s'])}",
            f"{e2e['delivered']}/{e2e['messages']} delivered; p50 first/last fifth of commits "
            f"{ms(e2e.get('p50_first_fifth_s'))} / {ms(e2e.get('p50_last_fifth_s'))}; hops "
            f"p50/p99: commit->relay send {ms(e2e.get('commit_to_relay_send_p50_s'))}/"
            f"{ms(e2e.get('commit_to_relay_send_p99_s'))}, relay send->worker journal "
            f"{ms(e2e.get('relay_send_to_journal_p50_s'))}/"
            f"{ms(e2e.get('relay_send_to_journal_p99_s'))}, journal->gateway "
            f"{ms(e2e.get('journal_to_gateway_p50_s'))}/{ms(e2e.get('journal_to_gateway_p99_s'))}",
            "p99 <= 50 ms",
            None if p99 is None else p99 <= 0.050,
            e2e,
        )
    ]


def broker_label(broker: str) -> str:
    """A broker's column header."""
    return f"Apache Kafka {kafka_version()}" if broker == "kafka" else "Tansu"


def _short_label(broker: str) -> str:
    return "Kafka" if broker == "kafka" else "Tansu"


RowKey = tuple[str, str, int]


def figure_key(figure: Figure) -> tuple[str, str]:
    """What pairs one broker's figure with another's: its section and its text without
    numbers (a broker run at other sizes says "100,000 rows" where the first said 200,000)."""
    return figure.section, re.sub(r"\d[\d,.]*", "#", figure.what)


def side_by_side(columns: Mapping[str, Sequence[Figure]]) -> list[dict[str, Figure]]:
    """The table's rows: each figure with its counterpart on every broker that has one.

    Figures pair by :func:`figure_key` and, among equal keys, by order. A figure only a
    later broker has goes after that broker's previous row (else its section's last).
    """
    keys: list[RowKey] = []
    rows: list[dict[str, Figure]] = []
    for broker, figures in columns.items():
        seen: dict[tuple[str, str], int] = {}
        last: int | None = None
        for figure in figures:
            base = figure_key(figure)
            key = (*base, seen.get(base, 0))
            seen[base] = key[2] + 1
            if key in keys:
                last = keys.index(key)
                rows[last][broker] = figure
                continue
            if last is None or keys[last][0] != figure.section:
                same = [i for i, k in enumerate(keys) if k[0] == figure.section]
                last = same[-1] if same else len(keys) - 1
            last += 1
            keys.insert(last, key)
            rows.insert(last, {broker: figure})
    return rows


def table_rows(
    columns: Mapping[str, Sequence[Figure]],
    label: Callable[[str], str],
    comparison_label: Callable[[str], str],
) -> tuple[list[str], list[tuple[list[str], list[str]]]]:
    """The comparison table's header and rows: section, figure, target, then a value and a
    verdict per broker (its column header from ``label``); with each row, the comparisons
    measured in the same run (one per broker, named by ``comparison_label``, when they
    differ). ``make bench`` prints it as text, ``docs/performance.md`` as Markdown."""
    brokers = list(columns)
    headers = ["section", "figure", "target"]
    for broker in brokers:
        headers += [label(broker), ""]
    headers.append("comparison (same run)")
    rows: list[tuple[list[str], list[str]]] = []
    for by_broker in side_by_side(columns):
        present = [by_broker[b] for b in brokers if b in by_broker]
        first = present[0]
        target = next((f.target for f in present if f.target), "")
        cells = [first.section, first.what, target]
        for broker in brokers:
            figure = by_broker.get(broker)
            cells += [figure.value, figure.verdict] if figure else ["-", ""]
        comparisons: list[str] = []
        if len(present) == 1 or len({(f.what, f.comparison) for f in present}) == 1:
            if first.comparison:
                comparisons.append(first.comparison)
        else:
            for broker in brokers:
                figure = by_broker.get(broker)
                if figure is None:
                    continue
                ran = "" if figure.what == first.what else f" (ran: {figure.what})"
                if figure.comparison or ran:
                    comparisons.append(f"{comparison_label(broker)}{ran}: {figure.comparison}")
        rows.append((cells, comparisons))
    return headers, rows


def render(columns: Mapping[str, Sequence[Figure]]) -> str:
    """The table (:func:`table_rows`) as aligned text, a line per extra comparison."""
    headers, rows = table_rows(columns, broker_label, _short_label)
    lines: list[list[str]] = []
    for cells, comparisons in rows:
        lines.append([*cells, comparisons[0] if comparisons else ""])
        lines.extend([*[""] * len(cells), more] for more in comparisons[1:])
    widths = [max(len(r[i]) for r in (headers, *lines)) for i in range(len(headers))]
    widths[-1] = len(headers[-1])  # the comparisons are last: not padded
    out = [" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    out.append(" | ".join("-" * w for w in widths))
    out.extend(
        " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )
    return "\n".join(out)


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return ""


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Sizes:
    """How much one broker's run of the sections does."""

    relay_rows: int
    relay_latency_s: float
    rate: float
    worker_messages: int
    memory_jobs: int
    fifty: bool
    baseline: bool
    e2e_seconds: float
    scheduled_jobs: int = 1_000_000
    scheduled_due_s: float = 60.0
    scheduled_drain_s: float = 60.0
    campaign_jobs: int = 0
    """0: a run from before the campaign section (its results file has no such size)."""
    campaign_drain_s: float = 30.0

    def describe(self, sections: Sequence[str]) -> str:
        ran: list[str] = []
        if "relay" in sections:
            ran.append(f"relay rows {self.relay_rows:,}, latency run {self.relay_latency_s:g} s")
        if "worker" in sections:
            memory = (
                f"memory run to {self.memory_jobs:,} jobs"
                if self.memory_jobs > self.worker_messages
                else "no memory run"
            )
            ran.append(
                f"worker intents {self.worker_messages:,}, {memory}"
                + (", 0 ms and 50 ms" if self.fifty else ", 0 ms only")
                + ("" if self.baseline else ", no Faust+Table baseline")
            )
        if "scaling" in sections:
            ran.append(f"scaling intents {self.worker_messages:,}")
        if "e2e" in sections:
            ran.append(f"end to end {self.e2e_seconds:g} s")
        if "campaign" in sections and self.campaign_jobs:
            ran.append(
                f"campaign {self.campaign_jobs:,} jobs, operational run {self.campaign_drain_s:g} s"
            )
        if "scheduled" in sections:
            ran.append(
                f"scheduled {self.scheduled_jobs:,} jobs due in {self.scheduled_due_s:g} s, "
                f"drain {self.scheduled_drain_s:g} s"
            )
        if "relay" in sections or "e2e" in sections:
            ran.append(f"offered {self.rate:g}/s")
        return "; ".join(ran)


def reduced(full: Sizes) -> Sizes:
    """The sizes of the brokers after the first (the default run stays under 15 minutes).

    Half the relay's rows and half its latency run, no memory run (the
    worker's memory does not depend on the broker; the first broker's run measures it);
    the worker, scaling, end-to-end and campaign runs as the first broker's, so they
    compare (the campaign section takes about a minute on either broker).
    """
    return dataclasses.replace(
        full,
        relay_rows=max(1, full.relay_rows // 2),
        relay_latency_s=full.relay_latency_s / 2,
        memory_jobs=0,
        scheduled_jobs=max(1, full.scheduled_jobs // 10),
    )


def run_section(
    section: str,
    broker: str,
    sizes: Sizes,
    *,
    partitions: int,
    log: TextIO,
    profiler: Profiler | None = None,
) -> list[Figure]:
    """One section on one broker (its own throwaway pipeline): its figures.

    With ``profiler`` (``--profile``), the worker of the worker section's 0 ms run and of
    the end-to-end run is recorded while busy; the text goes to ``profiler.texts``.
    """
    name = broker_label(broker)

    def attach(label: str) -> Callable[[int], None] | None:
        if profiler is None:
            return None
        return lambda pid: profiler.attach(f"{label} on {name}", pid)

    if section == "relay":
        print(f"bench: relay on {name} ({sizes.relay_rows:,} rows) ...", file=log, flush=True)
        return run_relay_section(
            rows=sizes.relay_rows,
            latency_s=sizes.relay_latency_s,
            rate=sizes.rate,
            partitions=partitions,
            out=log,
            broker=broker,
        )
    if section == "worker":
        print(
            f"bench: worker on {name} ({sizes.worker_messages:,} intents; memory run to "
            f"{max(sizes.memory_jobs, sizes.worker_messages):,} jobs) ...",
            file=log,
            flush=True,
        )
        try:
            zero = run_worker_alone(
                latency_ms=0,
                messages=sizes.worker_messages,
                memory_total=sizes.memory_jobs,
                baseline=sizes.baseline,
                partitions=partitions,
                out=log,
                broker=broker,
                on_busy=attach("worker alone, gateway 0 ms"),
            )
        finally:
            if profiler is not None:
                profiler.collect()
        fifty = None
        if sizes.fifty:
            fifty = run_worker_alone(
                latency_ms=50,
                messages=sizes.worker_messages,
                memory_total=0,
                baseline=False,
                partitions=partitions,
                out=log,
                broker=broker,
            )
        peak = max(zero["vmhwm_mib"], fifty["vmhwm_mib"] if fifty else 0.0)
        return worker_figures(zero, fifty, peak)
    if section == "scaling":
        print(
            f"bench: scaling on {name} (1 and 2 workers, {sizes.worker_messages:,} intents) ...",
            file=log,
            flush=True,
        )
        return scaling_figures(
            [
                run_worker_scaling(
                    workers=n,
                    messages=sizes.worker_messages,
                    partitions=partitions,
                    out=log,
                    broker=broker,
                )
                for n in (1, 2)
            ]
        )
    if section == "scheduled":
        print(
            f"bench: scheduled on {name} ({sizes.scheduled_jobs:,} jobs) ...", file=log, flush=True
        )
        return run_scheduled_section(
            jobs=sizes.scheduled_jobs,
            due_s=sizes.scheduled_due_s,
            drain_s=sizes.scheduled_drain_s,
            partitions=partitions,
            out=log,
            broker=broker,
        )
    if section == "campaign":
        print(
            f"bench: campaign on {name} ({sizes.campaign_jobs:,} jobs, operational run "
            f"{sizes.campaign_drain_s:g} s) ...",
            file=log,
            flush=True,
        )
        return campaign_figures(
            run_campaign(
                jobs=sizes.campaign_jobs,
                drain_s=sizes.campaign_drain_s,
                partitions=partitions,
                out=log,
                broker=broker,
            )
        )
    assert section == "e2e", section
    print(f"bench: end to end on {name} ({sizes.rate:g} msg/s) ...", file=log, flush=True)
    try:
        e2e = run_end_to_end(
            rate=sizes.rate,
            seconds=sizes.e2e_seconds,
            partitions=partitions,
            out=log,
            broker=broker,
            on_busy=attach("end to end"),
        )
    finally:
        if profiler is not None:
            profiler.collect()
    return e2e_figures(e2e)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make bench ARGS=...", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=(*SECTIONS, *OPT_IN_SECTIONS),
        help="run only this section (repeatable); scheduled runs only when named",
    )
    parser.add_argument(
        "--broker",
        action="append",
        choices=BROKERS,
        help="run on this broker, one table column each, in this order (repeatable; "
        f"default: {' then '.join(DEFAULT_BROKERS)}); the first runs the sizes given",
    )
    parser.add_argument(
        "--same-sizes",
        action="store_true",
        help="run every broker at the sizes given (default: the brokers after the first "
        "run half the relay rows and latency run, and no memory run)",
    )
    parser.add_argument("--relay-rows", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=500.0, help="offered load for latencies")
    parser.add_argument("--relay-latency-s", type=float, default=20.0)
    parser.add_argument("--worker-messages", type=int, default=20_000)
    parser.add_argument(
        "--memory-jobs",
        type=int,
        default=100_000,
        help="keep feeding the 0 ms worker up to this many jobs for its RSS (<= "
        "--worker-messages skips it)",
    )
    parser.add_argument("--no-50ms", action="store_true", help="skip the 50 ms gateway run")
    parser.add_argument("--no-baseline", action="store_true", help="skip the Faust+Table run")
    parser.add_argument("--e2e-seconds", type=float, default=30.0)
    parser.add_argument(
        "--scheduled-jobs", type=int, default=1_000_000, help="jobs scheduled a minute ahead"
    )
    parser.add_argument("--scheduled-due-s", type=float, default=60.0)
    parser.add_argument("--scheduled-drain-s", type=float, default=60.0)
    parser.add_argument(
        "--campaign-jobs", type=int, default=100_000, help="bulk jobs due now on one instance"
    )
    parser.add_argument(
        "--campaign-drain-s",
        type=float,
        default=30.0,
        help="how long operational messages go to the campaign's instance",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the worker while busy (worker and e2e sections): top self-time "
        "functions and packages, printed and in the JSON (the profiled runs are a little slower)",
    )
    parser.add_argument(
        "--py-spy", metavar="PATH", help="the py-spy executable (default: py-spy on PATH)"
    )
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--strict", action="store_true", help="exit 1 on any MISS")
    args = parser.parse_args(argv)
    # SIGTERM (timeout, Ctrl-C in make) unwinds the pipelines' context managers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sections = args.only or list(SECTIONS)
    brokers = list(dict.fromkeys(args.broker or DEFAULT_BROKERS))
    full = Sizes(
        relay_rows=args.relay_rows,
        relay_latency_s=args.relay_latency_s,
        rate=args.rate,
        worker_messages=args.worker_messages,
        memory_jobs=args.memory_jobs,
        fifty=not args.no_50ms,
        baseline=not args.no_baseline,
        e2e_seconds=args.e2e_seconds,
        scheduled_jobs=args.scheduled_jobs,
        scheduled_due_s=args.scheduled_due_s,
        scheduled_drain_s=args.scheduled_drain_s,
        campaign_jobs=args.campaign_jobs,
        campaign_drain_s=args.campaign_drain_s,
    )
    sizes = {b: full if i == 0 or args.same_sizes else reduced(full) for i, b in enumerate(brokers)}
    log = sys.stderr
    began = time.monotonic()
    started_at = dt.datetime.now(dt.UTC)
    columns: dict[str, list[Figure]] = {b: [] for b in brokers}
    section_s: dict[str, dict[str, float]] = {b: {} for b in brokers}
    errors: list[str] = []
    profiler: Profiler | None = None
    if args.profile:
        py_spy = find_py_spy(args.py_spy)
        if py_spy is None:
            print(
                f"bench: --profile: py-spy not found ({args.py_spy or 'not on PATH'}); "
                "running without profiles",
                file=log,
                flush=True,
            )
        else:
            profiler = Profiler(py_spy, out=log)

    for section in sections:
        for broker in brokers:
            section_began = time.monotonic()
            try:
                columns[broker].extend(
                    run_section(
                        section,
                        broker,
                        sizes[broker],
                        partitions=args.partitions,
                        log=log,
                        profiler=profiler,
                    )
                )
            except Exception as exc:  # the other brokers' and sections' figures still count
                traceback.print_exc(file=log)
                errors.append(f"{section} on {broker_label(broker)}: {exc!r}")
                columns[broker].append(
                    Figure(section, f"{section} section", "ERROR", f"{exc!r}"[:300])
                )
            section_s[broker][section] = time.monotonic() - section_began
            print(
                f"bench: {section} on {broker_label(broker)} took "
                f"{section_s[broker][section]:.0f} s",
                file=log,
                flush=True,
            )

    elapsed = time.monotonic() - began
    print()
    print(render(columns))
    print()
    profiles = profiler.texts if profiler is not None else {}
    for label, text in profiles.items():
        print(f"where the time goes: py-spy, the worker of {label}\n{text}\n")
    for broker in brokers:
        took = ", ".join(f"{s} {t:.0f} s" for s, t in section_s[broker].items())
        print(f"ran on {broker_label(broker)}: {sizes[broker].describe(sections)} ({took})")
    print(f"ran: sections {', '.join(sections)}; {elapsed / 60:.1f} min; commit {_git_commit()}")
    figures = [f for b in brokers for f in columns[b]]
    misses = [f for f in figures if f.passed is False]
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"{started_at:%Y%m%dT%H%M%SZ}.json"
    document = {
        "started_at": started_at.isoformat(),
        "elapsed_s": elapsed,
        "commit": _git_commit(),
        "machine": {"cpus": platform.machine(), "python": platform.python_version()},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "brokers": {
            b: {
                "label": broker_label(b),
                "sizes": dataclasses.asdict(sizes[b]),
                "section_s": section_s[b],
            }
            for b in brokers
        },
        "errors": errors,
        "profiles": profiles,
        "figures": [
            {**dataclasses.asdict(f), "broker": b, "verdict": f.verdict or None}
            for b in brokers
            for f in columns[b]
        ],
    }
    path.write_bytes(orjson.dumps(_clean(document), option=orjson.OPT_INDENT_2))
    print(f"results: {path}")
    print(f"bench: {len(misses)} MISS of {sum(f.passed is not None for f in figures)} targets")
    for error in errors:
        print(f"bench: ERROR {error}")
    if errors:
        return 1
    return 1 if args.strict and misses else 0


if __name__ == "__main__":
    sys.exit(main())
