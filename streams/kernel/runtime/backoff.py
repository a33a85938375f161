"""Capped exponential backoff with jitter: the one retry schedule of every edge."""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(slots=True)
class Backoff:
    """``initial_s`` doubling up to ``max_s``; each wait is uniform in [cap/2, cap].

    The jitter spreads the retries of many clients of one peer (every worker meeting the
    same gateway outage) so they do not arrive together when it comes back. ``jitter=False``
    waits the cap itself (a process's own timer, which no other client shares).
    """

    initial_s: float = 0.5
    max_s: float = 10.0
    rng: random.Random = dataclasses.field(default_factory=random.Random)
    jitter: bool = True
    _next_s: float = 0.0

    def __post_init__(self) -> None:
        self._next_s = self.initial_s

    def next_delay_s(self) -> float:
        """The wait before the next attempt: uniform in [cap/2, cap], then the cap doubles."""
        cap = self._next_s
        self._next_s = min(self.max_s, self._next_s * 2)
        return self.rng.uniform(cap / 2, cap) if self.jitter else cap

    def reset(self) -> None:
        self._next_s = self.initial_s
