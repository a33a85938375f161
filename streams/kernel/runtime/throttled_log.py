"""Log lines rate-limited per kind: the first at once, then at most one per window with a count.

Bad input arrives in floods (a scanner hammering the webhook, a gateway replaying receipts):
each item is counted in a metric by its caller, and :class:`ThrottledLog` writes the first
line of each kind at once, then at most one per ``window_s`` saying how many more there were.
Callers pass what may be logged only: never a body, a number, a text, a secret or a
signature.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

WINDOW_S = 60.0
"""At most one line per kind in this many seconds."""
MAX_KINDS = 256
"""Kinds tracked at most (a handful in practice; this only bounds memory)."""


class ThrottledLog:
    """Lines at ``level`` on ``logger``, rate-limited per kind."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        level: int = logging.WARNING,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._level = level
        self._window_s = window_s
        self._clock = clock
        self._kinds: dict[Hashable, tuple[float, int]] = {}
        """Per kind: when its last line was written, and items since (not logged)."""

    def note(self, kind: Hashable, message: str) -> bool:
        """Note one item of ``kind``; log ``message`` when the kind was quiet for a window
        (True: logged), followed by how many more came since its last line."""
        now = self._clock()
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
        self._log.log(self._level, "%s%s", message, more)
        self._kinds[kind] = (now, 0)
        return True
