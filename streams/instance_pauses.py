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

Sans-IO: every method takes ``now`` in epoch seconds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from streams import metrics
from streams.errors import GatewayError

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class _Pause:
    since: float
    status_code: int | None
    reason: str
    next_probe_at: float
    last_reminder: float
    probes: int = 0


class InstancePauses:
    """Which instances of this worker are paused, and when each is probed next."""

    def __init__(
        self,
        probe_interval_s: float = 30.0,
        *,
        reminder_interval_s: float = 300.0,
        release_window_s: float | None = None,
    ) -> None:
        self.probe_interval_s = probe_interval_s
        self.reminder_interval_s = reminder_interval_s
        self.release_window_s = (
            release_window_s if release_window_s is not None else 2 * probe_interval_s
        )
        self.waiting: Callable[[str], int] = lambda instance: 0
        """Jobs parked for an instance (set by the dispatcher, which owns the parking lot)."""
        self._paused: dict[str, _Pause] = {}
        self._resumed: dict[str, float] = {}

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
            pause = _Pause(
                since=now,
                status_code=error.status_code,
                reason=_why(error),
                next_probe_at=now + self.probe_interval_s,
                last_reminder=now,
            )
            self._paused[instance] = pause
            self._resumed.pop(instance, None)
            metrics.INSTANCE_PAUSED.labels(instance).set(1)
            waiting = self.waiting(instance) + (0 if parked else 1)
            log.error(
                "instance %s paused: %s; %d jobs waiting; probing every %.0fs",
                instance,
                pause.reason,
                waiting,
                self.probe_interval_s,
            )
            return pause.next_probe_at
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
        pause.next_probe_at = now + self.probe_interval_s
        pause.probes += 1
        return True

    def resume(self, instance: str, now: float) -> bool:
        """The gateway took a request of the instance again; True when it was paused."""
        pause = self._paused.pop(instance, None)
        if pause is None:
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
        return True

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
    if code in (401, 403):
        return f"gateway refused credentials ({code})"
    if code == 404:
        return "gateway does not know the instance (404)"
    if "disconnected" in str(error):
        return f"gateway says the instance is disconnected ({code})"
    if error.scope != "instance":
        return f"failing in a row, last: {error}"
    return f"gateway refused the instance ({code or type(error).__name__})"
