"""How ``zapstream status`` prints a :class:`~connectors.ops.status.Snapshot`: text or JSON.

Pure functions; the caller prints. Only ids, counts, ages, byte sizes and the
operators' own reasons appear: never a recipient, a text or a key.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from connectors.ops.jobs_render import cut, human_age, table, when
from connectors.sink.pipeline_sql import PendingGroup

if TYPE_CHECKING:
    from connectors.ops.status import ConsumerLag, Snapshot

__all__ = ["TOP_INSTANCES", "human_bytes", "pending_by_instance", "status_json", "status_text"]

TOP_INSTANCES = 10
_REASON_WIDTH = 40


@dataclasses.dataclass(frozen=True, slots=True)
class InstancePending:
    """The PENDING jobs of one instance, over every purpose."""

    instance_id: str
    pending: int
    oldest_age_s: float


def pending_by_instance(
    groups: Sequence[PendingGroup], *, limit: int = TOP_INSTANCES
) -> list[InstancePending]:
    """Instances by the age of their oldest PENDING job, oldest first, at most ``limit``."""
    counts: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for g in groups:
        counts[g.instance_id] = counts.get(g.instance_id, 0) + g.pending
        oldest[g.instance_id] = max(oldest.get(g.instance_id, 0.0), g.oldest_age_s)
    ranked = sorted(counts, key=lambda i: (-oldest[i], i))
    return [InstancePending(i, counts[i], oldest[i]) for i in ranked[:limit]]


def human_bytes(value: int | None) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 MiB``, ``1.1 GiB``, or ``-``."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else human_age(dt.timedelta(seconds=seconds))


def _slot_line(snapshot: Snapshot) -> str:
    slot = snapshot.slot
    if slot is None:
        return f"{snapshot.slot_name}: does not exist"
    state = f"active (pid {slot.active_pid})" if slot.active else "INACTIVE (no relay streaming)"
    return (
        f"{slot.name}: {state}, lag {human_bytes(slot.lag_bytes)}, "
        f"retained WAL {human_bytes(slot.retained_bytes)}"
    )


def _lag_lines(lag: ConsumerLag) -> list[str]:
    if not lag.configured:
        return ["not configured (set ZAPSTREAM_STATUS_LAG_URL to the lag monitor's /metrics URL)"]
    if lag.error is not None:
        return [f"UNKNOWN: {lag.error}"]
    # One line per group and topic: total messages behind, worst partition in seconds.
    totals: dict[tuple[str, str], list[float]] = {}
    worst: dict[tuple[str, str], float | None] = {}
    for p in lag.partitions:
        key = (p.group, p.topic)
        totals.setdefault(key, []).append(p.messages or 0.0)
        if p.seconds is not None:
            worst[key] = max(worst.get(key) or 0.0, p.seconds)
        else:
            worst.setdefault(key, None)
    rows = [
        (group, topic, str(len(values)), f"{sum(values):.0f}", _age(worst[(group, topic)]))
        for (group, topic), values in sorted(totals.items())
    ]
    return table(("GROUP", "TOPIC", "PARTITIONS", "LAG (MESSAGES)", "MAX LAG"), rows).splitlines()


def _section(title: str, lines: Sequence[str]) -> list[str]:
    return [f"{title}:", *(f"  {line}" for line in lines)]


def status_text(snapshot: Snapshot, reasons: Sequence[str]) -> str:
    """The screen ``zapstream status`` prints."""
    lines = [f"zapstream status at {when(snapshot.at)}", ""]
    lines += _section("relay slot", [_slot_line(snapshot)])
    jobs = [f"{state} {count}" for state, count in snapshot.jobs.items()]
    lines += _section("jobs", ["  ".join(jobs[i : i + 7]) for i in range(0, len(jobs), 7)])
    top = pending_by_instance(snapshot.pending)
    instances = {g.instance_id for g in snapshot.pending}
    if top:
        rows = [(p.instance_id, str(p.pending), _age(p.oldest_age_s)) for p in top]
        shown = table(("INSTANCE", "PENDING", "OLDEST"), rows).splitlines()
        if len(instances) > len(top):
            shown.append(f"... and {len(instances) - len(top)} more instance(s)")
    else:
        shown = ["none"]
    lines += _section("oldest PENDING per instance", shown)
    if snapshot.paused:
        paused = table(
            ("KIND", "TARGET", "BY", "REASON", "SINCE (UTC)"),
            [
                (c.kind, c.target, c.actor, cut(c.reason, _REASON_WIDTH), when(c.at))
                for c in snapshot.paused
            ],
        ).splitlines()
    else:
        paused = ["none"]
    lines += _section("paused", paused)
    lines += _section("consumer lag", _lag_lines(snapshot.lag))
    lines.append("")
    if reasons:
        lines += _section("needs attention", [f"- {r}" for r in reasons])
        lines.append("result: NEEDS ATTENTION")
    else:
        lines.append("result: OK")
    return "\n".join(lines)


def status_json(
    snapshot: Snapshot | None, reasons: Sequence[str], *, unreachable: bool = False
) -> str:
    """``status --json``: one object; ``snapshot`` None when PostgreSQL could not be read."""
    payload: dict[str, Any] = {
        "ok": not reasons and not unreachable,
        "postgres_reachable": not unreachable,
        "attention": list(reasons),
    }
    if snapshot is None:
        return json.dumps(payload)
    slot = snapshot.slot
    lag = snapshot.lag
    payload.update(
        {
            "at": snapshot.at.isoformat(),
            "slot": {
                "name": snapshot.slot_name,
                "exists": slot is not None,
                "active": slot.active if slot else False,
                "active_pid": slot.active_pid if slot else None,
                "lag_bytes": slot.lag_bytes if slot else None,
                "retained_bytes": slot.retained_bytes if slot else None,
            },
            "jobs": dict(snapshot.jobs),
            "oldest_pending": [
                {"instance": p.instance_id, "pending": p.pending, "oldest_age_s": p.oldest_age_s}
                for p in pending_by_instance(snapshot.pending)
            ],
            "paused": [
                {
                    "kind": c.kind,
                    "target": c.target,
                    "actor": c.actor,
                    "reason": c.reason,
                    "at": c.at.isoformat(),
                    "control_id": c.control_id,
                }
                for c in snapshot.paused
            ],
            "consumer_lag": {
                "configured": lag.configured,
                "url": lag.url,
                "error": lag.error,
                "partitions": [
                    {
                        "group": p.group,
                        "topic": p.topic,
                        "partition": p.partition,
                        "lag_messages": p.messages,
                        "lag_seconds": p.seconds,
                    }
                    for p in lag.partitions
                ],
            },
        }
    )
    return json.dumps(payload)
