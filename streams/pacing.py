"""Pacing per WhatsApp instance and per recipient: token buckets, AIMD on rate limits.

A WhatsApp number is the scarce resource. Every lane of an instance draws its
sends from one token bucket per instance in this worker (:class:`Pacer`):

- **Configured rate**: ``rate_per_s`` and ``burst`` per instance (a default and
  overrides, ``ZAPSTREAM_WORKER_INSTANCE_RATES``); 0 means the gateway's own limit
  is the only one. With several workers, each holds the share of the rate that
  matches the share of the partitions it owns: an instance's conversations are
  spread over every partition by the conversation key's hash, so a worker owning
  4 of 8 partitions sees about half of the instance's traffic and gets half of its
  rate (and of its burst, at least one). The shares add up to the configured rate.
- **Rate limited** (HTTP 429, Meta 130429): the instance waits for ``Retry-After``
  (or ``min_block_s``), its bucket empties to a single token and its rate is
  halved (from the configured rate, or from the rate it was actually sending at
  when none is configured), unless it was sending at under half its reduced rate
  (the single probe after a block meeting the same refusal: only the wait
  repeats); every second without another limit it grows back by
  ``increase_factor`` (2: doubling, as TCP's slow start), and once it reaches the
  ceiling (the configured rate, or ``unlimited_after`` times the rate it ran at
  before) the reduction ends: an instance without a configured rate is unlimited
  again. A short
  ``Retry-After`` is a short wait, never the failure schedule.
- **Slow start** after an instance comes back from a pause (:mod:`streams.instance_pauses`):
  the same reduced rate, growing back, so a backlog does not hit the gateway at once.
- **Priority**: an instance's operational messages take tokens before its bulk
  messages: a bulk send waits while an operational one waits for the same instance.
- **Per recipient** (the conversation: a business-number/user pair): at most one
  message per ``recipient_interval_s`` with ``recipient_burst``, when configured
  (Meta documents about one per 6 s per pair); a recipient limit (Meta 131056)
  backs the pair off ``4**n`` seconds (``n`` = limits in a row, capped).

Sans-IO apart from :meth:`Pacer.acquire`, which sleeps; every decision takes
``now`` (monotonic seconds).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable, Mapping

from prometheus_client import Counter, Gauge

PACED_WAIT = Counter(
    "zapstream_pacing_wait_seconds_total",
    "Seconds sends waited for their instance's or recipient's token, by priority",
    ["priority"],
)
RATE_LIMITED = Counter(
    "zapstream_rate_limited_total",
    "Rate-limit answers from the gateway, by instance and limit (instance, recipient)",
    ["instance", "limit"],
)
INSTANCE_RATE = Gauge(
    "zapstream_instance_rate_per_second",
    "The send rate this worker currently allows an instance (after its share and any "
    "rate-limit reduction); absent while unlimited",
    ["instance"],
)

OPERATIONAL = "operational"


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """A configured send rate. ``rate_per_s`` 0: no limit of ours."""

    rate_per_s: float = 0.0
    burst: float = 1.0


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` stored; sans-IO."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self.tokens = self.burst
        self.updated = now

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def wait_s(self, now: float) -> float:
        """Seconds until a token is there (0: one is there now)."""
        self._refill(now)
        if self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) / self.rate if self.rate > 0 else float("inf")

    def take(self, now: float) -> None:
        self._refill(now)
        self.tokens -= 1.0

    def retune(self, rate: float, burst: float, now: float) -> None:
        """A new rate and burst from ``now`` on; stored tokens above the burst go."""
        self._refill(now)
        self.rate, self.burst = rate, max(burst, 1.0)
        self.tokens = min(self.tokens, self.burst)

    def empty(self, now: float) -> None:
        self._refill(now)
        self.tokens = min(self.tokens, 0.0)


class _Instance:
    """One instance's pacing state in this worker."""

    def __init__(self, now: float) -> None:
        self.bucket: TokenBucket | None = None
        """None: no limit of ours (neither configured nor learnt from a rate limit)."""
        self.reduced: float | None = None
        """The rate after a rate limit or a pause (before the share); grows back."""
        self.ceiling: float = 0.0
        self.blocked_until = 0.0
        self.grown_at = now
        self.sent: collections.deque[float] = collections.deque()
        """Send times of the last second: the rate the instance actually ran at."""
        self.operational_waiting = 0
        self.gate_sent: collections.deque[float] = collections.deque()
        """Request times of the last second, at the gate (see :meth:`Pacer.reserve_send`)."""
        self.gate_turn = asyncio.Lock()
        """Whose turn it is at the gate: requests go through it one at a time, in order."""
        self.turns = (asyncio.Lock(), asyncio.Lock())
        """Whose turn it is to wait for this instance's token: (bulk, operational)."""
        self.exported_rate = 0.0
        self.busy_rate = 0.0
        """Sends in the second before this worker's latest send: the rate the instance ran
        at before a pause or a rate limit (kept while nothing is sent)."""

    def turn(self, operational: bool) -> asyncio.Lock:
        return self.turns[1 if operational else 0]


class _Recipient:
    def __init__(self, interval_s: float, burst: float, now: float) -> None:
        self.bucket = TokenBucket(1.0 / interval_s, burst, now)
        self.blocked_until = 0.0
        self.limits_in_a_row = 0


class Pacer:
    """The token buckets of every instance and recipient this worker sends for."""

    def __init__(
        self,
        default: Limit = Limit(),
        overrides: Mapping[str, Limit] | None = None,
        *,
        share: Callable[[], float] = lambda: 1.0,
        min_rate_per_s: float = 0.5,
        min_block_s: float = 1.0,
        increase_factor: float = 2.0,
        unlimited_after: float = 4.0,
        recipient_interval_s: float = 0.0,
        recipient_burst: float = 1.0,
        recipient_backoff_cap_s: float = 256.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default = default
        self.overrides = dict(overrides or {})
        self.share = share
        self.min_rate_per_s = min_rate_per_s
        self.min_block_s = min_block_s
        self.increase_factor = increase_factor
        self.unlimited_after = unlimited_after
        self.recipient_interval_s = recipient_interval_s
        self.recipient_burst = recipient_burst
        self.recipient_backoff_cap_s = recipient_backoff_cap_s
        self.clock = clock
        self._instances: dict[str, _Instance] = {}
        self._recipients: dict[tuple[str, str], _Recipient] = {}
        self._pruned_at = clock()

    # --- decisions (sans-IO) ----------------------------------------------------------

    def limit(self, instance: str) -> Limit:
        return self.overrides.get(instance, self.default)

    def wait_s(self, instance: str, recipient: str, priority: str, now: float) -> float:
        """Seconds until ``instance`` and ``recipient`` may send (0: now)."""
        state = self._state(instance, now)
        wait = max(0.0, state.blocked_until - now)
        if priority != OPERATIONAL and state.operational_waiting:
            # Operational sends of the instance go first; look again shortly.
            wait = max(wait, 0.01)
        if state.bucket is not None:
            wait = max(wait, state.bucket.wait_s(max(now, state.blocked_until)))
        return max(wait, self._recipient_wait(instance, recipient, now))

    def _recipient_wait(self, instance: str, recipient: str, now: float) -> float:
        """Seconds until ``recipient`` of ``instance`` may receive again (0: now)."""
        pair = self._recipient(instance, recipient, now)
        if pair is None:
            return 0.0
        return max(0.0, pair.blocked_until - now, pair.bucket.wait_s(now))

    def take(self, instance: str, recipient: str, now: float) -> None:
        """Spend the tokens of one send (after :meth:`wait_s` said 0)."""
        state = self._state(instance, now)
        if state.bucket is not None:
            state.bucket.take(now)
        state.sent.append(now)
        while state.sent and state.sent[0] < now - 1.0:
            state.sent.popleft()
        state.busy_rate = float(len(state.sent))
        pair = self._recipient(instance, recipient, now)
        if pair is not None:
            pair.bucket.take(now)
            if now - self._pruned_at > 60.0:
                self._prune(now)

    def on_sent(self, instance: str, recipient: str, now: float) -> None:
        """The gateway took a message: the recipient's run of limits ends."""
        pair = self._recipients.get((instance, recipient))
        if pair is not None:
            pair.limits_in_a_row = 0

    def on_rate_limited(
        self, instance: str, recipient: str, limit: str, retry_after_s: float | None, now: float
    ) -> float:
        """A rate-limit answer; returns the delay until the refused message may go again."""
        RATE_LIMITED.labels(instance, limit).inc()
        if limit == "recipient":
            pair = self._recipient(instance, recipient, now, create=True)
            assert pair is not None
            pair.limits_in_a_row += 1
            backoff = min(4.0**pair.limits_in_a_row, self.recipient_backoff_cap_s)
            delay = max(retry_after_s or 0.0, backoff)
            pair.blocked_until = max(pair.blocked_until, now + delay)
            pair.bucket.empty(now)
            return delay
        state = self._state(instance, now)
        delay = max(retry_after_s or 0.0, self.min_block_s)
        state.blocked_until = max(state.blocked_until, now + delay)
        if state.reduced is None or state.busy_rate >= 0.5 * state.reduced * self.share():
            self._reduce(instance, state, now)
        else:
            # A limit while we send below the reduced rate (the probe after a block) says
            # the gateway still refuses, not that we are too fast: wait, keep the rate.
            self._apply(instance, state, now, empty=True)
        return delay

    def slow_start(self, instance: str, now: float) -> None:
        """The instance is back from a pause: start low and grow, like after a rate limit."""
        self._reduce(instance, self._state(instance, now), now)

    # --- sleeping ---------------------------------------------------------------------

    async def acquire(
        self, instance: str, recipient: str, priority: str, *, max_wait_s: float
    ) -> float:
        """Wait for a token, up to ``max_wait_s``; returns 0 when taken, else the wait left.

        A caller given a non-zero answer holds nothing: it parks the message and asks
        again when it is due.

        Waiters take turns: first the recipient's own interval (only its conversation
        waits for it), then the instance's token, where one waiter per instance and
        priority watches the bucket and the others wait for their turn. Each waiter
        polling the bucket on its own made a herd: 128 bulk sends of one instance paced
        at 50/s woke about 10,000 times a second, and every event the worker read waited
        behind that loop (measured: 4 ms per event, operational messages held up to 18 s
        behind a campaign's intake).
        """
        operational = priority == OPERATIONAL
        start = self.clock()
        state = self._state(instance, start)
        if (
            not state.turn(operational).locked()
            and self.wait_s(instance, recipient, priority, start) <= 0
        ):
            # Nobody of this instance and priority is waiting, and the tokens are there:
            # what the turns below would come to, without their lock and timeout (most
            # sends, and each of those cost as much as the rest of the decision).
            self.take(instance, recipient, start)
            return 0.0
        if operational:
            state.operational_waiting += 1
        try:
            while (wait := self._recipient_wait(instance, recipient, self.clock())) > 0:
                if self.clock() - start + wait > max_wait_s:
                    return wait
                await self._sleep(wait, priority)
            turn = state.turn(operational)
            try:
                left = max_wait_s - (self.clock() - start)
                async with asyncio.timeout(max(left, 0.0)):
                    await turn.acquire()
            except TimeoutError:
                # Others of this instance are ahead: come back when they may have gone.
                return max(self.wait_s(instance, recipient, priority, self.clock()), 0.05)
            try:
                while True:
                    now = self.clock()
                    wait = self.wait_s(instance, recipient, priority, now)
                    if wait <= 0:
                        self.take(instance, recipient, now)
                        return 0.0
                    if now - start + wait > max_wait_s:
                        return wait
                    await self._sleep(wait, priority)
            finally:
                turn.release()
        finally:
            if operational:
                state.operational_waiting -= 1

    def reserve_send(self, instance: str, now: float) -> float:
        """Seconds until this request may go out; 0: it goes now, and is counted (else
        nothing is counted: ask again then).

        :meth:`acquire` decides when a send may start; the attempt's journal write comes
        between that and the request, and it takes longer for some sends than for others.
        Their requests would bunch, and the gateway would see more than the rate in some
        second (measured: 59 in a second at 50/s with a burst of 5). The gate counts the
        requests of the last second when each really goes, and lets one go while fewer
        than ``rate`` + ``burst`` went: the gateway never sees more in any second.

        Two gates that were tried and measured (Apache Kafka, the campaign test, 50/s
        with a burst of 5): slots reserved ahead and slept for let every sender whose
        slot passed while the event loop was busy go at once (57-65 in a second); a
        token bucket in series, taken at the request, lost tokens whenever the loop was
        busy and never caught up, so the sends the journal writes had bunched queued
        behind it for good (operational messages 380-720 ms behind a campaign's sends
        instead of about 100 ms).
        """
        state = self._instances.get(instance)
        bucket = state.bucket if state is not None else None
        if state is None or bucket is None:
            return 0.0
        sent = state.gate_sent
        while sent and sent[0] <= now - 1.0:
            sent.popleft()
        allowed = max(1, int(bucket.rate + bucket.burst))
        if len(sent) < allowed:
            sent.append(now)
            return 0.0
        # The request that has to leave the window first (more than one if the rate fell).
        return max(sent[len(sent) - allowed] + 1.0 - now, 0.001)

    async def before_send(self, instance: str) -> None:
        """Wait until this request may go (:meth:`reserve_send`); requests of an instance
        take their turns at the gate in order."""
        state = self._instances.get(instance)
        if state is None or state.bucket is None:
            return
        async with state.gate_turn:
            while True:
                wait = self.reserve_send(instance, self.clock())
                if wait <= 0:
                    return
                await asyncio.sleep(wait)

    async def _sleep(self, seconds: float, priority: str) -> None:
        await asyncio.sleep(seconds)
        PACED_WAIT.labels(priority).inc(seconds)

    # --- internals --------------------------------------------------------------------

    def _state(self, instance: str, now: float) -> _Instance:
        state = self._instances.get(instance)
        if state is None:
            state = self._instances[instance] = _Instance(now)
        self._update_rate(instance, state, now)
        return state

    def _configured(self, instance: str) -> float:
        return self.limit(instance).rate_per_s

    def _reduce(self, instance: str, state: _Instance, now: float) -> None:
        configured = self._configured(instance)
        share = max(self.share(), 1e-9)
        current = (
            state.reduced
            if state.reduced is not None
            else configured or (state.busy_rate / share) or self.min_rate_per_s * 2
        )
        if state.reduced is None:
            # Without a configured rate, the reduction ends at 4x the rate we ran at: the
            # ramp stays visible to the gateway, and a backlog is not held at the old rate.
            state.ceiling = configured or current * self.unlimited_after
        state.reduced = max(self.min_rate_per_s, current / 2)
        state.grown_at = now
        self._apply(instance, state, now, empty=True)

    def _update_rate(self, instance: str, state: _Instance, now: float) -> None:
        if state.reduced is not None and now >= state.blocked_until:
            seconds = int(now - max(state.grown_at, state.blocked_until))
            if seconds > 0:
                state.reduced *= self.increase_factor**seconds
                state.grown_at = now
                if state.reduced >= state.ceiling:
                    state.reduced = None
        self._apply(instance, state, now)

    def _apply(self, instance: str, state: _Instance, now: float, *, empty: bool = False) -> None:
        limit = self.limit(instance)
        rate = state.reduced if state.reduced is not None else limit.rate_per_s
        if not rate:
            if state.bucket is not None:
                state.bucket = None
                state.exported_rate = 0.0
                try:
                    INSTANCE_RATE.remove(instance)
                except KeyError:
                    pass
            return
        share = self.share()
        rate *= share
        burst = 1.0 if state.reduced is not None else max(1.0, limit.burst * share)
        if state.bucket is None:
            state.bucket = TokenBucket(rate, burst, now)
        else:
            state.bucket.retune(rate, burst, now)
        if empty:
            state.bucket.empty(now)
        if rate != state.exported_rate:
            state.exported_rate = rate
            INSTANCE_RATE.labels(instance).set(rate)

    def _prune(self, now: float) -> None:
        """Forget recipients whose bucket is full again and who are not backed off."""
        self._pruned_at = now
        for key, pair in list(self._recipients.items()):
            idle = now - pair.bucket.updated
            if pair.blocked_until < now and idle * pair.bucket.rate >= pair.bucket.burst:
                del self._recipients[key]

    def _recipient(
        self, instance: str, recipient: str, now: float, *, create: bool = False
    ) -> _Recipient | None:
        key = (instance, recipient)
        pair = self._recipients.get(key)
        if pair is None and (self.recipient_interval_s > 0 or create):
            interval = self.recipient_interval_s or 1.0
            pair = self._recipients[key] = _Recipient(interval, self.recipient_burst, now)
        return pair
