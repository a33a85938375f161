"""What ``make dev``'s demo batch waited on: the enqueue, one process, or the machine.

The demo's throughput (first commit to last arrival at the gateway) mixes three things:
how fast the application API enqueued the batch, how long the pipeline took to drain it
after the last commit, and how busy the processes and the machine's cores were meanwhile.
:class:`RunProfile` samples the CPU time of every pipeline process and of the machine at
the enqueue's start, at its end and when the last message arrived, and
:meth:`RunProfile.explain` says which of them bounded the run, in numbers.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from pathlib import Path

from devtools.bench.support import cpu_seconds, machine_cpu_s

BUSY = 0.9
"""A process using this share of one core, or the machine this share of all its cores, is
what the run waited on."""


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a live process in seconds (None: the process is gone)."""
    try:
        return cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None


def postgres_cpu_s() -> float:
    """CPU seconds of every ``postgres`` process (the server and its backends) so far; a
    backend that exited meanwhile takes its time with it (a lower bound)."""
    total = 0.0
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "postgres":
                total += cpu_seconds(int(comm.parent.name))
        except (OSError, ValueError):
            continue  # gone meanwhile
    return total


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    at: float
    """Wall clock (epoch seconds)."""
    processes: Mapping[str, float]
    """CPU seconds used so far, by process name."""
    machine: tuple[float, float]


def sample(pids: Mapping[str, int]) -> Sample:
    """Every process's CPU so far, PostgreSQL's (all its processes) and the machine's."""
    cpu = {name: process_cpu_s(pid) for name, pid in pids.items()}
    found = {n: c for n, c in cpu.items() if c is not None}
    found["postgres"] = postgres_cpu_s()
    return Sample(time.time(), found, machine_cpu_s())


@dataclasses.dataclass(frozen=True, slots=True)
class RunProfile:
    """The batch's three samples: enqueue start, enqueue end, last arrival."""

    messages: int
    started: Sample
    enqueued: Sample
    arrived: Sample
    cores: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)

    def _shares(self, first: Sample, last: Sample) -> dict[str, float]:
        span = max(last.at - first.at, 1e-9)
        return {
            name: (last.processes[name] - first.processes.get(name, 0.0)) / span
            for name in last.processes
            if name in first.processes
        }

    def _machine_busy(self, first: Sample, last: Sample) -> float:
        busy = last.machine[0] - first.machine[0]
        total = last.machine[1] - first.machine[1]
        return busy / total if total > 0 else 0.0

    def lines(self) -> list[str]:
        """The summary's lines: enqueue, drain, CPU shares, and what the run waited on."""
        enqueue_s = self.enqueued.at - self.started.at
        drain_s = max(0.0, self.arrived.at - self.enqueued.at)
        shares = self._shares(self.started, self.arrived)
        top = sorted(shares.items(), key=lambda kv: kv[1], reverse=True)
        busy = self._machine_busy(self.started, self.arrived)
        return [
            f"enqueue (application API): {self.messages:,} in {enqueue_s:.1f} s "
            f"({self.messages / max(enqueue_s, 1e-9):,.0f}/s, one INSERT per message, "
            "transactions of 500)",
            f"after the last commit:    the last message arrived {drain_s:.1f} s later",
            "CPU, share of one core:   "
            + ", ".join(f"{name} {share:.0%}" for name, share in top[:6])
            + f"; machine busy {busy:.0%} of {self.cores} cores",
            f"waited on:                {self.explain()}",
        ]

    def explain(self) -> str:
        """Which of the enqueue, one process or the machine bounded the batch."""
        enqueue_s = self.enqueued.at - self.started.at
        drain_s = max(0.0, self.arrived.at - self.enqueued.at)
        shares = self._shares(self.started, self.arrived)
        busy = self._machine_busy(self.started, self.arrived)
        name, share = max(shares.items(), key=lambda kv: kv[1], default=("", 0.0))
        if busy >= BUSY:
            return (
                f"the machine: its {self.cores} cores were {busy:.0%} busy (every process "
                f"shares them; the busiest, {name}, used {share:.0%} of a core)"
            )
        if share >= BUSY:
            return f"{name}: it used {share:.0%} of a core (one Python process, one core)"
        if drain_s <= enqueue_s * 0.25:
            return (
                f"the enqueue: the pipeline kept up with it and drained {drain_s:.1f} s after "
                f"the last commit; no process was busy (the busiest, {name}, {share:.0%} of a "
                "core)"
            )
        return (
            f"none measured: no process was busy (the busiest, {name}, {share:.0%} of a core) "
            f"and the machine {busy:.0%}; waits between the processes (Kafka round trips)"
        )
