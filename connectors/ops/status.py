"""``zapstream status [--json]``: every hop of the pipeline on one screen.

::

    zapstream status [--json]

What it reads, all on one PostgreSQL connection except the last:

- the relay's replication slot (``ZAPSTREAM_RELAY_SLOT``): active (and the
  walsender's pid) or not, lag in bytes since the relay's last confirmation, WAL
  retained on disk (the query is :data:`connectors.ops.doctor.SLOT_QUERY`);
- jobs per status, every status (:mod:`connectors.sink.pipeline_sql`, the same
  numbers as the sink's ``zapstream_jobs`` gauge);
- the oldest PENDING job per instance, the ten oldest instances;
- paused instances and campaigns (the ``zapstream_controls`` view);
- consumer lag, from the Kafka lag monitor's ``/metrics`` when
  ``ZAPSTREAM_STATUS_LAG_URL`` is set (``kafka_consumergroup_group_lag`` and
  ``kafka_consumergroup_group_lag_seconds``), "not configured" otherwise.

Exit codes: 0 healthy; 1 something needs attention (the slot missing, or
inactive with lag; a PENDING job older than ``ZAPSTREAM_STATUS_MAX_PENDING_AGE_S``,
10 minutes; DEAD, UNCERTAIN or REVIEW jobs; a lag monitor that cannot be read);
2 PostgreSQL cannot be read (one line on stderr). Never a recipient, a text or
a key: only ids, counts, ages and the operators' own reasons.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import math
import sys
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

import psycopg

from connectors.outbox.controls import Control
from connectors.sink.pipeline_sql import PendingGroup, job_counts, pending_groups
from connectors.startup import error_detail, mask_secrets

if TYPE_CHECKING:
    # Imported when used: `zapstream` itself must load on the base install (no
    # pydantic-settings, no Kafka client), where `status` then names the extra.
    from connectors.ops.doctor import SlotState
    from connectors.ops.status_settings import StatusSettings

__all__ = [
    "ATTENTION_STATES",
    "EXIT_ATTENTION",
    "EXIT_HEALTHY",
    "EXIT_UNREACHABLE",
    "ConsumerLag",
    "PartitionLag",
    "Snapshot",
    "StatusUnavailable",
    "add_status_parser",
    "attention",
    "collect",
    "exit_code",
    "parse_lag_metrics",
    "run_status",
]

EXIT_HEALTHY = 0
EXIT_ATTENTION = 1
EXIT_UNREACHABLE = 2

ATTENTION_STATES = ("DEAD", "UNCERTAIN", "REVIEW")
"""Jobs in these states wait for an operator: any of them needs attention."""

LAG_METRIC = "kafka_consumergroup_group_lag"
LAG_SECONDS_METRIC = "kafka_consumergroup_group_lag_seconds"

_PAUSED = """
    SELECT kind, target, action, reason, actor, at, control_id
    FROM zapstream_controls WHERE paused ORDER BY kind, target
"""


class StatusUnavailable(Exception):
    """PostgreSQL could not be read; the message is one line naming what to fix."""


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionLag:
    """One consumer group's lag on one partition, as the lag monitor exports it."""

    group: str
    topic: str
    partition: str
    messages: float | None = None
    seconds: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerLag:
    """The consumer-lag section: not configured, unreadable (``error``), or the partitions."""

    url: str | None
    """The lag monitor's URL, credentials masked; None when not configured."""
    partitions: tuple[PartitionLag, ...] = ()
    error: str | None = None

    @property
    def configured(self) -> bool:
        return self.url is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """What ``status`` found, before it is judged and printed."""

    at: dt.datetime
    """The database's clock when it was read."""
    slot_name: str
    slot: SlotState | None
    jobs: dict[str, int]
    pending: list[PendingGroup]
    paused: list[Control]
    lag: ConsumerLag


# --- consumer lag -----------------------------------------------------------------------------


def parse_lag_metrics(text: str) -> list[PartitionLag]:
    """The lag monitor's Prometheus text as one entry per (group, topic, partition).

    Reads ``kafka_consumergroup_group_lag`` (messages) and ``..._lag_seconds``
    samples with ``group`` and ``topic`` labels (``partition`` may be absent: a
    per-topic figure); other metrics and NaN values are ignored. Raises
    ``ValueError`` when the text is not Prometheus exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[tuple[str, str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LAG_METRIC:
                field = "messages"
            elif sample.name == LAG_SECONDS_METRIC:
                field = "seconds"
            else:
                continue
            group, topic = sample.labels.get("group"), sample.labels.get("topic")
            if group is None or topic is None or math.isnan(sample.value):
                continue
            key = (group, topic, sample.labels.get("partition", ""))
            found.setdefault(key, {})[field] = float(sample.value)
    return [
        PartitionLag(group, topic, partition, values.get("messages"), values.get("seconds"))
        for (group, topic, partition), values in sorted(found.items(), key=_partition_order)
    ]


def _partition_order(item: tuple[tuple[str, str, str], dict[str, float]]) -> tuple[Any, ...]:
    (group, topic, partition), _ = item
    return (group, topic, int(partition) if partition.isdigit() else -1, partition)


def _fetch(url: str, timeout_s: float) -> str:
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
        body: bytes = response.read()
    return body.decode("utf-8", "replace")


async def read_consumer_lag(url: str, timeout_s: float) -> ConsumerLag:
    """The lag monitor's figures, or why they could not be read (never raises)."""
    if not url:
        return ConsumerLag(url=None)
    shown = mask_secrets(url)
    if not url.startswith(("http://", "https://")):
        return ConsumerLag(shown, error="ZAPSTREAM_STATUS_LAG_URL must be an http(s) URL")
    try:
        text = await asyncio.wait_for(asyncio.to_thread(_fetch, url, timeout_s), timeout_s + 1)
    except (OSError, TimeoutError, ValueError) as exc:
        detail = "no answer" if isinstance(exc, TimeoutError) else error_detail(exc)
        return ConsumerLag(shown, error=f"cannot read {shown}: {detail}")
    try:
        partitions = parse_lag_metrics(text)
    except ValueError as exc:
        return ConsumerLag(shown, error=f"{shown} is not Prometheus text: {error_detail(exc)}")
    if not partitions:
        return ConsumerLag(shown, error=f"{shown} exports no {LAG_METRIC} samples")
    return ConsumerLag(shown, tuple(partitions))


# --- judging ----------------------------------------------------------------------------------


def attention(snapshot: Snapshot, *, max_pending_age_s: float) -> list[str]:
    """What needs an operator, one line each (empty: healthy)."""
    reasons: list[str] = []
    slot = snapshot.slot
    if slot is None:
        reasons.append(
            f"replication slot {snapshot.slot_name} does not exist: rows committed now are "
            "never streamed (run `zapstream db migrate` or start `zapstream relay`)"
        )
    elif not slot.active and (slot.lag_bytes or 0) > 0:
        reasons.append(
            f"replication slot {slot.name} is inactive with {slot.lag_bytes} bytes of lag: "
            "no relay is streaming (start `zapstream relay`)"
        )
    oldest = max((g.oldest_age_s for g in snapshot.pending), default=0.0)
    if oldest > max_pending_age_s:
        late = sorted(
            {g.instance_id for g in snapshot.pending if g.oldest_age_s > max_pending_age_s}
        )
        reasons.append(
            f"PENDING jobs older than {_age(max_pending_age_s)} (oldest {_age(oldest)}) on "
            f"{len(late)} instance(s): {', '.join(late[:5])}{', ...' if len(late) > 5 else ''}"
        )
    for state in ATTENTION_STATES:
        count = snapshot.jobs.get(state, 0)
        if count > 0:
            reasons.append(f"{count} {state} job(s): zapstream jobs list --state {state}")
    if snapshot.lag.error is not None:
        reasons.append(f"consumer lag unknown: {snapshot.lag.error}")
    return reasons


def exit_code(reasons: Sequence[str]) -> int:
    """0 when nothing needs attention, 1 otherwise (2 is for an unreachable database)."""
    return EXIT_ATTENTION if reasons else EXIT_HEALTHY


def _age(seconds: float) -> str:
    from connectors.ops.jobs_render import human_age

    return human_age(dt.timedelta(seconds=seconds))


# --- reading ----------------------------------------------------------------------------------


async def _read_postgres(
    dsn: str, slot_name: str, timeout_s: float
) -> tuple[dt.datetime, SlotState | None, dict[str, int], list[PendingGroup], list[Control]]:
    from connectors.ops.doctor import read_slot

    conn = await psycopg.AsyncConnection.connect(
        dsn,
        autocommit=True,
        connect_timeout=max(1, round(timeout_s)),
        options=f"-c statement_timeout={int(timeout_s * 1000)}",
        application_name="zapstream-status",
    )
    async with conn:
        cur = await conn.execute("SELECT now()")
        row = await cur.fetchone()
        assert row is not None
        now: dt.datetime = row[0]
        slot = await read_slot(conn, slot_name)
        jobs = await job_counts(conn)
        pending = await pending_groups(conn)
        cur = await conn.execute(_PAUSED)
        paused = [
            Control(str(k), str(t), str(a), str(r), str(by), at, int(cid))
            for k, t, a, r, by, at, cid in await cur.fetchall()
        ]
    return now, slot, jobs, pending, paused


def _unreachable(exc: BaseException) -> StatusUnavailable:
    from streams.kernel.failures import classify_postgres

    if isinstance(exc, TimeoutError):
        return StatusUnavailable("PostgreSQL (ZAPSTREAM_DATABASE_URL) did not answer in time")
    if isinstance(exc, psycopg.Error):
        verdict = classify_postgres(exc.sqlstate, str(exc))
        if verdict.hint is not None:
            detail = mask_secrets(verdict.problem)
            return StatusUnavailable(f"PostgreSQL: {verdict.hint} ({detail})")
    detail = error_detail(exc)
    return StatusUnavailable(f"PostgreSQL unreachable (ZAPSTREAM_DATABASE_URL): {detail}")


async def collect(
    dsn: str,
    *,
    slot_name: str,
    lag_url: str = "",
    timeout_s: float = 10.0,
    lag_timeout_s: float = 3.0,
) -> Snapshot:
    """Read every hop; raises :class:`StatusUnavailable` when PostgreSQL cannot be read."""
    lag_task = asyncio.create_task(read_consumer_lag(lag_url, lag_timeout_s))
    try:
        now, slot, jobs, pending, paused = await asyncio.wait_for(
            _read_postgres(dsn, slot_name, timeout_s), timeout_s * 3
        )
    except (psycopg.Error, OSError, TimeoutError) as exc:
        lag_task.cancel()
        raise _unreachable(exc) from exc
    return Snapshot(now, slot_name, slot, jobs, pending, paused, await lag_task)


def run_status(
    settings: StatusSettings,
    *,
    slot_name: str,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Read, judge and print; return the exit code."""
    from connectors.ops.status_render import status_json, status_text

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        snapshot = asyncio.run(
            collect(
                settings.postgres.dsn,
                slot_name=slot_name,
                lag_url=settings.lag_url,
                timeout_s=settings.timeout_s,
                lag_timeout_s=settings.lag_timeout_s,
            )
        )
    except StatusUnavailable as exc:
        print(f"zapstream status: {exc}", file=err)
        if as_json:
            print(status_json(None, [str(exc)], unreachable=True), file=out)
        return EXIT_UNREACHABLE
    reasons = attention(snapshot, max_pending_age_s=settings.max_pending_age_s)
    if as_json:
        print(status_json(snapshot, reasons), file=out)
    else:
        print(status_text(snapshot, reasons), file=out)
    return exit_code(reasons)


# --- argparse wiring ----------------------------------------------------------------------------


def _cmd_status(args: argparse.Namespace) -> int:
    from connectors.cdc.settings import RelaySettings
    from connectors.ops.status_settings import StatusSettings

    return run_status(StatusSettings(), slot_name=RelaySettings().slot, as_json=args.json)


def add_status_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``status``; it sets ``func(args) -> exit code``."""
    parser = subparsers.add_parser(
        "status",
        help="every hop on one screen: relay slot, jobs, oldest PENDING, pauses, consumer lag",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.set_defaults(func=_cmd_status)
