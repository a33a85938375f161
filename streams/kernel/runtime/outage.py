"""An outage of one dependency, logged once when it starts and once when it ends.

Every edge retries a dependency that is away (PostgreSQL, Kafka, a gateway, a metrics
endpoint) for as long as the outage lasts; the operator reads two lines, not one per
attempt. The attempts in between are counted (``attempts``, ``on_failed`` for a metric).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class OutageLog:
    """Logs an outage once when it starts (WARNING) and once when it ends (INFO).

    ``failed()`` on every failed attempt, ``recovered()`` after every success. ``retrying``
    words what is retried (the relay reconnects, the sink retries its batch);
    ``on_failed``/``on_start``/``on_end`` keep the caller's metrics (``on_end`` gets the
    outage's length in seconds).

    ``quiet()``, when given and true at an outage's start, means another line already says
    it (the process's own Kafka outage line, :mod:`streams.kernel.kafka_outage`): the outage
    is tracked and counted but neither of its lines is written. ``flap_window_s``: a new
    failure this soon after a recovery continues the same outage without a new line (one
    broker of a cluster down makes a client meet it now and then while others answer).
    """

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        *,
        retrying: str = "retrying with backoff",
        on_failed: Callable[[], None] | None = None,
        on_start: Callable[[], None] | None = None,
        on_end: Callable[[float], None] | None = None,
        quiet: Callable[[], bool] | None = None,
        flap_window_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self._log = logger
        self._retrying = retrying
        self._on_failed = on_failed
        self._on_start = on_start
        self._on_end = on_end
        self._quiet = quiet
        self._flap_window_s = flap_window_s
        self._clock = clock
        self._since: float | None = None
        self._silent = False
        self._shared = False  # share_one_line: a quiet start may be announced later
        self._recovered_at: float | None = None
        self.attempts = 0
        self.outages = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def _covers(self, window_s: float) -> bool:
        """Ongoing, or its recovery line is less than ``window_s`` old."""
        if self._since is not None:
            return True
        return self._recovered_at is not None and self._clock() - self._recovered_at < window_s

    def failed(self, reason: str | BaseException, delay_s: float | None = None) -> None:
        """One failed attempt; the first of an outage is logged (``reason``: one line, masked)."""
        self.attempts += 1
        if self._on_failed is not None:
            self._on_failed()
        if self._since is not None:
            if self._silent and self._shared and not (self._quiet is not None and self._quiet()):
                # It started quiet while a sibling's line said it; that outage has ended and
                # this one goes on: an operator must still hear of it.
                self._silent = False
                self._log.warning(
                    "%s unavailable for %.0fs, %s: %s",
                    self.what,
                    self._clock() - self._since,
                    self._retrying,
                    _one_line(reason),
                )
            return
        self._since = self._clock()
        self.outages += 1
        if self._on_start is not None:
            self._on_start()
        flapping = (
            self._recovered_at is not None
            and self._since - self._recovered_at < self._flap_window_s
        )
        self._silent = flapping or (self._quiet is not None and self._quiet())
        if self._silent:
            return
        text = _one_line(reason)
        when = "" if delay_s is None else f" (next try in {delay_s:.1f}s)"
        self._log.warning("%s unavailable, %s%s: %s", self.what, self._retrying, when, text)

    def recovered(self) -> None:
        """A success: ends the outage, if one was going on, with its length and attempts."""
        if self._since is None:
            return
        now = self._clock()
        took = now - self._since
        if self._on_end is not None:
            self._on_end(took)
        if not self._silent:
            self._log.info(
                "%s available again after %.1fs and %d failed attempts",
                self.what,
                took,
                self.attempts,
            )
            self._recovered_at = now
        self._since = None
        self._silent = False
        self.attempts = 0


def _one_line(reason: str | BaseException) -> str:
    return reason if isinstance(reason, str) else (str(reason) or type(reason).__name__)


def share_one_line(*outages: OutageLog, window_s: float = 60.0) -> None:
    """Outages of one dependency that several parts of a process meet: one pair of lines.

    The relay's replication connection, its slot metrics and its scheduled release all lose
    PostgreSQL when it dies or fails over; whichever notices first writes the lines. Another
    starting while it is ongoing, or within ``window_s`` of its end (a connection that sat idle
    through the outage fails at its next use), is counted but quiet (as with ``quiet``). A
    quiet one that outlasts them (every other over for ``window_s``) is announced at its next
    failed attempt, with how long it has lasted, and its end is logged too.
    """
    for outage in outages:
        others = [other for other in outages if other is not outage]
        own = outage._quiet

        def quiet(others: list[OutageLog] = others, own: Callable[[], bool] | None = own) -> bool:
            return any(other._covers(window_s) for other in others) or (own is not None and own())

        outage._quiet = quiet
        outage._shared = True
