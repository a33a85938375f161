"""Paused templates: hold a template's jobs while Meta has it paused, re-check it now and then.

Meta pauses a template whose quality dropped (error 132015: 3 hours the first time, 6 the
second; a third time it is disabled, 132016, which fails its jobs). The pause is Meta's and
lifts by itself, so there is nothing for an operator to resume: the worker holds the
template's jobs like a paused instance's and finds out when it works again.

- The first 132015 pauses the pair (instance, ``name/language``): that job's attempt is
  given back (nothing was sent) and it waits in RETRY_WAIT, its reason naming the template
  and the next re-check, its conversation parked (:mod:`streams.parking`).
- Further jobs of the pair wait unchanged (PENDING), parked until the next re-check,
  without calling Meta. Other templates and plain texts of the instance go on.
- Every ``recheck_interval_s`` one job of the pair is let through as the *re-check*; while
  it is in flight the others wait ``PROBE_WAIT_S`` more. Accepted: the pause ends (one
  INFO line) and the rest follow. 132015 again: paused until the next re-check. Another
  permanent answer ends the pause too (the job's own outcome applies); a transient one
  leaves it paused (the others wait for the next re-check).
- ``expires_at`` still bounds every held job: an expired one ends EXPIRED, never sent.

One WARNING per pause, one INFO when it ends; ``zapstream_template_paused{instance,
template}`` is 1 meanwhile. In memory, per worker, like :mod:`streams.instance_pauses`:
after a restart the pause is learnt again from the next 132015 (the held jobs are durable).

Sans-IO: every method takes ``now`` in epoch seconds.
"""

from __future__ import annotations

import dataclasses
import logging

from prometheus_client import Gauge

log = logging.getLogger(__name__)

PROBE_WAIT_S = 5.0
"""How long a held job waits while the template's re-check is in flight."""
PROBE_BOUND_S = 60.0
"""A re-check with no answer after this long (its worker died, or a transient failure):
the others wait for the next re-check instead."""
DEFAULT_RECHECK_S = 600.0
"""Between re-checks of a paused template (Meta pauses for hours)."""

TEMPLATE_PAUSED = Gauge(
    "zapstream_template_paused",
    "1 while Meta has a template paused (132015) and the worker holds its jobs",
    ["instance", "template"],
)


@dataclasses.dataclass(slots=True)
class _Pause:
    since: float
    reason: str
    next_check_at: float
    checking_until: float = 0.0
    """While a re-check is in flight (until this time at most), the others wait briefly."""


class TemplatePauses:
    """Which (instance, template) pairs are paused, and when each is re-checked."""

    def __init__(self, recheck_interval_s: float = DEFAULT_RECHECK_S) -> None:
        self.recheck_interval_s = recheck_interval_s
        self._paused: dict[tuple[str, str], _Pause] = {}

    def paused(self) -> list[tuple[str, str]]:
        """The paused (instance, ``name/language``) pairs."""
        return list(self._paused)

    def pause(self, instance: str, template: str, reason: str, now: float) -> float:
        """Meta answered 132015: returns when the job that met it is due (the next re-check)."""
        key = (instance, template)
        pause = self._paused.get(key)
        if pause is None:
            pause = self._paused[key] = _Pause(now, reason, now + self.recheck_interval_s)
            TEMPLATE_PAUSED.labels(instance, template).set(1)
            log.warning(
                "instance %s: template %s paused by Meta (132015); its jobs wait, re-checked "
                "every %.0fs",
                instance,
                template,
                self.recheck_interval_s,
            )
        else:
            pause.next_check_at = now + self.recheck_interval_s
        pause.checking_until = 0.0
        return pause.next_check_at

    def hold(self, instance: str, template: str, now: float) -> float | None:
        """None: send (the pair is not paused, or this job is its re-check); else the time
        the job is due again."""
        pause = self._paused.get((instance, template))
        if pause is None:
            return None
        if now < pause.checking_until:
            return now + PROBE_WAIT_S
        if now >= pause.next_check_at:
            # This job is the re-check; the others wait for its answer (bounded).
            pause.checking_until = now + min(PROBE_BOUND_S, self.recheck_interval_s)
            pause.next_check_at = now + self.recheck_interval_s
            return None
        return pause.next_check_at

    def resume(self, instance: str, template: str, now: float) -> bool:
        """Meta answered a send of the pair with anything but 132015; True when it was paused."""
        pause = self._paused.pop((instance, template), None)
        if pause is None:
            return False
        TEMPLATE_PAUSED.labels(instance, template).set(0)
        log.info(
            "instance %s: template %s works again after %.0fs paused; its jobs follow",
            instance,
            template,
            now - pause.since,
        )
        return True
