"""``make bench``: throughput, latency and memory, each figure next to its comparison.

Sections (``--only`` picks some; each starts its own throwaway PostgreSQL, Tansu
and gateway simulator so none sees another's data):

- ``relay``: relay rows/s over ``--relay-rows`` pre-filled rows until Kafka
  acknowledged and the slot is confirmed, next to ``pg_recvlogical`` on an
  identical slot and the outbox article's polling worker on an identical copy;
  commit -> Kafka p50/p99 at ``--rate`` rows/s (:mod:`devtools.bench_relay`);
- ``worker``: worker-alone msg/s and CPU ms/msg at gateway latency 0 ms and
  50 ms next to a bare Faust agent with one Table update per message; worker
  RSS after ``--worker-messages`` and after ``--memory-jobs`` jobs
  (:mod:`devtools.bench_worker`);
- ``scaling``: 1 then 2 workers of one consumer group on ``--worker-messages``
  intents, started before the intents arrive: msg/s, CPU per message, each
  worker's share and how busy the machine's cores were;
- ``e2e``: commit -> gateway p50/p99/p999 at ``--rate`` msg/s for ``--e2e-seconds``.

Prints a table (figure, value, comparison, target, PASS/MISS) and writes it as
JSON to ``bench/results/<UTC timestamp>.json``. A MISS fails the run only with
``--strict``. Speed targets belong here, never in timed unit tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from devtools.bench_relay import run_relay_section
from devtools.bench_support import Figure, ms
from devtools.bench_worker import run_end_to_end, run_worker_alone, run_worker_scaling

SECTIONS = ("relay", "worker", "scaling", "e2e")
REPO_ROOT = Path(__file__).resolve().parent.parent


def _mb(mib: float) -> float:
    return mib * 1.048576


def worker_figures(
    zero: dict[str, Any], fifty: dict[str, Any] | None, peak_mib: float
) -> list[Figure]:
    sec = "worker"
    figures: list[Figure] = []
    base = zero.get("baseline") or {}
    base_rate = base.get("msg_s")
    base_cpu = base.get("cpu_ms_per_msg")
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
            ">= 3,000 msg/s",
            zero["msg_s"] >= 3_000,
            zero,
        )
    )
    if base_rate:
        ratio = zero["msg_s"] / base_rate
        figures.append(
            Figure(sec, "worker / Faust+Table", f"{ratio:.2f}", base_text, ">= 0.85", ratio >= 0.85)
        )
    figures.append(
        Figure(
            sec,
            "worker CPU per message, gateway 0 ms",
            f"{zero['cpu_ms_per_msg']:.2f} ms",
            f"Faust+Table {base_cpu:.2f} ms" if base_cpu else "",
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
                f"{fifty['cpu_ms_per_msg']:.2f} ms CPU/msg; "
                f"{fifty['duplicates']} dup, {fifty['order_violations']} order",
                ">= 2,000 msg/s",
                fifty["msg_s"] >= 2_000,
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
    figures: list[Figure] = []
    one = runs[0]
    for run in runs:
        n = run["workers"]
        shares = "/".join(f"{int(x):,}" for x in run["per_worker"])
        comparison = (
            f"{run['msg_s'] / one['msg_s']:.2f}x of 1 worker; " if run is not one else ""
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


def render(figures: Sequence[Figure]) -> str:
    headers = ("section", "figure", "zapstream", "comparison (same run)", "target", "")
    rows = [(f.section, f.what, f.value, f.comparison, f.target, f.verdict) for f in figures]
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    widths[3] = min(widths[3], 90)
    line = " | ".join("-" * w for w in widths)
    out = [" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)), line]
    out.extend(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make bench ARGS=...", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--only", action="append", choices=SECTIONS, help="run only this section (repeatable)"
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
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--strict", action="store_true", help="exit 1 on any MISS")
    args = parser.parse_args(argv)
    # SIGTERM (timeout, Ctrl-C in make) unwinds the pipelines' context managers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sections = args.only or list(SECTIONS)
    log = sys.stderr
    began = time.monotonic()
    started_at = dt.datetime.now(dt.UTC)
    figures: list[Figure] = []

    if "relay" in sections:
        print(f"bench: relay section ({args.relay_rows:,} rows) ...", file=log, flush=True)
        figures.extend(
            run_relay_section(
                rows=args.relay_rows,
                latency_s=args.relay_latency_s,
                rate=args.rate,
                partitions=args.partitions,
                out=log,
            )
        )
    if "worker" in sections:
        print(
            f"bench: worker section ({args.worker_messages:,} intents; memory run to "
            f"{max(args.memory_jobs, args.worker_messages):,} jobs) ...",
            file=log,
            flush=True,
        )
        zero = run_worker_alone(
            latency_ms=0,
            messages=args.worker_messages,
            memory_total=args.memory_jobs,
            baseline=not args.no_baseline,
            partitions=args.partitions,
            out=log,
        )
        fifty = None
        if not args.no_50ms:
            fifty = run_worker_alone(
                latency_ms=50,
                messages=args.worker_messages,
                memory_total=0,
                baseline=False,
                partitions=args.partitions,
                out=log,
            )
        peak = max(zero["vmhwm_mib"], fifty["vmhwm_mib"] if fifty else 0.0)
        figures.extend(worker_figures(zero, fifty, peak))
    if "scaling" in sections:
        print(
            f"bench: scaling section (1 and 2 workers, {args.worker_messages:,} intents) ...",
            file=log,
            flush=True,
        )
        figures.extend(
            scaling_figures(
                [
                    run_worker_scaling(
                        workers=n,
                        messages=args.worker_messages,
                        partitions=args.partitions,
                        out=log,
                    )
                    for n in (1, 2)
                ]
            )
        )
    if "e2e" in sections:
        print(f"bench: end-to-end section ({args.rate:g} msg/s) ...", file=log, flush=True)
        figures.extend(
            e2e_figures(
                run_end_to_end(
                    rate=args.rate, seconds=args.e2e_seconds, partitions=args.partitions, out=log
                )
            )
        )

    elapsed = time.monotonic() - began
    print()
    print(render(figures))
    ran = [f"sections {', '.join(sections)}"]
    if "relay" in sections:
        ran.append(f"relay rows {args.relay_rows:,}, latency run {args.relay_latency_s:g} s")
    if "worker" in sections:
        ran.append(
            f"worker intents {args.worker_messages:,}, memory run to "
            f"{max(args.memory_jobs, args.worker_messages):,} jobs"
            + ("" if args.no_50ms else ", 0 ms and 50 ms")
        )
    if "e2e" in sections:
        ran.append(f"end to end {args.e2e_seconds:g} s")
    if "relay" in sections or "e2e" in sections:
        ran.append(f"offered {args.rate:g}/s")
    ran.append(f"{elapsed / 60:.1f} min; commit {_git_commit()}")
    print("\nran: " + "; ".join(ran))
    misses = [f for f in figures if f.passed is False]
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"{started_at:%Y%m%dT%H%M%SZ}.json"
    document = {
        "started_at": started_at.isoformat(),
        "elapsed_s": elapsed,
        "commit": _git_commit(),
        "machine": {"cpus": platform.machine(), "python": platform.python_version()},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "figures": [{**dataclasses.asdict(f), "verdict": f.verdict or None} for f in figures],
    }
    path.write_bytes(orjson.dumps(_clean(document), option=orjson.OPT_INDENT_2))
    print(f"results: {path}")
    print(f"bench: {len(misses)} MISS of {sum(f.passed is not None for f in figures)} targets")
    return 1 if args.strict and misses else 0


if __name__ == "__main__":
    sys.exit(main())
