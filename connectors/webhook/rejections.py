"""Refused callbacks, logged at most once per window with a count (never one line each).

A misconfigured gateway or a scanner can send thousands of bad requests a minute; each
refusal is counted in :data:`connectors.webhook.metrics.REJECTED` (or ``UNBOUND``), and
logged by :class:`RejectionLog`: the first of each kind at once, then at most one line
per ``window_s`` saying how many more there were. Lines carry the gateway, the reason
and sizes; never a body, a number, a text, a secret or a signature.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

WINDOW_S = 60.0
"""At most one line per kind of refusal in this many seconds."""
MAX_KINDS = 256
"""Kinds tracked at most (gateway x reason is a handful; this only bounds memory)."""


class RejectionLog:
    """WARNING lines about refused callbacks, rate-limited per ``(gateway, reason)``."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._window_s = window_s
        self._clock = clock
        self._kinds: dict[tuple[str, str], tuple[float, int]] = {}
        """Per kind: when its last line was written, and refusals since (not logged)."""

    def refused(self, gateway: str, reason: str, detail: str) -> bool:
        """Note one refusal; log it when its kind was quiet for a window (True: logged)."""
        now = self._clock()
        kind = (gateway, reason)
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self._window_s:
            self._kinds[kind] = (last[0], last[1] + 1)
            return False
        if last is None and len(self._kinds) >= MAX_KINDS:
            self._kinds.pop(next(iter(self._kinds)))
        suppressed = last[1] if last is not None else 0
        more = (
            f" (and {suppressed} more like it in the last {self._window_s:.0f}s)"
            if suppressed
            else ""
        )
        self._log.warning("refused %s callback: %s: %s%s", gateway, reason, detail, more)
        self._kinds[kind] = (now, 0)
        return True
