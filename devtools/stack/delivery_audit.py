"""Did every message reach the gateway once, in order? Compare what was enqueued with what arrived.

Used by ``make dev`` (:mod:`devtools.stack.dev_runner`) for its closing summary and by the
integration tests.
Demo and test messages carry their idempotency key in their text
(``... [key]``), where the key is ``<run>:<instance>:<conversation>:<seq>``,
so an arrival recorded by the gateway simulator can be traced to its intent.

Definitions:

- duplicate: a key that arrived more than once;
- order violation: within a conversation, a key whose *first* arrival came
  after the first arrival of a key with a higher sequence number. A resend of a
  message that already arrived (a duplicate) is not an order violation.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

KEY_IN_TEXT = re.compile(r"\[([^\[\]]+:\d+)\]\s*$")


def demo_key(run: str, instance: str, conversation: int, seq: int) -> str:
    return f"{run}:{instance}:{conversation}:{seq}"


def demo_text(key: str) -> str:
    return f"Your zapstream demo message [{key}]"


def _conversation_and_seq(key: str) -> tuple[str, int]:
    conversation, _, seq = key.rpartition(":")
    return conversation, int(seq)


@dataclasses.dataclass(frozen=True, slots=True)
class DeliveryReport:
    expected: int
    accepted_unique: int
    arrivals: int
    missing: tuple[str, ...]
    duplicates: Mapping[str, int]
    order_violations: tuple[str, ...]
    unexpected: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    throughput_per_s: float | None

    @property
    def duplicate_count(self) -> int:
        return sum(n - 1 for n in self.duplicates.values())

    @property
    def ok(self) -> bool:
        return not self.missing and not self.duplicates and not self.order_violations

    def summary(self) -> str:
        lines = [
            f"enqueued:                 {self.expected}",
            f"accepted by the gateway:  {self.accepted_unique}",
            f"duplicates at gateway:    {self.duplicate_count}",
            f"order violations:         {len(self.order_violations)}",
            f"missing:                  {len(self.missing)}",
        ]
        if self.latency_p50_s is not None and self.latency_p99_s is not None:
            lines.append(
                f"commit->gateway latency:  p50 {self.latency_p50_s * 1000:.0f} ms, "
                f"p99 {self.latency_p99_s * 1000:.0f} ms"
            )
        if self.throughput_per_s is not None:
            lines.append(f"throughput:               {self.throughput_per_s:.0f} msg/s")
        return "\n".join(lines)


def audit(
    expected_keys: Sequence[str],
    arrivals: Iterable[Mapping[str, Any]],
    *,
    committed_at: Mapping[str, float] | None = None,
) -> DeliveryReport:
    """``arrivals``: the simulator's records (``text``, ``arrived_at`` seconds), in arrival order.

    ``committed_at``: epoch seconds each key was committed, for latency and throughput.
    """
    expected = set(expected_keys)
    counts: Counter[str] = Counter()
    first_arrival: dict[str, float] = {}
    order: dict[str, list[int]] = defaultdict(list)  # conversation -> seqs in first-arrival order
    unexpected = 0
    total = 0
    for arrival in arrivals:
        total += 1
        match = KEY_IN_TEXT.search(str(arrival.get("text", "")))
        key = match.group(1) if match else None
        if key is None or key not in expected:
            unexpected += 1
            continue
        counts[key] += 1
        if counts[key] == 1:
            first_arrival[key] = float(arrival.get("arrived_at", 0.0))
            conversation, seq = _conversation_and_seq(key)
            order[conversation].append(seq)
    violations: list[str] = []
    for conversation, seqs in order.items():
        highest = -1
        for seq in seqs:
            if seq < highest:
                violations.append(f"{conversation}:{seq}")
            highest = max(highest, seq)
    latencies: list[float] = []
    throughput = None
    if committed_at:
        latencies = sorted(
            first_arrival[k] - committed_at[k] for k in first_arrival if k in committed_at
        )
        if first_arrival:
            span = max(first_arrival.values()) - min(committed_at.values())
            throughput = len(first_arrival) / span if span > 0 else None
    p50 = statistics.median(latencies) if latencies else None
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None
    return DeliveryReport(
        expected=len(expected),
        accepted_unique=len(counts),
        arrivals=total,
        missing=tuple(sorted(expected - counts.keys())),
        duplicates={k: n for k, n in counts.items() if n > 1},
        order_violations=tuple(violations),
        unexpected=unexpected,
        latency_p50_s=p50,
        latency_p99_s=p99,
        throughput_per_s=throughput,
    )
