"""Gateway failures made visible: one line when a failure class starts, counts while it lasts.

A worker sending thousands of messages must not log one line per failed
message, nor stay silent. :class:`FailureLog` keys failures by instance and
failure class (``transient HTTP 503``, ``uncertain``, ``permanent HTTP 400``,
``instance HTTP 401`` ...):

- the first failure of a class for an instance logs one WARNING with its detail;
- while the class keeps failing, a summary with the count is logged at most
  every ``summary_interval_s`` (5 minutes by default);
- an outage ends with one INFO line giving the duration and the count, at the
  first success for the instance that comes at least ``quiet_period_s`` after
  the class's last failure. A failure that recurs sooner (a flapping gateway:
  one send fails, the next succeeds, the next fails) continues the same outage:
  no new "started" line, no "ended after 0s" line.

Every failure is counted in ``zapstream_gateway_errors_total{instance,class}``
(class: ``transient``, ``uncertain``, ``permanent`` or ``instance``). Details
come from the gateway error tree, which masks phone numbers and redacts message
texts and keys at the edge (:mod:`connectors.gateways.classify`); nothing here
adds any.
"""

from __future__ import annotations

import dataclasses
import logging

from streams import metrics
from streams.kernel.errors import GatewayError, PermanentGatewayError, UncertainGatewayError

log = logging.getLogger(__name__)

MAX_DETAIL_CHARS = 240


def error_class(exc: GatewayError) -> str:
    """The metric label of a classified failure."""
    if exc.scope == "instance":
        return "instance"
    if isinstance(exc, PermanentGatewayError):
        return "permanent"
    if isinstance(exc, UncertainGatewayError):
        return "uncertain"
    return "transient"


@dataclasses.dataclass(slots=True)
class _Open:
    started: float
    count: int
    last_summary: float
    since_summary: int
    last_detail: str
    last_failure: float


class FailureLog:
    """Rate-limited, per-instance logging of gateway failure classes (sans-IO: pass ``now``)."""

    def __init__(self, *, summary_interval_s: float = 300.0, quiet_period_s: float = 60.0) -> None:
        self.summary_interval_s = summary_interval_s
        self.quiet_period_s = quiet_period_s
        """How long a class must stay free of failures before a success ends its outage."""
        self._open: dict[tuple[str, str], _Open] = {}

    def record(self, instance: str, exc: GatewayError, now: float) -> None:
        """Count one failure; log it when its class is new for the instance, or a summary."""
        cls = error_class(exc)
        metrics.GATEWAY_ERRORS.labels(instance, cls).inc()
        kind = f"{cls} HTTP {exc.status_code}" if exc.status_code else cls
        detail = str(exc)[:MAX_DETAIL_CHARS]
        key = (instance, kind)
        entry = self._open.get(key)
        if entry is None:
            self._open[key] = _Open(now, 1, now, 0, detail, now)
            log.warning("instance %s: gateway failures started (%s): %s", instance, kind, detail)
            return
        entry.count += 1
        entry.since_summary += 1
        entry.last_detail = detail
        entry.last_failure = now
        if now - entry.last_summary >= self.summary_interval_s:
            log.warning(
                "instance %s: %d more %s failures in the last %.0fs (%d since %.0fs ago); last: %s",
                instance,
                entry.since_summary,
                kind,
                now - entry.last_summary,
                entry.count,
                now - entry.started,
                detail,
            )
            entry.last_summary = now
            entry.since_summary = 0

    def record_success(self, instance: str, now: float) -> None:
        """The instance works: close its failure classes quiet for ``quiet_period_s``."""
        if not self._open:
            return
        for key in [k for k in self._open if k[0] == instance]:
            entry = self._open[key]
            if now - entry.last_failure < self.quiet_period_s:
                continue  # a recurrence now would continue this outage
            del self._open[key]
            log.info(
                "instance %s: %s failures ended after %.0fs: %d in all",
                instance,
                key[1],
                entry.last_failure - entry.started,
                entry.count,
            )

    def open_classes(self, instance: str) -> dict[str, int]:
        """Failure classes still open for the instance, with their counts."""
        return {k[1]: e.count for k, e in self._open.items() if k[0] == instance}
