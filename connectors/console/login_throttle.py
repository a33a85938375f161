"""Failed logins: slowed down per client address and overall, counted, logged once a minute.

Every token check counts: the login form and an ``Authorization: Bearer`` header alike.
Before a token is checked, :meth:`LoginThrottle.wait_s` says whether the client must wait;
while it must, the console answers 429 with ``Retry-After`` *without checking the token*
(a right token is refused too, so the answer never tells a guesser anything).

- Per client address (the TCP peer; behind a proxy that is the proxy, so this becomes
  a second overall limit): after the n-th consecutive failure the address waits
  ``BASE_DELAY_S * 2**(n-1)`` seconds, at most :data:`MAX_DELAY_S`. A success, or
  :data:`FORGET_AFTER_S` without a failure, starts it over.
- Overall: a bucket of :data:`GLOBAL_BURST` failures that refills at
  :data:`GLOBAL_PER_S` a second; empty, every login waits (guesses spread over many
  addresses). Open sessions keep working meanwhile.

So 300 wrong tokens from one address take hours, not milliseconds. Failures are counted in
``zapstream_console_failed_logins_total`` and logged at most once per
:data:`LOG_WINDOW_S` with their count, the number of addresses and the latest one, never
a token. The clock is injected (monotonic seconds).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable

from prometheus_client import Counter

from connectors.console.log_text import loggable

__all__ = [
    "BASE_DELAY_S",
    "FAILED_LOGINS",
    "FORGET_AFTER_S",
    "GLOBAL_BURST",
    "GLOBAL_PER_S",
    "LOG_WINDOW_S",
    "MAX_DELAY_S",
    "LoginThrottle",
]

log = logging.getLogger("zapstream.console")

BASE_DELAY_S = 1.0
"""The wait after an address's first failure; it doubles with each further one."""
MAX_DELAY_S = 60.0
"""The longest wait between two tries of one address."""
FORGET_AFTER_S = 900.0
"""An address without a failure for this long starts over."""
GLOBAL_BURST = 30
"""Failures from all addresses together that may come at once."""
GLOBAL_PER_S = 1.0
"""Failures per second from all addresses together, after the burst."""
LOG_WINDOW_S = 60.0
"""At most one failed-login line per this many seconds."""
MAX_ADDRESSES = 10_000
"""Addresses remembered at most (the oldest are forgotten first)."""

FAILED_LOGINS = Counter(
    "zapstream_console_failed_logins_total",
    "Console logins refused: a wrong token (refused) or a try while throttled (throttled); "
    "the login form and Bearer headers alike",
    ["outcome"],
)


@dataclasses.dataclass(slots=True)
class _Address:
    failures: int
    last: float
    until: float


class LoginThrottle:
    """Decides whether a token may be checked now, and records what the check said."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._addresses: dict[str, _Address] = {}
        self._bucket = float(GLOBAL_BURST)
        self._filled_at = clock()
        # The failures since the last line: how many, from where.
        self._unlogged = 0
        self._from: set[str] = set()
        self._latest = ""
        self._next_line_at = -math.inf

    def wait_s(self, address: str) -> float | None:
        """Seconds ``address`` must still wait before a token of its may be checked; None
        when it may be checked now. A refusal is counted (and logged) as a failure."""
        now = self._clock()
        self._refill(now)
        seen = self._addresses.get(address)
        wait = 0.0
        if seen is not None and seen.until > now:
            wait = seen.until - now
        if self._bucket < 1.0:
            wait = max(wait, (1.0 - self._bucket) / GLOBAL_PER_S)
        if wait <= 0:
            return None
        FAILED_LOGINS.labels("throttled").inc()
        self._note(address, now)
        return wait

    def failed(self, address: str) -> None:
        """A wrong token from ``address``: it waits longer, and so does everyone a little."""
        now = self._clock()
        self._refill(now)
        self._bucket = max(0.0, self._bucket - 1.0)
        seen = self._addresses.get(address)
        if seen is None or now - seen.last >= FORGET_AFTER_S:
            self._remember(address, now)
            seen = self._addresses[address]
        seen.failures += 1
        seen.last = now
        seen.until = now + min(MAX_DELAY_S, BASE_DELAY_S * 2 ** min(seen.failures - 1, 32))
        FAILED_LOGINS.labels("refused").inc()
        self._note(address, now)

    def succeeded(self, address: str) -> None:
        """A right token from ``address``: its count starts over."""
        self._addresses.pop(address, None)

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._filled_at)
        self._bucket = min(float(GLOBAL_BURST), self._bucket + elapsed * GLOBAL_PER_S)
        self._filled_at = now

    def _remember(self, address: str, now: float) -> None:
        if len(self._addresses) >= MAX_ADDRESSES:
            for key in [k for k, a in self._addresses.items() if now - a.last >= FORGET_AFTER_S]:
                del self._addresses[key]
        while len(self._addresses) >= MAX_ADDRESSES:
            del self._addresses[min(self._addresses, key=lambda k: self._addresses[k].last)]
        self._addresses[address] = _Address(failures=0, last=now, until=now)

    def _note(self, address: str, now: float) -> None:
        """Count a failure for the log; write the line when the window allows one."""
        self._unlogged += 1
        if len(self._from) < MAX_ADDRESSES:
            self._from.add(address)
        self._latest = address
        if now < self._next_line_at:
            return
        log.warning(
            "console: %d failed login(s) from %d address(es), the latest from %s; logins are "
            "throttled (next such line in %ds at the earliest)",
            self._unlogged,
            len(self._from),
            loggable(self._latest),
            int(LOG_WINDOW_S),
        )
        self._unlogged = 0
        self._from.clear()
        self._next_line_at = now + LOG_WINDOW_S
