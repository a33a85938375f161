"""Paused gateway instances: stop sending where the gateway refuses the instance itself.

A wrong API key (401/403) or an unknown instance (404) fails every message of
the instance the same way, and nothing was sent. Failing each message would
empty the queue in a second; retrying each on its own schedule would spend
their attempts. Instead the first such failure *pauses* the instance:

- the job waits (its conversation parks, :mod:`streams.parking`) and the
  attempt does not count against ``max_attempts``;
- further intents of the instance park without calling the gateway;
- once every ``probe_interval_s`` one parked conversation of the instance is
  re-run as a *probe* (its head job is sent);
- a probe the gateway gets past (accepted, or any answer other than an
  instance or transient failure) resumes the instance and its parked
  conversations are released at once.

One ERROR line per instance per outage when it starts, a reminder at most every
``reminder_interval_s`` while it lasts and one INFO line with the outage
duration when it ends; ``zapstream_instance_paused{instance}`` is 1 meanwhile.
The state is in memory, per worker: after a restart the pause is learnt again
from the next refused send (parked conversations are durable anyway).

A configuration fault (:class:`~streams.kernel.errors.GatewayMisconfigured`: a wrong base
URL answers 404 on the send route; or :class:`PermanentStreaks`: the same permanent
error for N sends in a row to different recipients) is the gateway's, not one
instance's: every instance meets it. Each instance still pauses on its own (an
instance whose sends work is never held for another's), but the fault is logged
once: one ERROR naming the setting to check, when the start-up check
(:meth:`InstancePauses.note_misconfigured`) or the first instance meets it, and a
WARNING for each further instance; reminders come from one instance only. Its
probes back off: the interval doubles after each failed probe, up to
``probe_max_s`` (a wrong URL is fixed by an operator and a restart, not by retrying).

Sans-IO: every method takes ``now`` in epoch seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable

from streams import metrics
from streams.kernel.errors import (
    GatewayError,
    GatewayMisconfigured,
    PermanentGatewayError,
    names_a_resource,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class _Pause:
    since: float
    status_code: int | None
    reason: str
    next_probe_at: float
    last_reminder: float
    probes: int = 0
    setting: str | None = None
    """The setting a configuration fault names (None: the instance's own refusal)."""


@dataclasses.dataclass(slots=True)
class _Fault:
    """A configuration fault of the gateway, logged once for every instance it pauses."""

    since: float
    reason: str
    lead: str | None
    """The instance whose reminders speak for the fault (None: only the start-up check)."""


class InstancePauses:
    """Which instances of this worker are paused, and when each is probed next."""

    def __init__(
        self,
        probe_interval_s: float = 30.0,
        *,
        reminder_interval_s: float = 300.0,
        release_window_s: float | None = None,
        probe_max_s: float = 300.0,
        waiting: Callable[[str], int] | None = None,
    ) -> None:
        self.probe_interval_s = probe_interval_s
        self.probe_max_s = max(probe_max_s, probe_interval_s)
        """Longest interval between probes of an instance paused for a configuration fault."""
        self.reminder_interval_s = reminder_interval_s
        self.release_window_s = (
            release_window_s if release_window_s is not None else 2 * probe_interval_s
        )
        self.waiting: Callable[[str], int] = waiting or (lambda instance: 0)
        """Jobs parked for an instance, for the log lines (the parking lot's count)."""
        self._paused: dict[str, _Pause] = {}
        self._resumed: dict[str, float] = {}
        self._faults: dict[str, _Fault] = {}
        """Open configuration faults by the setting they name."""

    def paused(self, instance: str) -> bool:
        return instance in self._paused

    def paused_instances(self) -> list[str]:
        return list(self._paused)

    def next_probe_at(self, instance: str, now: float) -> float:
        """When the instance's next probe may run (``now`` plus the interval when not paused)."""
        pause = self._paused.get(instance)
        return pause.next_probe_at if pause else now + self.probe_interval_s

    def pause(self, instance: str, error: GatewayError, now: float, *, parked: bool) -> float:
        """Record a refusal; returns when the job that met it is due (the next probe).

        ``parked``: the job was already counted among the instance's parked jobs.
        """
        pause = self._paused.get(instance)
        if pause is None:
            setting = error.setting if isinstance(error, GatewayMisconfigured) else None
            pause = _Pause(
                since=now,
                status_code=error.status_code,
                reason=_why(error),
                next_probe_at=now + self.probe_interval_s,
                last_reminder=now,
                setting=setting,
            )
            self._paused[instance] = pause
            self._resumed.pop(instance, None)
            metrics.INSTANCE_PAUSED.labels(instance).set(1)
            waiting = self.waiting(instance) + (0 if parked else 1)
            fault = self._faults.get(setting) if setting is not None else None
            if fault is not None:
                # Logged once for the gateway already: this instance meets the same fault.
                fault.lead = fault.lead or instance
                log.warning(
                    "instance %s paused too: %s; %d jobs waiting",
                    instance,
                    pause.reason,
                    waiting,
                )
                return pause.next_probe_at
            if setting is not None:
                self._faults[setting] = _Fault(since=now, reason=pause.reason, lead=instance)
            log.error(
                "instance %s paused: %s; %d jobs waiting; probing every %.0fs%s",
                instance,
                pause.reason,
                waiting,
                self.probe_interval_s,
                " (backing off), every instance configured the same way pauses likewise"
                if setting is not None
                else "",
            )
            return pause.next_probe_at
        fault = self._faults.get(pause.setting) if pause.setting is not None else None
        if fault is not None and fault.lead not in (None, instance):
            return pause.next_probe_at  # the lead instance's reminders speak for the fault
        if now - pause.last_reminder >= self.reminder_interval_s:
            pause.last_reminder = now
            log.error(
                "instance %s still paused after %.0fs: %s; %d jobs waiting; %d probes failed",
                instance,
                now - pause.since,
                pause.reason,
                self.waiting(instance),
                pause.probes,
            )
        return pause.next_probe_at

    def claim_probe(self, instance: str, now: float) -> bool:
        """True once per interval for a paused instance: the caller runs one probe now."""
        pause = self._paused.get(instance)
        if pause is None or now < pause.next_probe_at:
            return False
        pause.probes += 1
        interval = self.probe_interval_s
        if pause.setting is not None:
            # A configuration fault: capped exponential backoff between probes.
            interval = min(self.probe_interval_s * 2 ** min(pause.probes, 30), self.probe_max_s)
        pause.next_probe_at = now + interval
        return True

    def note_misconfigured(self, error: GatewayMisconfigured, now: float, *, where: str) -> None:
        """The start-up check met a configuration fault without a real instance to pause
        (``where`` says what it asked): the one ERROR line, before any send meets it."""
        if error.setting in self._faults:
            return
        reason = _why(error)
        self._faults[error.setting] = _Fault(since=now, reason=reason, lead=None)
        log.error(
            "gateway check (%s): %s; every instance configured the same way pauses at its "
            "first send, its messages wait (nothing is FAILED)",
            where,
            reason,
        )

    def misconfigured(self) -> list[str]:
        """The settings named by the configuration faults open now."""
        return list(self._faults)

    def resume(self, instance: str, now: float) -> bool:
        """The gateway took a request of the instance again; True when it was paused."""
        pause = self._paused.pop(instance, None)
        if pause is None:
            if self._faults:
                self._close_faults(instance, now)
            return False
        self._resumed[instance] = now
        metrics.INSTANCE_PAUSED.labels(instance).set(0)
        log.info(
            "instance %s resumed after %.0fs paused (%s); releasing its %d parked jobs",
            instance,
            now - pause.since,
            pause.reason,
            self.waiting(instance),
        )
        if self._faults:
            self._close_faults(instance, now)
        return True

    def _close_faults(self, instance: str, now: float) -> None:
        """The gateway took a request of ``instance``: a fault no paused instance holds any
        more is over (one INFO line)."""
        held = {p.setting for p in self._paused.values()}
        for setting in [s for s in self._faults if s not in held]:
            fault = self._faults.pop(setting)
            log.info(
                "gateway configuration fault (check %s) over after %.0fs: instance %s works",
                setting,
                now - fault.since,
                instance,
            )

    def released(self, instance: str, due: float, now: float) -> bool:
        """A conversation parked while the instance was paused runs now, not at its due time."""
        resumed = self._resumed.get(instance)
        if resumed is None:
            return False
        if now - resumed > self.release_window_s:
            del self._resumed[instance]
            return False
        # Parked for the pause: due at a probe time, so no later than resume + the interval.
        return due <= resumed + self.probe_interval_s


def _why(error: GatewayError) -> str:
    code = error.status_code
    if isinstance(error, GatewayMisconfigured):
        return f"gateway configuration looks wrong, check {error.setting}: {error}"
    if code in (401, 403):
        return f"gateway refused credentials ({code})"
    if code == 404:
        return "gateway does not know the instance (404)"
    if "disconnected" in str(error):
        return f"gateway says the instance is disconnected ({code})"
    if error.scope != "instance":
        return f"failing in a row, last: {error}"
    return f"gateway refused the instance ({code or type(error).__name__})"


_DIGITS = re.compile(r"[\d*#]+")


@dataclasses.dataclass(slots=True)
class _Streak:
    signature: str
    recipients: set[int]
    tripped: bool = False


class PermanentStreaks:
    """The same permanent error for ``threshold`` sends in a row, to different recipients of
    one instance: the configuration is wrong (a changed API version, a body the gateway no
    longer takes), not the messages.

    Sans-IO. :meth:`observe` is told every permanent failure of a send and returns the
    :class:`~streams.kernel.errors.GatewayMisconfigured` to pause the instance with once the streak
    reaches ``threshold`` (and for every same failure after it, probes included), else
    None: the job is FAILED as usual, so the first ``threshold - 1`` of a streak are
    FAILED (an operator reprocesses them) and the ``threshold``-th and later wait.

    Not counted, and ending the streak: an error about the recipient or a resource
    (``invalid recipient``, ``number not on WhatsApp``: a bad list is not a bad
    configuration), a different error, or a success (:meth:`reset`). The same recipient
    twice counts once. Errors are compared with their digits blanked (masked numbers
    and ids differ between messages). ``threshold`` 0 switches it off.
    """

    def __init__(self, threshold: int = 5, *, setting: str = "the gateway settings") -> None:
        self.threshold = threshold
        self.setting = setting
        """What the pause's ERROR line says to check (the gateway's base URL setting)."""
        self._streaks: dict[str, _Streak] = {}

    def observe(
        self, instance: str, recipient: str, error: PermanentGatewayError
    ) -> GatewayMisconfigured | None:
        if self.threshold <= 0:
            return None
        reason = str(error)
        if names_a_resource(reason):
            self._streaks.pop(instance, None)
            return None
        signature = f"{error.status_code}|{_DIGITS.sub('#', reason)}"
        streak = self._streaks.get(instance)
        if streak is None or streak.signature != signature:
            streak = _Streak(signature, set())
            self._streaks[instance] = streak
        streak.recipients.add(hash(recipient))
        if not streak.tripped and len(streak.recipients) < self.threshold:
            return None
        streak.tripped = True
        return GatewayMisconfigured(
            f"the same permanent error for {len(streak.recipients)} sends in a row to "
            f"different recipients, so not the messages' fault: {reason}",
            setting=self.setting,
            status_code=error.status_code,
        )

    def reset(self, instance: str) -> None:
        """A send of the instance was accepted: any streak ends."""
        self._streaks.pop(instance, None)
