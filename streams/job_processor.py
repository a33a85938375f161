"""What happens to a job: the dispatcher's logic, free of Faust.

:class:`JobProcessor` decides and carries out what an intent, a command or a
receipt does to a job. It reads and writes the job's state through a
:class:`JobStore` whose ``put`` returns only once the state is durable (Kafka
acknowledged it), and it never sleeps: a transient failure returns
:class:`Park` with the time the job is due again, and the caller parks the
conversation durably (see :mod:`streams.parking`).

An intent, step by step:

1. The job is settled (sent, failed, dead, expired, cancelled, uncertain,
   review): a redelivery. Nothing is sent. The job is unknown and its intent is
   older than the dedup horizon: PostgreSQL decides (:mod:`streams.kernel.job_history`).
2. The job is ATTEMPTING: a previous owner may have sent it and died before the
   outcome was recorded. Reconcile (:mod:`streams.reconcile`) before any resend.
3. Before each attempt: expired means EXPIRED, never sent.
4. Journal: ATTEMPTING with a fresh attempt id, durable, before the gateway call;
   the attempt id is the ``Idempotency-Key`` the gateway sees.
5. Outcome: accepted (or REVIEW for an unknown label); permanent means FAILED;
   uncertain means reconcile, then adopt, UNCERTAIN, or (not accepted) a resend
   through the retry budget: the attempt counts, the job waits in RETRY_WAIT on
   the backoff schedule, DEAD at ``max_attempts``; transient means RETRY_WAIT
   until the backoff schedule says so, or DEAD (with every error, on
   ``zapstream.dead``) once ``max_attempts`` attempts were made.

The instance, not the message: a refusal of the instance itself (bad
credentials, unknown instance: :class:`~streams.kernel.errors.InstanceUnavailableError`)
pauses the instance (:mod:`streams.instance_pauses`). The job parks until the
next probe and the attempt is given back (nothing was sent); while paused, the
instance's intents park without calling the gateway, except the probe. So does a
configuration fault (:class:`~streams.kernel.errors.GatewayMisconfigured`: a 404 on the
send route; or the same permanent error for ``systemic_failures`` sends in a row
to different recipients, :class:`~streams.instance_pauses.PermanentStreaks`).

Templates (:mod:`streams.kernel.templates`): a template intent goes only to a gateway
that sends templates (Meta's); on another it ends FAILED with the reason, the gateway never
called. A template's own errors are the message's (FAILED with the reason), never the
instance's streak. A paused template (132015) holds the template's jobs like a paused
instance holds the instance's (:mod:`streams.template_pauses`): the attempt given back, a
re-check per interval. A text intent with a fallback template answered 131047 (window
closed: nothing was sent) is sent as the template at once, as the job's next attempt: the
job goes out once, as one or the other.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from streams.controls import HOLD_S, Controls
from streams.failure_log import FailureLog
from streams.instance_pauses import InstancePauses, PermanentStreaks
from streams.kernel.attempt_reference import ReferenceKey, legacy_reference
from streams.kernel.contract import (
    AttemptFinished,
    AttemptOutcome,
    CommandOutcome,
    CommandRequested,
    IntentCaptured,
    JobDead,
    JobStatus,
    Priority,
    ReceiptReceived,
    StatusChanged,
    opt_out_person,
)
from streams.kernel.errors import (
    GatewayError,
    InstanceUnavailableError,
    PermanentGatewayError,
    RateLimitedError,
    RecipientOptedOut,
    TransientGatewayError,
    UncertainGatewayError,
)
from streams.kernel.job_history import LateRedeliveries, LateVerdict
from streams.kernel.ports import CancelOutcome, Gateway, ListedJob, SendAccepted, TextMessage
from streams.kernel.runtime.throttled_log import ThrottledLog
from streams.kernel.state_machine import (
    NOT_HANDED_OVER,
    REPROCESSABLE,
    SENT,
    SETTLED,
    InvalidTransition,
    JobRef,
    transition,
)
from streams.kernel.templates import (
    TEMPLATE,
    TemplatePaused,
    TemplateRejected,
    WindowClosed,
    template_key,
    template_summary,
)
from streams.metrics import (
    ACCEPTED_TO_DELIVERED,
    GATEWAY_CALL_BY,
    OPTOUT_SKIPPED,
    OPTOUTS_LEARNT,
    QUIET_HOURS_HELD,
    RECEIPTS_IGNORED,
    RECONCILE_GAVE_UP,
)
from streams.optouts import NOT_READY_WAIT_S, OptOuts, applies, opted_out_by_receipt, skip_reason
from streams.pacing import OPERATIONAL, Pacer
from streams.quiet_hours import QuietHours
from streams.receipts import ignored_because, moves_forward, remember_event
from streams.reconcile import InstanceListings, ListingDeferred, Verdict, reconcile
from streams.template_pauses import TemplatePauses

log = logging.getLogger(__name__)
S = JobStatus
_T = TypeVar("_T")


class JobStore(Protocol):
    """The jobs' latest states; ``put`` returns when the state is durable."""

    def get(self, job_id: int) -> StatusChanged | None: ...

    async def put(self, state: StatusChanged, partition: int) -> None: ...


class Publisher(Protocol):
    """Where attempt outcomes and dead jobs go (``zapstream.dead``; attempts to
    ``zapstream.results`` only when the worker publishes them)."""

    async def attempt_finished(self, record: AttemptFinished, key: bytes) -> Awaitable[object]:
        """Queue the record; the returned awaitable completes once Kafka acknowledged it."""

    async def job_dead(self, record: JobDead) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff schedule for transient failures, with jitter downwards."""

    schedule_s: Sequence[float] = (60, 300, 1800, 7200, 86400)
    jitter: float = 0.2

    def delay_s(self, attempts: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Delay after the ``attempts``-th failed attempt (1-based); the last step repeats."""
        base = self.schedule_s[min(attempts, len(self.schedule_s)) - 1]
        delay = rng.uniform(base * (1 - self.jitter), base)
        return max(delay, retry_after_s or 0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    """The job needs nothing more from this conversation lane."""

    state: StatusChanged | None


@dataclasses.dataclass(frozen=True, slots=True)
class Park:
    """Transient failure: the conversation waits until ``due`` (epoch seconds).

    ``state`` is None when the job was held without a state change (a PENDING
    job of a paused instance).
    """

    due: float
    state: StatusChanged | None


Outcome = Done | Park


@dataclasses.dataclass(frozen=True, slots=True)
class _Attempt:
    """An attempt under way: the job journaled ATTEMPTING, the gateway being called."""

    intent: IntentCaptured
    ref: JobRef
    state: StatusChanged
    """The journal: the job's ATTEMPTING state, its ``attempts`` counting this one."""
    partition: int
    seq: int
    started: dt.datetime
    probe: bool
    reference: str
    """What the gateway was told (:meth:`JobProcessor.reference`), for the attempt's record."""


def job_ref(intent: IntentCaptured) -> JobRef:
    return JobRef(
        intent.job_id, intent.idempotency_key, intent.instance_id, intent.conversation_key
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class _RefusalWatch:
    """The listing as the reconciler sees it, remembering a refusal of the instance.

    :func:`streams.reconcile.reconcile` turns every listing failure into a verdict;
    a 401 on the listing must pause the instance instead of spending the budget.
    """

    def __init__(self, listing: InstanceListings) -> None:
        self._listing = listing
        self.name = listing.name
        self.refused: InstanceUnavailableError | None = None
        self.failed: GatewayError | None = None
        """Any other listing failure, for the failure log (not a deferral: nothing sent)."""

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> list[ListedJob] | None:
        try:
            return await self._listing.list_for_reconciliation(
                instance_id, references=references, since=since
            )
        except ListingDeferred:
            raise
        except InstanceUnavailableError as exc:
            self.refused = exc
            raise
        except GatewayError as exc:
            self.failed = exc
            raise


GAVE_UP_LOG_INTERVAL_S = 300.0


def _reconciling_since(current: StatusChanged, now: dt.datetime) -> dt.datetime:
    """When the reconciliation of the job's attempt began (now, if it begins now)."""
    if current.reconciling_since:
        try:
            return dt.datetime.fromisoformat(current.reconciling_since)
        except ValueError:
            pass
    return now


class JobProcessor:
    """Carries out intents, commands and receipts for one worker."""

    def __init__(
        self,
        gateway: Gateway,
        store: JobStore,
        publisher: Publisher,
        policy: RetryPolicy,
        *,
        listing_authoritative: bool = True,
        now: Callable[[], dt.datetime] = _now,
        rng: random.Random | None = None,
        pauses: InstancePauses | None = None,
        failures: FailureLog | None = None,
        late: LateRedeliveries | None = None,
        pacer: Pacer | None = None,
        pacing_wait_s: Mapping[str, float] | None = None,
        breaker_failures: int = 5,
        systemic_failures: int = 5,
        controls: Controls | None = None,
        listings: InstanceListings | None = None,
        reconcile_max_wait_s: float = 600.0,
        first_sight: Callable[[str], None] | None = None,
        references: ReferenceKey | None = None,
        template_pauses: TemplatePauses | None = None,
        optouts: OptOuts | None = None,
        quiet_hours: QuietHours | None = None,
    ) -> None:
        self.gateway = gateway
        self.quiet_hours = quiet_hours
        """Bulk jobs wait SCHEDULED while it is night for their recipient (None: off)."""
        self.template_pauses = template_pauses or TemplatePauses()
        """Templates Meta paused (132015), whose jobs wait (:mod:`streams.template_pauses`)."""
        self.sends_templates: bool = getattr(gateway, "sends_templates", False)
        """The gateway can send template intents (Meta's Cloud API)."""
        self.optouts = optouts if optouts is not None else OptOuts()
        """Recipients who opted out, per instance (:mod:`streams.optouts`)."""
        self._ignored_receipts = ThrottledLog(log, level=logging.INFO)
        """Ignored receipts' lines, one per reason a minute: forged or replayed ones flood."""
        self.references = references
        """Makes the attempt references the gateway is told and verifies receipts' (None:
        legacy ``<job>-<seq>`` references, which bind nothing; tests and tools only)."""
        self.first_sight = first_sight
        """Told each intent's instance (cheap): probes an instance the start did not ask about
        once (:meth:`streams.gateway_check.GatewayStartCheck.first_sight`)."""
        self.listings = listings or InstanceListings(gateway)
        """The gateway's listing, asked per instance for every job waiting on it."""
        self._gave_up: dict[str, tuple[float, int]] = {}
        """Per instance: when the last "gave up reconciling" line was logged, and how many
        jobs since."""
        self.reconcile_max_wait_s = reconcile_max_wait_s
        """How long a job whose outcome is unknown waits for a listing that concludes
        before it becomes UNCERTAIN and its conversation moves on."""
        self.controls = controls or Controls()
        """Operators' pauses of instances and campaigns (:mod:`streams.controls`)."""
        self.breaker_failures = breaker_failures
        """Transient failures in a row after which an instance is paused (0: never)."""
        self._failing: dict[str, int] = {}
        self.streaks = PermanentStreaks(
            systemic_failures,
            setting=getattr(gateway, "url_setting", "") or "the gateway settings",
        )
        """The same permanent error for ``systemic_failures`` sends in a row to different
        recipients pauses the instance instead of failing its queue (0: never)."""
        self.pacer = pacer or Pacer()
        """Token buckets per instance and recipient (:mod:`streams.pacing`)."""
        self.pacing_wait_s = dict(pacing_wait_s or {OPERATIONAL: 1.0})
        """How long a send may wait for its token in the lane, by priority (default: the
        operational bound); a longer wait parks the conversation until the token is due."""
        self.late = late
        """Checks intents for jobs the table forgot (None: the table never forgets)."""
        self.pauses = pauses or InstancePauses()
        self.failures = failures or FailureLog()
        self.store = store
        self.publisher = publisher
        self.policy = policy
        self.listing_authoritative = listing_authoritative
        self.now = now
        self.rng = rng or random.Random()

    # --- intents -------------------------------------------------------------------

    async def on_intent(
        self,
        intent: IntentCaptured,
        partition: int,
        *,
        reprocess: CommandRequested | None = None,
        probe: bool = False,
    ) -> Outcome:
        """Carry out an intent. ``probe``: send even though the instance is paused."""
        ref = job_ref(intent)
        if self.first_sight is not None:
            self.first_sight(intent.instance_id)
        if reprocess is not None:
            reopened = await self._reopen(ref, partition, reprocess)
            if isinstance(reopened, Done):
                return reopened
            current: StatusChanged | None = reopened
        else:
            current = self.store.get(intent.job_id)
            waits = await self._screen(intent, current, probe=probe)
            if waits is not None:
                return waits
        if current is not None and S(current.status) is S.ATTEMPTING:
            decided = await self._reconcile(
                intent, ref, current, partition, "redelivered", probe=probe
            )
            if decided is not None:
                return decided
            current = self.store.get(intent.job_id)
        if reprocess is None and not probe:
            held = await self._hold_for_quiet_hours(intent, ref, current, partition)
            if held is not None:
                return held
        return await self._send(intent, ref, current, partition, probe=probe)

    async def _hold_for_quiet_hours(
        self, intent: IntentCaptured, ref: JobRef, current: StatusChanged | None, partition: int
    ) -> Outcome | None:
        """A bulk job for a recipient in quiet time: SCHEDULED until the window's end (or
        its expiry), written back to outbox_jobs by the sink; the relay's release brings it
        back. It waits in PostgreSQL, not here (:mod:`streams.quiet_hours`). None: go on."""
        if self.quiet_hours is None or intent.priority != Priority.BULK:
            return None
        now = self.now()
        until = self.quiet_hours.hold_until(now, intent.to, intent.timezone)
        if until is None:
            return None
        if intent.expires_at is not None:
            expires = dt.datetime.fromisoformat(intent.expires_at)
            if expires <= now:
                return None  # expired: the attempt settles it EXPIRED
            until = min(until, expires)
        QUIET_HOURS_HELD.inc()
        return Done(
            await self._put(
                transition(
                    ref,
                    current,
                    S.SCHEDULED,
                    reason=f"quiet hours for the recipient: held until {until.isoformat()}",
                    next_retry_at=until.isoformat(),
                    now=now,
                ),
                partition,
            )
        )

    async def _reopen(
        self, ref: JobRef, partition: int, reprocess: CommandRequested
    ) -> StatusChanged | Done:
        """An operator's reprocess: a new round of attempts for a reprocessable job, or
        Done with the refusal noted."""
        current = await self.recall(ref)
        if current is None or S(current.status) not in REPROCESSABLE:
            status = current.status if current else "unknown to this worker"
            return Done(
                await self._note(
                    ref,
                    current,
                    partition,
                    f"reprocess refused: job is {status}",
                    actor=reprocess.actor,
                    outcome=CommandOutcome.REPROCESS_REFUSED,
                    command_id=reprocess.command_id,
                )
            )
        # A new round: the budget of attempts starts again, the ids go on.
        return await self._put(
            transition(
                ref,
                current,
                S(current.status),
                attempts=0,
                errors=[],
                actor=reprocess.actor,
                reason=f"reprocess requested: {reprocess.reason}",
                outcome=CommandOutcome.REPROCESSED,
                command_id=reprocess.command_id,
            ),
            partition,
        )

    async def _screen(
        self, intent: IntentCaptured, current: StatusChanged | None, *, probe: bool
    ) -> Outcome | None:
        """What stops an intent before anything is sent: a redelivery of a settled job (or
        of one the dedup horizon forgot), an operator's hold, a paused instance. None: go on.

        (An operator's reprocess never comes here: it acts as a probe, and holding a DEAD
        job would drop the command, as a settled job is never resumed.)
        """
        if current is not None and S(current.status) in SETTLED:
            return Done(None)
        if current is None and self.late is not None:
            # Unknown job: new, or a late redelivery of one the dedup horizon forgot.
            verdict = await self.late.check(intent, self.now())
            if verdict is LateVerdict.DUPLICATE:
                return Done(None)
            if verdict is LateVerdict.LATER:
                return Park(self.late.retry_at(self._ts()), None)
        if probe:
            return None
        if self.controls.held(intent.instance_id, intent.purpose) is not None:
            # An operator paused the instance or the campaign: the job waits unchanged
            # until a resume releases its conversation.
            return Park(self._ts() + HOLD_S, current)
        if self.pauses.paused(intent.instance_id):
            # Nothing goes to a refused instance; the job waits for the probe, unchanged.
            return Park(self.pauses.next_probe_at(intent.instance_id, self._ts()), current)
        return self._template_hold(intent, current)

    def _template_hold(self, intent: IntentCaptured, current: StatusChanged | None) -> Park | None:
        """A template Meta paused: the job waits unchanged until the template's re-check."""
        if intent.message_type != TEMPLATE or intent.template is None:
            return None
        due = self.template_pauses.hold(
            intent.instance_id, template_key(intent.template), self._ts()
        )
        return None if due is None else Park(due, current)

    async def _send(
        self,
        intent: IntentCaptured,
        ref: JobRef,
        current: StatusChanged | None,
        partition: int,
        *,
        probe: bool,
        paced: bool = True,
    ) -> Outcome:
        """One attempt: opt-out, pace, expire, journal ATTEMPTING, call the gateway, record the
        outcome.

        ``paced`` False: no token is waited for (a fallback template right after its text was
        refused: the job must not park between the two)."""
        skipped = await self._skip_opted_out(intent, ref, current, partition)
        if skipped is not None:
            return skipped
        if intent.message_type == TEMPLATE and not self.sends_templates:
            return await self._refuse_template(intent, ref, current, partition)
        if not probe and paced:
            wait = await self.pacer.acquire(
                intent.instance_id,
                intent.conversation_key,
                intent.priority,
                max_wait_s=self.pacing_wait_s.get(intent.priority, self.pacing_wait_s[OPERATIONAL]),
            )
            if wait > 0:
                # Paced: the job waits unchanged, its conversation parked until due.
                return Park(self._ts() + wait, current)
        if intent.expires_at is not None:
            if dt.datetime.fromisoformat(intent.expires_at) <= self.now():
                expired = transition(
                    ref, current, S.EXPIRED, reason=f"expired at {intent.expires_at}"
                )
                return Done(
                    await self._finish(
                        intent,
                        0,
                        AttemptOutcome.EXPIRED,
                        lambda: self._put(expired, partition),
                        error="expired",
                    )
                )
        attempts = (current.attempts if current else 0) + 1
        seq = (current.attempt_seq if current else 0) + 1
        attempt_id = f"{intent.job_id}-{seq}"
        reference = self.reference(intent.instance_id, intent.job_id, seq)
        journal = await self._put(
            transition(
                ref,
                current,
                S.ATTEMPTING,
                attempts=attempts,
                attempt_seq=seq,
                attempt_id=attempt_id,
            ),
            partition,
        )
        if not probe:
            await self.pacer.before_send(intent.instance_id)
        attempt = _Attempt(intent, ref, journal, partition, seq, self.now(), probe, reference)
        template = intent.template if intent.message_type == TEMPLATE else None
        message = TextMessage(intent.instance_id, intent.to, intent.text, reference, template)
        try:
            accepted = await self.gateway.send_text(message)
        except GatewayError as exc:
            return await self._on_send_failed(attempt, exc)
        return await self._on_accepted(attempt, accepted)

    async def _skip_opted_out(
        self, intent: IntentCaptured, ref: JobRef, current: StatusChanged | None, partition: int
    ) -> Outcome | None:
        """A job whose recipient opted out ends OPTED_OUT, never sent (a bulk job, or one
        the application marked ``respect_opt_out``); None: go on. Before every attempt, so
        a job waiting for a retry, or reprocessed, meets an opt-out made meanwhile."""
        if not applies(intent):
            return None
        if not self.optouts.ready:
            # The list is not read to its end yet: never send on a guess.
            return Park(self._ts() + NOT_READY_WAIT_S, current)
        reason = skip_reason(self.optouts, intent)
        if reason is None:
            return None
        OPTOUT_SKIPPED.labels(intent.instance_id).inc()
        skipped = transition(ref, current, S.OPTED_OUT, reason=reason)
        return Done(
            await self._finish(
                intent,
                0,
                AttemptOutcome.OPTED_OUT,
                lambda: self._put(skipped, partition),
                error="opted out",
            )
        )

    async def _on_opted_out(self, a: _Attempt, exc: RecipientOptedOut) -> Outcome:
        """The gateway says the recipient opted out (Meta's 131050): nothing was sent. The job
        ends OPTED_OUT by the gateway (the state sink's trigger records the opt-out, which
        comes back to every worker); this worker honours it at once."""
        intent = a.intent
        self._gateway_answered(intent.instance_id)
        self.optouts.add(intent.instance_id, opt_out_person(intent.to))
        OPTOUTS_LEARNT.labels(intent.instance_id, self.gateway.name).inc()
        log.info(
            "job %d: the gateway says the recipient opted out of instance %s; recorded, later "
            "bulk jobs to them are not sent",
            intent.job_id,
            intent.instance_id,
        )
        moved = transition(
            a.ref, a.state, S.OPTED_OUT, reason=str(exc), actor=f"gateway:{self.gateway.name}"
        )

        async def settle() -> Outcome:
            return Done(await self._put(moved, a.partition))

        return await self._finish_failed(a, AttemptOutcome.PERMANENT, exc, settle)

    async def _on_accepted(self, a: _Attempt, accepted: SendAccepted) -> Outcome:
        intent = a.intent
        self._gateway_answered(intent.instance_id)
        self.failures.record_success(intent.instance_id, self._ts())
        self._failing.pop(intent.instance_id, None)
        self.streaks.reset(intent.instance_id)
        self.pacer.on_sent(intent.instance_id, intent.conversation_key, self.pacer.clock())
        self._template_answered(intent)
        review = accepted.status is S.REVIEW
        reason = f"gateway label {accepted.gateway_status!r} is not configured" if review else None
        settled = transition(
            a.ref, a.state, accepted.status, reason=reason, gateway_job_id=accepted.gateway_job_id
        )
        # The attempt's outcome and the job's new state go out together (one produce
        # request) and are awaited together.
        return Done(
            await self._finish(
                intent,
                a.seq,
                AttemptOutcome.REVIEW if review else AttemptOutcome.ACCEPTED,
                lambda: self._put(settled, a.partition),
                started=a.started,
                reference=a.reference,
                gateway_job_id=accepted.gateway_job_id,
                gateway_status=accepted.gateway_status,
            )
        )

    async def _on_send_failed(self, a: _Attempt, exc: GatewayError) -> Outcome:
        """The gateway call failed: classified once (:mod:`streams.kernel.errors`), handled
        by kind. An unclassified subclass is a gateway client bug."""
        if isinstance(exc, InstanceUnavailableError):
            # Refused before anything was sent: the attempt is given back.
            self.failures.record(a.intent.instance_id, exc, self._ts())
            return await self._finish_failed(
                a, AttemptOutcome.TRANSIENT, exc, lambda: self._give_back(a, exc)
            )
        if isinstance(exc, RateLimitedError):
            return await self._on_rate_limited(a, exc)
        if isinstance(exc, RecipientOptedOut):
            return await self._on_opted_out(a, exc)
        if isinstance(exc, PermanentGatewayError):
            return await self._on_permanent(a, exc)
        if isinstance(exc, UncertainGatewayError):
            self.failures.record(a.intent.instance_id, exc, self._ts())
            return await self._finish_failed(
                a, AttemptOutcome.UNCERTAIN, exc, lambda: self._on_uncertain(a, exc)
            )
        if isinstance(exc, TransientGatewayError):
            self.failures.record(a.intent.instance_id, exc, self._ts())
            self._trip_if_failing(a.intent.instance_id, exc)
            return await self._finish_failed(
                a,
                AttemptOutcome.TRANSIENT,
                exc,
                lambda: self._retry_or_die(
                    a.intent, a.ref, a.state, a.partition, str(exc), exc.retry_after_s
                ),
            )
        raise TypeError(f"unclassified gateway error {type(exc).__name__}") from exc

    async def _on_rate_limited(self, a: _Attempt, exc: RateLimitedError) -> Outcome:
        """Nothing was sent: the attempt is given back, and the message waits for what the
        limit asks (Retry-After, or the pacer's backoff), not the schedule."""
        intent = a.intent
        delay = self.pacer.on_rate_limited(
            intent.instance_id,
            intent.conversation_key,
            exc.limit,
            exc.retry_after_s,
            self.pacer.clock(),
        )
        due = self.now() + dt.timedelta(seconds=delay)
        waiting = transition(
            a.ref,
            a.state,
            S.RETRY_WAIT,
            reason=f"rate limited ({exc.limit}): {exc}",
            attempts=a.state.attempts - 1,
            next_retry_at=due.isoformat(),
        )

        async def wait() -> Outcome:
            return Park(due=due.timestamp(), state=await self._put(waiting, a.partition))

        return await self._finish_failed(a, AttemptOutcome.TRANSIENT, exc, wait)

    async def _on_permanent(self, a: _Attempt, exc: PermanentGatewayError) -> Outcome:
        intent = a.intent
        if isinstance(exc, WindowClosed) and intent.message_type != TEMPLATE and intent.template:
            return await self._fall_back(a, exc)
        if isinstance(exc, TemplatePaused) and intent.message_type == TEMPLATE:
            return await self._hold_template(a, exc)
        self._template_answered(intent)
        self.failures.record(intent.instance_id, exc, self._ts())
        # The template's or the customer's fault, never the number's configuration.
        message_own = isinstance(exc, TemplateRejected | WindowClosed)
        systemic = None if message_own else self.streaks.observe(intent.instance_id, intent.to, exc)
        if systemic is not None:
            # Not this message's fault: the instance pauses and the job waits like
            # one refused for the instance, its attempt given back.
            return await self._finish_failed(
                a, AttemptOutcome.TRANSIENT, systemic, lambda: self._give_back(a, systemic)
            )
        self._gateway_answered(intent.instance_id)
        failed = transition(a.ref, a.state, S.FAILED, reason=str(exc))

        async def fail() -> Outcome:
            return Done(await self._put(failed, a.partition))

        return await self._finish_failed(a, AttemptOutcome.PERMANENT, exc, fail)

    # --- templates ---------------------------------------------------------------------

    async def _refuse_template(
        self, intent: IntentCaptured, ref: JobRef, current: StatusChanged | None, partition: int
    ) -> Done:
        """A template intent on a gateway that cannot send one: FAILED, the gateway never called."""
        reason = (
            f"{self.gateway.name} cannot send WhatsApp templates: a template intent needs "
            "the meta gateway (ZAPSTREAM_GATEWAY=meta)"
        )
        failed = transition(ref, current, S.FAILED, reason=reason)
        return Done(
            await self._finish(
                intent,
                0,
                AttemptOutcome.PERMANENT,
                lambda: self._put(failed, partition),
                error=reason,
            )
        )

    async def _fall_back(self, a: _Attempt, exc: WindowClosed) -> Outcome:
        """131047 to a text with a fallback template: the text was not sent (Meta refused the
        request), so the template goes now, as the job's next attempt (the text's given back)."""
        intent = a.intent
        assert intent.template is not None
        as_template = dataclasses.replace(
            intent, message_type=TEMPLATE, text=template_summary(intent.template)
        )
        noted = transition(
            a.ref,
            a.state,
            S.ATTEMPTING,
            reason=f"{exc}; sending the fallback template {template_key(intent.template)}",
            attempts=a.state.attempts - 1,
        )

        async def send_template() -> Outcome:
            state = await self._put(noted, a.partition)
            return await self._send(
                as_template, a.ref, state, a.partition, probe=a.probe, paced=False
            )

        return await self._finish_failed(a, AttemptOutcome.PERMANENT, exc, send_template)

    async def _hold_template(self, a: _Attempt, exc: TemplatePaused) -> Outcome:
        """132015: nothing was sent; the template's jobs wait for its re-check, this one in
        RETRY_WAIT with its attempt given back."""
        intent = a.intent
        assert intent.template is not None
        key = template_key(intent.template)
        due = self.template_pauses.pause(intent.instance_id, key, str(exc), self._ts())
        due_at = dt.datetime.fromtimestamp(due, dt.UTC).isoformat()
        waiting = transition(
            a.ref,
            a.state,
            S.RETRY_WAIT,
            reason=f"template {key} paused by Meta, held until its re-check at {due_at}: {exc}",
            attempts=a.state.attempts - 1,
            next_retry_at=due_at,
        )

        async def wait() -> Outcome:
            return Park(due=due, state=await self._put(waiting, a.partition))

        return await self._finish_failed(a, AttemptOutcome.TRANSIENT, exc, wait)

    def _template_answered(self, intent: IntentCaptured) -> None:
        """Meta answered a template send with something other than 132015: a pause is over."""
        if intent.message_type == TEMPLATE and intent.template is not None:
            self.template_pauses.resume(
                intent.instance_id, template_key(intent.template), self._ts()
            )

    async def _on_uncertain(self, a: _Attempt, exc: UncertainGatewayError) -> Outcome:
        decided = await self._reconcile(
            a.intent, a.ref, a.state, a.partition, str(exc), probe=a.probe
        )
        if decided is not None:
            return decided
        # Not accepted: a resend spends the retry budget like any failed attempt,
        # on the backoff schedule (never an immediate loop).
        current = self.store.get(a.intent.job_id)
        assert current is not None
        return await self._retry_or_die(
            a.intent, a.ref, current, a.partition, f"{exc}; not accepted, resending", None
        )

    async def _give_back(self, a: _Attempt, error: InstanceUnavailableError) -> Outcome:
        """The instance, not the message, was refused: pause it, the attempt given back."""
        return await self._hold_for_instance(
            a.intent,
            a.ref,
            a.state,
            a.partition,
            error,
            probe=a.probe,
            attempts=a.state.attempts - 1,
        )

    async def _finish_failed(
        self,
        a: _Attempt,
        outcome: AttemptOutcome,
        error: Exception,
        then: Callable[[], Awaitable[_T]],
    ) -> _T:
        return await self._finish(
            a.intent,
            a.seq,
            outcome,
            then,
            started=a.started,
            reference=a.reference,
            error=str(error),
        )

    async def _finish(
        self,
        intent: IntentCaptured,
        seq: int,
        outcome: AttemptOutcome,
        then: Callable[[], Awaitable[_T]],
        *,
        started: dt.datetime | None = None,
        **fields: str | None,
    ) -> _T:
        """The attempt triad: queue the attempt's record, run ``then`` (the job's next state,
        durable), then wait for the record's acknowledgement: both go out in one produce
        request and are both durable when this returns."""
        ack = await self._attempt(intent, seq, outcome, started, **fields)
        result = await then()
        await ack
        return result

    async def _reconcile(
        self,
        intent: IntentCaptured,
        ref: JobRef,
        current: StatusChanged,
        partition: int,
        why: str,
        *,
        probe: bool = False,
    ) -> Outcome | None:
        """Decide an attempt of unknown outcome. None: not accepted, may be sent again."""
        watch = _RefusalWatch(self.listings)
        result = await reconcile(
            watch,
            instance_id=intent.instance_id,
            job_id=intent.job_id,
            to=intent.to,
            text=intent.text,
            authoritative=self.listing_authoritative,
            attempt_seq=current.attempt_seq,
            created_at=intent.created_at or intent.committed_at,
            reference_of=lambda seq: self.references_of(intent.instance_id, intent.job_id, seq),
        )
        if watch.refused is not None:
            # The listing was refused for the instance: the job stays ATTEMPTING (it is
            # reconciled again once the instance is back) and nothing is counted.
            self.failures.record(intent.instance_id, watch.refused, self._ts())
            return await self._hold_for_instance(
                intent, ref, current, partition, watch.refused, probe=probe, attempts=None
            )
        if watch.failed is not None:
            self.failures.record(intent.instance_id, watch.failed, self._ts())
        if result.verdict is not Verdict.LATER:
            self._gateway_answered(intent.instance_id)
        if result.verdict is Verdict.RESEND:
            log.info("job %d: %s; %s", intent.job_id, why, result.reason)
            return None
        if result.verdict is Verdict.ADOPT:
            assert result.job is not None
            return await self._adopt(
                intent, ref, current, partition, why, result.job, result.reason
            )
        if result.verdict is Verdict.LATER:
            # The listing cannot conclude now: ask it again when the instance's listing may
            # be asked (its backoff), still ATTEMPTING, so nothing is resent unasked; past
            # the bound the job is UNCERTAIN and its conversation moves on.
            now = self.now()
            since = _reconciling_since(current, now)
            deadline = since + dt.timedelta(seconds=self.reconcile_max_wait_s)
            if now < deadline:
                due_ts = max(
                    now.timestamp() + 1.0,
                    result.retry_at
                    or (self.listings.deferred_until(intent.instance_id) or now.timestamp()),
                )
                due = min(dt.datetime.fromtimestamp(due_ts, dt.UTC), deadline)
                noted = await self._put(
                    dataclasses.replace(
                        transition(
                            ref,
                            current,
                            S.ATTEMPTING,
                            reason=f"outcome unknown ({why}); {result.reason}; reconciling again",
                            next_retry_at=due.isoformat(),
                        ),
                        reconciling_since=since.isoformat(),
                    ),
                    partition,
                )
                return Park(due=due.timestamp(), state=noted)
            RECONCILE_GAVE_UP.labels(intent.instance_id).inc()
            self._log_gave_up(intent, result.reason)
            detail = (
                f"reconciliation did not conclude within {self.reconcile_max_wait_s:.0f}s: "
                f"{result.reason}"
            )
        else:
            detail = result.reason
        return Done(
            await self._put(
                transition(
                    ref,
                    current,
                    S.UNCERTAIN,
                    reason=f"outcome unknown ({why}); {detail}; not resent",
                ),
                partition,
            )
        )

    async def _adopt(
        self,
        intent: IntentCaptured,
        ref: JobRef,
        current: StatusChanged,
        partition: int,
        why: str,
        listed: ListedJob,
        reason: str,
    ) -> Done:
        """The listing shows the gateway took the attempt: the job takes the listed state."""
        status = listed.status if listed.status in SENT else S.ACCEPTED
        adopted = transition(
            ref,
            current,
            status,
            reason=f"reconciled ({why}): {reason}",
            gateway_job_id=listed.gateway_job_id,
        )
        return Done(
            await self._finish(
                intent,
                current.attempt_seq,
                AttemptOutcome.ACCEPTED,
                lambda: self._put(adopted, partition),
                gateway_job_id=listed.gateway_job_id,
                gateway_status=listed.gateway_status,
                error=f"reconciled: {reason}",
            )
        )

    def _log_gave_up(self, intent: IntentCaptured, reason: str) -> None:
        """One WARNING per instance when its jobs start ending UNCERTAIN for want of a
        listing, then at most one line with the count every :data:`GAVE_UP_LOG_INTERVAL_S`."""
        now = self._ts()
        last, count = self._gave_up.get(intent.instance_id, (0.0, 0))
        count += 1
        if last and now - last < GAVE_UP_LOG_INTERVAL_S:
            self._gave_up[intent.instance_id] = (last, count)
            return
        self._gave_up[intent.instance_id] = (now, 0)
        log.warning(
            "instance %s: %d job(s) UNCERTAIN%s (last: job %d): the outcome is unknown and the "
            "listing did not conclude within %.0fs (ZAPSTREAM_WORKER_RECONCILE_MAX_WAIT_S); "
            "their conversations move on; see `zapstream jobs list --state UNCERTAIN`; %s",
            intent.instance_id,
            count,
            f" in the last {now - last:.0f}s" if last else "",
            intent.job_id,
            self.reconcile_max_wait_s,
            reason,
        )

    async def _retry_or_die(
        self,
        intent: IntentCaptured,
        ref: JobRef,
        current: StatusChanged,
        partition: int,
        error: str,
        retry_after_s: float | None,
    ) -> Outcome:
        errors = [*current.errors, error]
        if current.attempts >= intent.max_attempts:
            reason = f"gave up after {current.attempts} attempts: {error}"
            dead = await self._put(
                transition(ref, current, S.DEAD, reason=reason, errors=errors), partition
            )
            await self.publisher.job_dead(
                JobDead(
                    job_id=intent.job_id,
                    idempotency_key=intent.idempotency_key,
                    reason=reason,
                    errors=errors,
                    record=intent.to_dict(),
                )
            )
            return Done(dead)
        delay = self.policy.delay_s(current.attempts, retry_after_s, self.rng)
        due = self.now() + dt.timedelta(seconds=delay)
        waiting = await self._put(
            transition(
                ref,
                current,
                S.RETRY_WAIT,
                reason=error,
                errors=errors,
                next_retry_at=due.isoformat(),
            ),
            partition,
        )
        return Park(due=due.timestamp(), state=waiting)

    # --- commands and receipts ------------------------------------------------------

    def cancels_without_gateway(self, command: CommandRequested) -> bool:
        """True when a cancel needs no gateway call: the job was not handed over yet."""
        current = self.store.get(command.job_id)
        return current is None or S(current.status) in NOT_HANDED_OVER

    async def on_cancel(self, command: CommandRequested, partition: int) -> StatusChanged | None:
        ref = JobRef(
            command.job_id, command.idempotency_key, command.instance_id, command.conversation_key
        )
        current = await self.recall(ref)
        status = S(current.status) if current else S.PENDING
        why = f"cancel requested: {command.reason}"
        command_id = command.command_id
        if status in NOT_HANDED_OVER:
            # A SCHEDULED job may never have been an intent here (its release is): it
            # settles CANCELLED all the same, and the release never releases it.
            return await self._put(
                transition(
                    ref,
                    current,
                    S.CANCELLED,
                    reason=why,
                    actor=command.actor,
                    outcome=CommandOutcome.CANCELLED,
                    command_id=command_id,
                ),
                partition,
            )
        if status in {S.ACCEPTED, S.REVIEW} and current and current.gateway_job_id:
            try:
                outcome = await self.gateway.cancel_job(command.instance_id, current.gateway_job_id)
            except GatewayError as exc:
                return await self._note(
                    ref,
                    current,
                    partition,
                    f"cancel failed at the gateway: {exc}",
                    actor=command.actor,
                    outcome=CommandOutcome.CANCEL_FAILED,
                    command_id=command_id,
                )
            if outcome is CancelOutcome.CANCELLED:
                return await self._put(
                    transition(
                        ref,
                        current,
                        S.CANCELLED,
                        actor=command.actor,
                        reason=f"{why}; confirmed by {self.gateway.name}",
                        outcome=CommandOutcome.CANCELLED,
                        command_id=command_id,
                    ),
                    partition,
                )
            refused = outcome is CancelOutcome.REFUSED
            detail = (
                "the gateway already sent it"
                if refused
                else f"{self.gateway.name} cannot cancel accepted messages"
            )
            return await self._note(
                ref,
                current,
                partition,
                f"cancel not possible: {detail}",
                actor=command.actor,
                outcome=CommandOutcome.CANCEL_REFUSED
                if refused
                else CommandOutcome.CANCEL_UNSUPPORTED,
                command_id=command_id,
            )
        return await self._note(
            ref,
            current,
            partition,
            f"cancel not possible: job is {status}",
            actor=command.actor,
            outcome=CommandOutcome.CANCEL_REFUSED,
            command_id=command_id,
        )

    async def on_receipt(self, receipt: ReceiptReceived, partition: int) -> StatusChanged | None:
        """Apply a gateway callback monotonically; late and duplicated ones change nothing.

        Only a receipt about the job's current attempt applies (:mod:`streams.receipts`):
        a callback about an earlier attempt, or one whose event id was applied already,
        is counted, logged at INFO and changes nothing (no state, no event).
        """
        ref = JobRef(
            receipt.job_id, receipt.idempotency_key, receipt.instance_id, receipt.conversation_key
        )
        current = await self.recall(ref)
        if current is None:
            await self.publisher.job_dead(
                JobDead(
                    job_id=receipt.job_id,
                    idempotency_key=receipt.idempotency_key,
                    reason="receipt for a job this pipeline has no state for",
                    record=receipt.to_dict(),
                )
            )
            return None
        ignored = ignored_because(current, receipt, gateway=self.gateway.name, key=self.references)
        if ignored is not None:
            RECEIPTS_IGNORED.labels(ignored.reason).inc()
            # Rate-limited per reason: forged or replayed receipts come in floods.
            self._ignored_receipts.note(
                ignored.reason,
                f"job {receipt.job_id}: {receipt.gateway} receipt {receipt.label!r} ignored: "
                f"{ignored.detail}",
            )
            return None
        status, target = S(current.status), S(receipt.status)
        if not moves_forward(status, target):
            return None  # late or duplicated: a "sent" never downgrades "read"
        if target is S.FAILED and opted_out_by_receipt(receipt):
            # Meta's 131050 in a failed status: the job ends OPTED_OUT by the gateway, and
            # the state sink's trigger records the opt-out (it comes back to every worker).
            target = S.OPTED_OUT
        try:
            moved = transition(
                ref,
                current,
                target,
                actor=f"gateway:{receipt.gateway}",
                reason=f"receipt {receipt.label!r}"
                + (f": {receipt.reason}" if receipt.reason else ""),
                # The current attempt's gateway id stays; a receipt only fills one in.
                gateway_job_id=current.gateway_job_id or receipt.gateway_job_id,
            )
        except InvalidTransition as exc:
            log.warning("receipt not applied: %s", exc)
            return None
        if status is S.ACCEPTED and target in (S.DELIVERED, S.READ) and current.sent_at:
            delivered_after = self.now() - dt.datetime.fromisoformat(current.sent_at)
            ACCEPTED_TO_DELIVERED.labels(receipt.instance_id).observe(
                max(0.0, delivered_after.total_seconds())
            )
        events = remember_event(current.receipt_events, receipt.event_id)
        return await self._put(dataclasses.replace(moved, receipt_events=events), partition)

    # --- helpers ----------------------------------------------------------------------

    def reference(self, instance_id: str, job_id: int, seq: int) -> str:
        """The reference attempt ``seq`` of ``job_id`` tells the gateway."""
        if self.references is None:
            return legacy_reference(job_id, seq)
        return self.references.reference(self.gateway.name, instance_id, job_id, seq)

    def references_of(self, instance_id: str, job_id: int, seq: int) -> list[str]:
        """Every reference attempt ``seq`` may have been sent with: the tagged one and the
        legacy one (an attempt made before the upgrade), for reconciliation's listing."""
        references = [self.reference(instance_id, job_id, seq)]
        legacy = legacy_reference(job_id, seq)
        return references if legacy in references else [*references, legacy]

    async def recall(self, ref: JobRef) -> StatusChanged | None:
        """The job's state: the table's, else, for a job the dedup horizon forgot, what
        ``outbox_jobs`` says (waiting while it cannot answer: a receipt or a command is
        never decided on a guess). None: the job is new or still PENDING."""
        current = self.store.get(ref.job_id)
        if current is not None or self.late is None:
            return current
        old = await self.late.recall(ref.job_id)
        if old is None or old.status == S.PENDING:
            return None
        if old.status == S.SCHEDULED and old.version == 0:
            # Scheduled at insert and not released yet: no state of it exists anywhere.
            return None
        return StatusChanged(
            job_id=ref.job_id,
            idempotency_key=ref.idempotency_key,
            instance_id=ref.instance_id,
            conversation_key=ref.conversation_key,
            status=old.status,
            previous=old.status,
            version=old.version,
            attempts=old.attempts,
            gateway_job_id=old.gateway_job_id,
            attempt_seq=old.attempt_seq,
            attempt_id=f"{ref.job_id}-{old.attempt_seq}" if old.attempt_seq else None,
            reason="recalled from outbox_jobs (past the dedup horizon)",
            at=self.now().isoformat(),
        )

    async def _put(self, state: StatusChanged, partition: int) -> StatusChanged:
        await self.store.put(state, partition)
        return state

    def _ts(self) -> float:
        return self.now().timestamp()

    def _trip_if_failing(self, instance_id: str, exc: TransientGatewayError) -> None:
        """The instance breaker: after ``breaker_failures`` transient failures in a row the
        instance is paused like a refused one (its intents wait durably, one probe per
        interval, a slow start when a probe gets through)."""
        failing = self._failing.get(instance_id, 0) + 1
        self._failing[instance_id] = failing
        if self.breaker_failures and failing >= self.breaker_failures:
            if not self.pauses.paused(instance_id):
                self.pauses.pause(instance_id, exc, self._ts(), parked=True)
            self._failing.pop(instance_id, None)

    def _gateway_answered(self, instance_id: str) -> None:
        """The gateway got past the instance's credentials: a paused instance resumes,
        slowly (:meth:`streams.pacing.Pacer.slow_start`)."""
        if self.pauses.resume(instance_id, self._ts()):
            self.pacer.slow_start(instance_id, self.pacer.clock())

    async def _hold_for_instance(
        self,
        intent: IntentCaptured,
        ref: JobRef,
        current: StatusChanged,
        partition: int,
        error: InstanceUnavailableError,
        *,
        probe: bool,
        attempts: int | None,
    ) -> Park:
        """Pause the instance; the job waits for the next probe, its attempt given back.

        ``attempts`` None: keep the job as it is (ATTEMPTING, to be reconciled later).
        """
        due = self.pauses.pause(intent.instance_id, error, self._ts(), parked=probe)
        if attempts is None:
            return Park(due=due, state=current)
        waiting = await self._put(
            transition(
                ref,
                current,
                S.RETRY_WAIT,
                reason=f"instance {intent.instance_id} paused: {error}",
                attempts=attempts,
                next_retry_at=dt.datetime.fromtimestamp(due, dt.UTC).isoformat(),
            ),
            partition,
        )
        return Park(due=due, state=waiting)

    async def _note(
        self,
        ref: JobRef,
        current: StatusChanged | None,
        partition: int,
        reason: str,
        *,
        actor: str,
        outcome: CommandOutcome | None = None,
        command_id: int | None = None,
    ) -> StatusChanged:
        status = S(current.status) if current else S.PENDING
        return await self._put(
            transition(
                ref,
                current,
                status,
                reason=reason,
                actor=actor,
                outcome=outcome,
                command_id=command_id,
            ),
            partition,
        )

    async def _attempt(
        self,
        intent: IntentCaptured,
        seq: int,
        outcome: AttemptOutcome,
        started: dt.datetime | None = None,
        **fields: str | None,
    ) -> Awaitable[object]:
        """Hand the attempt's outcome to the publisher (``zapstream.results`` when published);
        await the result for the ack."""
        finished = self.now()
        if "reference" not in fields:
            fields["reference"] = (
                self.reference(intent.instance_id, intent.job_id, seq) if seq else None
            )
        if started is not None:
            GATEWAY_CALL_BY(self.gateway.name, outcome).observe(
                max(0.0, (finished - started).total_seconds())
            )
        record = AttemptFinished(
            job_id=intent.job_id,
            idempotency_key=intent.idempotency_key,
            instance_id=intent.instance_id,
            conversation_key=intent.conversation_key,
            attempt=seq,
            attempt_id=f"{intent.job_id}-{seq}",
            outcome=outcome,
            gateway=self.gateway.name,
            started_at=(started or finished).isoformat(),
            finished_at=finished.isoformat(),
            committed_at=intent.committed_at,
            **fields,
        )
        return await self.publisher.attempt_finished(record, intent.partition_key)
