"""The jobs an operator meets besides the sent ones, made on purpose for ``make dev``'s demo.

:class:`DemoMix` adds, on top of the demo batch, one job (or a few) in each state
operators deal with, by the means real ones get there, so the console, ``zapstream
status`` and ``zapstream jobs list`` show them:

- retried: the gateway simulator answers the first sends to three recipients 503
  (``fail_recipients``, transient); the worker retries and they end ACCEPTED;
- DEAD: a job with ``max_attempts=2`` whose recipient keeps answering 503;
- EXPIRED: a job whose ``expires_at`` passed before the worker reached it;
- INVALID: an outbox row written with plain SQL and a blank text: the relay rejects it;
- a paused instance (``inst-paused``, paused by "demo" before the batch): two jobs wait
  on it, PENDING, and a third is cancelled by the application (CANCELLED);
- UNCERTAIN: the same text to the same recipient twice; the second send's response is
  dropped (``drop_response_rate`` 1 while it is the only send in flight) and the listing
  hides references (``hide_references``), so reconciliation finds two identical messages
  and cannot tell which is this job's.

The mix runs after the demo batch was delivered, so the batch's audit (duplicates, order,
latency) is untouched; its jobs have purpose ``demo-mix`` and keys outside the batch's
``<run>:<instance>:<conversation>:<seq>`` form. :meth:`DemoMix.finish` says, per job, the
state it was meant to reach and the one it has, and how many times each mix recipient
reached the gateway (a retry that reached it twice would be a duplicate).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from connectors.outbox.commands import cancel
from connectors.outbox.controls import pause_instance
from connectors.outbox.enqueue import enqueue
from streams.kernel.contract import JobStatus

__all__ = [
    "MIX_PURPOSE",
    "PAUSED_INSTANCE",
    "PAUSE_REASON",
    "RETRY_SCHEDULE_S",
    "DemoMix",
    "MixJob",
    "MixPipeline",
    "MixReport",
    "MixResult",
    "worker_paused",
]

MIX_PURPOSE = "demo-mix"
PAUSED_INSTANCE = "inst-paused"
MIX_INSTANCE = "inst-01"
PAUSE_REASON = "demo: number under review by Meta"
RETRY_SCHEDULE_S = "[2, 4, 8]"
"""``ZAPSTREAM_WORKER_RETRY_SCHEDULE_S`` of ``make dev``'s worker: the demo's retries come
due in seconds (production waits a minute first), so the mix settles while you watch."""
TWIN_TEXT = "Your zapstream demo code is 4711"


class MixPipeline(Protocol):
    """What the mix needs of a pipeline (:class:`devtools.stack.local_pipeline.LocalPipeline`)."""

    @property
    def dsn(self) -> str: ...

    def sim_config(self, **config: Any) -> None: ...

    def sim_messages(self, since: int = 0) -> list[dict[str, Any]]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class MixJob:
    """One job of the mix: its key, what it shows, the state it should reach, and how many
    times its recipient should reach the gateway."""

    key: str
    label: str
    expected: JobStatus
    recipient: str
    arrivals: int
    min_attempts: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class MixResult:
    """A mix job as found in ``outbox_jobs`` at the end."""

    job: MixJob
    status: str | None
    attempts: int

    @property
    def ok(self) -> bool:
        return self.status == self.job.expected and self.attempts >= self.job.min_attempts


@dataclasses.dataclass(frozen=True, slots=True)
class MixReport:
    """The mix's jobs, their states, and the gateway's arrivals per mix recipient."""

    results: tuple[MixResult, ...]
    arrivals: Mapping[str, int]
    """Recipient -> times it reached the gateway."""
    expected_arrivals: Mapping[str, int]
    paused_instance: str

    @property
    def unexpected_arrivals(self) -> dict[str, tuple[int, int]]:
        """Recipient -> (arrived, expected), where they differ."""
        return {
            r: (self.arrivals.get(r, 0), n)
            for r, n in self.expected_arrivals.items()
            if self.arrivals.get(r, 0) != n
        }

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and not self.unexpected_arrivals

    def summary(self) -> str:
        lines = [
            f"demo mix (purpose {MIX_PURPOSE}, on top of the batch, not in its audit): "
            f"{sum(r.ok for r in self.results)}/{len(self.results)} jobs as meant"
        ]
        for result in self.results:
            found = result.status or "missing"
            mark = "ok" if result.ok else f"PROBLEM: meant {result.job.expected}"
            lines.append(f"  {result.job.label:<44} {found:<10} attempts {result.attempts}  {mark}")
        wrong = self.unexpected_arrivals
        arrived = sum(self.arrivals.get(r, 0) for r in self.expected_arrivals)
        lines.append(
            f"  mix messages at the gateway: {arrived} "
            f"(expected {sum(self.expected_arrivals.values())}"
            + (f"; {len(wrong)} recipient(s) differ)" if wrong else ", none twice)")
        )
        return "\n".join(lines)


def _digits(value: object) -> str:
    return re.sub(r"\D", "", str(value))


def worker_paused(metrics_url: str, instance: str) -> bool:
    """Whether the worker's ``/metrics`` says it holds ``instance`` (its pause arrived)."""
    try:
        text = httpx.get(metrics_url, timeout=2.0).text
    except httpx.HTTPError:
        return False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "zapstream_control_paused" and sample.labels.get("target") == (
                instance
            ):
                return sample.value == 1
    return False


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo mix: no {what} within {timeout_s:.0f}s")
        time.sleep(0.25)


class DemoMix:
    """Pause an instance (:meth:`pause`), later make the jobs (:meth:`run_mix`), then report
    (:meth:`finish`)."""

    def __init__(self, pipeline: MixPipeline, *, run: str, worker_metrics_url: str) -> None:
        self.pipeline = pipeline
        self.run = run
        self.worker_metrics_url = worker_metrics_url
        self.jobs: list[MixJob] = []
        self._number = 0

    def _recipient(self) -> str:
        # 5511 98xxxxxxx: never one of the batch's 5511 90xxxxxxx numbers.
        self._number += 1
        return f"551198{self._number:07d}"

    def _job(
        self, label: str, expected: JobStatus, *, arrivals: int, min_attempts: int = 0
    ) -> MixJob:
        name = re.sub(r"\W+", "-", label.split(":")[0]).strip("-")
        job = MixJob(
            key=f"mix-{self.run}-{len(self.jobs) + 1}-{name}",
            label=label,
            expected=expected,
            recipient=self._recipient(),
            arrivals=arrivals,
            min_attempts=min_attempts,
        )
        self.jobs.append(job)
        return job

    def _enqueue(
        self,
        conn: psycopg.Connection[Any],
        job: MixJob,
        *,
        instance: str = MIX_INSTANCE,
        text: str | None = None,
        **extra: Any,
    ) -> None:
        enqueue(
            conn,
            instance_id=instance,
            to=job.recipient,
            text=text or f"Your zapstream demo message ({job.label.split(':')[0]})",
            idempotency_key=job.key,
            purpose=MIX_PURPOSE,
            **extra,
        )

    def pause(self) -> None:
        """Pause :data:`PAUSED_INSTANCE` as an operator would (before the batch: the pause
        travels the pipeline like any row)."""
        with psycopg.connect(self.pipeline.dsn) as conn, conn.transaction():
            pause_instance(conn, PAUSED_INSTANCE, reason=PAUSE_REASON, actor="demo")

    def run_mix(self, *, timeout_s: float = 120.0) -> None:
        """Make the jobs and wait until each reached its state (raises TimeoutError)."""
        _wait(
            lambda: worker_paused(self.worker_metrics_url, PAUSED_INSTANCE),
            60,
            f"pause of {PAUSED_INSTANCE} at the worker",
        )
        retried = [
            self._job(
                f"retried: {n} transient 503(s), then sent",
                JobStatus.ACCEPTED,
                arrivals=1,
                min_attempts=n + 1,
            )
            for n in (1, 2, 1)
        ]
        dead = self._job("dead: 503 on both of its 2 attempts", JobStatus.DEAD, arrivals=0)
        expired = self._job(
            "expired: its expiry passed before sending", JobStatus.EXPIRED, arrivals=0
        )
        invalid = self._job("invalid: a row with a blank text", JobStatus.INVALID, arrivals=0)
        held = [
            self._job(f"held: instance {PAUSED_INSTANCE} paused", JobStatus.PENDING, arrivals=0)
            for _ in range(2)
        ]
        cancelled = self._job(
            "cancelled: by the application while held", JobStatus.CANCELLED, arrivals=0
        )
        first_twin = self._job(
            "sent: the first of two identical messages", JobStatus.ACCEPTED, arrivals=2
        )
        self.pipeline.sim_config(
            fail_recipients={
                **{job.recipient: job.min_attempts - 1 for job in retried},
                dead.recipient: 1000,
            }
        )
        past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        with psycopg.connect(self.pipeline.dsn) as conn:
            with conn.transaction():
                for job in retried:
                    self._enqueue(conn, job)
                self._enqueue(conn, dead, max_attempts=2)
                self._enqueue(conn, expired, expires_at=past)
                conn.execute(
                    "INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, purpose)"
                    " VALUES (%s, %s, %s, %s)",
                    (
                        MIX_INSTANCE,
                        # Plain SQL skips enqueue()'s checks, as a hand-written INSERT would.
                        json.dumps({"type": "text", "to": invalid.recipient, "text": "  "}),
                        invalid.key,
                        MIX_PURPOSE,
                    ),
                )
                for job in [*held, cancelled]:
                    self._enqueue(conn, job, instance=PAUSED_INSTANCE)
                self._enqueue(conn, first_twin, text=TWIN_TEXT)
            with conn.transaction():
                cancel(conn, cancelled.key, "demo: the customer asked to stop")
        self._wait_states([j for j in self.jobs if j.expected is not JobStatus.PENDING], timeout_s)
        self._uncertain(first_twin, timeout_s)

    def _uncertain(self, first_twin: MixJob, timeout_s: float) -> None:
        twin = MixJob(
            key=f"mix-{self.run}-{len(self.jobs) + 1}-uncertain",
            label="uncertain: response lost, listing ambiguous",
            expected=JobStatus.UNCERTAIN,
            recipient=first_twin.recipient,
            arrivals=0,  # counted with the first twin's recipient
        )
        self.jobs.append(twin)
        # Every other send has settled: the dropped response can only be this one.
        self.pipeline.sim_config(drop_response_rate=1.0, hide_references=True)
        try:
            with psycopg.connect(self.pipeline.dsn) as conn, conn.transaction():
                self._enqueue(conn, twin, text=TWIN_TEXT)
            self._wait_states([twin], timeout_s)
        finally:
            self.pipeline.sim_config(drop_response_rate=0.0, hide_references=False)

    def _statuses(self, jobs: Sequence[MixJob]) -> dict[str, tuple[str, int]]:
        with psycopg.connect(self.pipeline.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT idempotency_key, status, attempts FROM outbox_jobs"
                " WHERE idempotency_key = ANY(%s)",
                ([j.key for j in jobs],),
            ).fetchall()
        return {str(k): (str(s), int(a)) for k, s, a in rows}

    def _wait_states(self, jobs: Sequence[MixJob], timeout_s: float) -> None:
        def settled() -> bool:
            found = self._statuses(jobs)
            return all(found.get(j.key, ("", 0))[0] == j.expected for j in jobs)

        _wait(settled, timeout_s, "; ".join(f"{j.expected} for {j.label}" for j in jobs))

    def finish(self) -> MixReport:
        """Clear the simulator's per-recipient faults and report every mix job."""
        self.pipeline.sim_config(fail_recipients={})
        found = self._statuses(self.jobs)
        results = tuple(MixResult(j, *(found.get(j.key) or (None, 0))) for j in self.jobs)
        mine = {j.recipient for j in self.jobs}
        arrivals = Counter(
            to for m in self.pipeline.sim_messages() if (to := _digits(m.get("to", ""))) in mine
        )
        expected = {j.recipient: j.arrivals for j in self.jobs if j.expected != JobStatus.UNCERTAIN}
        return MixReport(
            results=results,
            arrivals=dict(arrivals),
            expected_arrivals=expected,
            paused_instance=PAUSED_INSTANCE,
        )
