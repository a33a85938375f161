"""Late redeliveries: an intent whose job the worker may have forgotten, checked against history.

The ``jobs`` table forgets a settled job once its last change is older than the
dedup horizon (:mod:`streams.dedup_horizon`). An intent for a job that is not in
the table is then either new, or a *late redelivery* (an offset rewind, a replay)
of a job handled before the horizon. The two are told apart by the intent's age:

- committed less than ``horizon_s - margin_s`` ago: its state cannot have been
  forgotten yet (the state's last change is never older than the commit), so the
  job is new and is processed without any lookup. ``margin_s`` absorbs clock skew
  between PostgreSQL (``committed_at``) and the worker (``StatusChanged.at``);
- older (or of unknown age): the long-term record decides, PostgreSQL's
  ``outbox_jobs.status`` (:class:`JobHistory`): PENDING (never handled, e.g.
  re-streamed on purpose by ``zapstream outbox restream``) is processed; any other
  status, or no row at all (purged long ago), means the job was handled before:
  the intent is dropped as a duplicate;
- the history cannot answer (PostgreSQL away, or refusing us): nothing is sent,
  the conversation waits and the lookup is tried again later. Never a guess.

This relies on the state sink having written the job's state to PostgreSQL
before the worker forgot it: the horizon (days) must stay far above the sink's lag.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import logging
from typing import Protocol

from prometheus_client import Counter

from streams.kernel.contract import IntentCaptured, JobStatus
from streams.kernel.runtime.outage import OutageLog

log = logging.getLogger(__name__)

LATE_REDELIVERIES = Counter(
    "zapstream_late_redeliveries_total",
    "Intents for jobs unknown to the worker and older than the dedup horizon, checked against "
    "outbox_jobs, by result (duplicate, missing, pending, unavailable)",
    ["result"],
)


RECALLED = Counter(
    "zapstream_jobs_recalled_total",
    "Receipts and commands about jobs the dedup horizon forgot, answered from outbox_jobs",
    ["result"],
)


class HistoryUnavailable(Exception):
    """The history could not answer; nothing may be decided from it now.

    ``permanent``: a retry fails the same way until an operator acts (credentials,
    missing database or schema); the intent still waits, the log says what to fix.
    """

    def __init__(self, problem: str, *, permanent: bool = False) -> None:
        super().__init__(problem)
        self.problem = problem
        self.permanent = permanent
        self.retriable = not permanent


@dataclasses.dataclass(frozen=True, slots=True)
class HistoricState:
    """What ``outbox_jobs`` knows of a job the worker's table forgot."""

    status: str
    version: int
    attempts: int
    gateway_job_id: str | None
    attempt_seq: int


class JobHistory(Protocol):
    """The long-term record of jobs (``outbox_jobs``), asked about jobs the table forgot."""

    async def status_of(self, job_id: int) -> str | None:
        """The job's status there, None when it has no row; raises :class:`HistoryUnavailable`."""
        ...

    async def state_of(self, job_id: int) -> HistoricState | None:
        """The job's state there (for a receipt or a command about a forgotten job)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LateVerdict(enum.Enum):
    SEND = "send"
    """New, or PENDING in the history: process it normally."""
    DUPLICATE = "duplicate"
    """Handled before the horizon: drop it, send nothing."""
    LATER = "later"
    """The history could not answer: send nothing now, ask again later."""


def _age_s(intent: IntentCaptured, now: dt.datetime) -> float | None:
    stamp = intent.committed_at or intent.created_at
    if not stamp:
        return None
    try:
        at = dt.datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return (now - at).total_seconds()


class LateRedeliveries:
    """Decides what to do with an intent for a job the ``jobs`` table does not hold."""

    def __init__(
        self,
        history: JobHistory,
        *,
        horizon_s: float,
        margin_s: float,
        retry_s: float,
    ) -> None:
        self.history = history
        self.horizon_s = horizon_s
        self.margin_s = margin_s
        self.retry_s = retry_s
        self._outage = OutageLog(
            "outbox_jobs (for late redeliveries)",
            log,
            retrying=f"their conversations wait, asking again every {retry_s:.0f}s",
        )

    @property
    def threshold_s(self) -> float:
        """An intent younger than this cannot belong to a forgotten job."""
        return max(0.0, self.horizon_s - self.margin_s)

    def may_be_forgotten(self, intent: IntentCaptured, now: dt.datetime) -> bool:
        age = _age_s(intent, now)
        return age is None or age >= self.threshold_s

    async def check(self, intent: IntentCaptured, now: dt.datetime) -> LateVerdict:
        """The verdict on an intent whose job is not in the table (never raises for an outage)."""
        if not self.may_be_forgotten(intent, now):
            return LateVerdict.SEND
        try:
            status = await self.history.status_of(intent.job_id)
        except HistoryUnavailable as exc:
            LATE_REDELIVERIES.labels("unavailable").inc()
            self._unavailable(exc)
            return LateVerdict.LATER
        self._available()
        if status == JobStatus.PENDING:
            LATE_REDELIVERIES.labels("pending").inc()
            log.info(
                "job %d: late intent (committed %s), outbox_jobs says PENDING: processing it",
                intent.job_id,
                intent.committed_at,
            )
            return LateVerdict.SEND
        LATE_REDELIVERIES.labels("duplicate" if status is not None else "missing").inc()
        log.info(
            "job %d: late redelivery (committed %s) dropped, handled before the dedup horizon "
            "(outbox_jobs status %s)",
            intent.job_id,
            intent.committed_at,
            status or "<no row>",
        )
        return LateVerdict.DUPLICATE

    async def recall(self, job_id: int) -> HistoricState | None:
        """``outbox_jobs``' state of a job the table forgot, asking until it answers."""
        while True:
            try:
                state = await self.history.state_of(job_id)
            except HistoryUnavailable as exc:
                self._unavailable(exc)
                await asyncio.sleep(self.retry_s)
                continue
            self._available()
            RECALLED.labels("found" if state is not None else "missing").inc()
            return state

    def retry_at(self, now_ts: float) -> float:
        return now_ts + self.retry_s

    def _unavailable(self, exc: HistoryUnavailable) -> None:
        self._outage.failed(exc.problem)

    def _available(self) -> None:
        self._outage.recovered()
