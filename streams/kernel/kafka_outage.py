"""A Kafka outage as one process sees it: logged once when it starts, once when it ends.

When a broker dies, every aiokafka client of a process (the relay's producer,
the sink's consumer, the worker's Faust consumer and producer, the group-less
readers) logs each failed connect, metadata refresh, fetch, heartbeat and
produce at ERROR or WARNING, about ten lines a second each: a 15 s broker
restart wrote 3,900 lines over the relay, the sink and the worker, and the
zapstream code itself said nothing (aiokafka retries inside its clients, so
nothing reached the services' own failure handling).

:class:`KafkaOutageWatch` turns that into one outage per process:

- a filter (:meth:`KafkaOutageWatch.filter`) on aiokafka's loggers recognises the records that mean
  "a broker or a partition leader cannot be reached" (:data:`UNAVAILABLE`: refused
  or closed connections, nodes not ready, request timeouts, no leader, no
  coordinator). The first one starts the outage: one WARNING with its text (or,
  with a ``target``, the component's own outage line, e.g. the relay's
  ``Kafka unavailable, retrying with backoff: ...``); it and every later one are
  kept out of the log and counted in ``zapstream_kafka_client_errors_total``.
  Any other aiokafka record (a bug's traceback, an authorization error) is left alone;
- a failed connection to one broker (``Unable connect to node ...``) is not an outage:
  aiokafka tries the next broker, and with one node of a cluster down its clients
  meet it now and then while every request succeeds elsewhere. Counted, and logged
  at most every 10 minutes while no outage is ongoing (:data:`NODE_UNREACHABLE`);
- the outage ends with one INFO line (its length, the errors counted) once no
  such record came for ``quiet_s`` and a fresh client of this process bootstraps
  (a metadata request answered). The probe runs only during an outage, every
  ``probe_interval_s``; the quiet period keeps a failover (some partitions led
  elsewhere within seconds, others still without a leader) one outage, not a
  line per flap;
- a periodic reader of the process (:mod:`streams.kernel.runtime.periodic`: lag monitor, sink
  progress, controls) failing inside the outage counts its failure without a line of
  its own (:func:`reported`).

Metrics, labelled by ``component`` (``relay``, ``sink``, ``worker``):
``zapstream_kafka_unavailable`` (1 during an outage), ``zapstream_kafka_outages_total``,
``zapstream_kafka_outage_seconds_total`` (added when each ends) and
``zapstream_kafka_client_errors_total``.

The filter is process-wide (loggers are): one watch per process, installed by
:meth:`KafkaOutageWatch.start` and removed by :meth:`~KafkaOutageWatch.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from streams.kernel.runtime.outage import OutageLog
from streams.kernel.runtime.service import Service

if TYPE_CHECKING:
    from streams.kernel.settings import KafkaSettings

log = logging.getLogger(__name__)

AIOKAFKA_LOGGERS = (
    "aiokafka",
    "aiokafka.conn",
    "aiokafka.cluster",
    "aiokafka.admin.client",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
)
"""Every logger aiokafka 0.14 logs on: a logger's filters see only its own records."""

UNAVAILABLE = re.compile(
    r"Unable connect to|Unable to update metadata|Connect call failed|Connection at \S+ closed"
    r"|[Cc]onnection (?:reset|refused|closed)|NodeNotReady|KafkaConnectionError"
    r"|RequestTimedOut|KafkaTimeoutError|NotLeaderFor|NotLeaderOrFollower|LeaderNotAvailable"
    r"|NotEnoughReplicas|CoordinatorNotAvailable|NotCoordinator|CoordinatorLoadInProgress"
    r"|[Mm]arking (?:the )?coordinator dead|is either not started or not valid"
    r"|Heartbeat session expired"
)
"""What aiokafka says when a broker, a leader or a coordinator cannot be reached."""

NODE_UNREACHABLE = re.compile(r'Unable connect to (?:node with id |")')
"""One connection attempt to one broker failed. aiokafka then tries the next broker
(bootstrap, metadata refresh), and a request that really fails says so in a record of
its own: with one broker of a cluster down, its clients keep meeting it now and then
while every request succeeds elsewhere. Counted; never an outage by itself."""

NODE_LINE_INTERVAL_S = 600.0
"""A broker unreachable while Kafka answers: one line at most this often."""
NODE_LINE_DELAY_S = 2.0
"""...and only if no outage started meanwhile (its line says it then)."""

UNAVAILABLE_NOW = Gauge(
    "zapstream_kafka_unavailable",
    "1 while this process's Kafka clients cannot reach a broker, leader or coordinator",
    ["component"],
)
OUTAGES = Counter(
    "zapstream_kafka_outages_total",
    "Kafka outages this process saw start (logged once each)",
    ["component"],
)
OUTAGE_SECONDS = Counter(
    "zapstream_kafka_outage_seconds_total",
    "Seconds of Kafka outages, added when each ends",
    ["component"],
)
CLIENT_ERRORS = Counter(
    "zapstream_kafka_client_errors_total",
    "aiokafka's connection, timeout and leader errors, counted instead of logged",
    ["component"],
)


_WATCHING: list[KafkaOutageWatch] = []
"""The started watches of this process (one, outside tests)."""


def reported() -> bool:
    """A Kafka outage of this process is ongoing and its line written: a periodic reader
    (:mod:`streams.kernel.runtime.periodic`) failing meanwhile counts its failure without a
    line."""
    return any(watch.ongoing for watch in _WATCHING)


def is_unavailability(record: logging.LogRecord) -> bool:
    """An aiokafka warning or error saying a broker, leader or coordinator is out of reach.

    A record with a traceback is a bug, never an outage.
    """
    if record.levelno < logging.WARNING or record.exc_info:
        return False
    if not record.name.startswith("aiokafka"):
        return False
    return UNAVAILABLE.search(record.getMessage()) is not None


class KafkaOutageWatch(Service):
    """One process's Kafka outage, from its aiokafka clients' own errors (see the module).

    A :class:`~streams.kernel.runtime.service.Service`: starting installs it as a filter on
    aiokafka's loggers (any object with ``filter(record)`` is one) and its recovery probe;
    stopping removes both.

    ``target``: the component's outage log, which then writes the start and end
    lines (the relay's and the sink's ``OutageLog``, whose readiness and metrics
    follow it); without one the watch writes them with an ``OutageLog`` of its own. ``probe``: how a
    recovery is confirmed (default: a new aiokafka client of ``kafka`` bootstraps).
    """

    def __init__(
        self,
        component: str,
        kafka: KafkaSettings | None,
        *,
        target: OutageLog | None = None,
        logger: logging.Logger = log,
        quiet_s: float = 5.0,
        probe_interval_s: float = 1.0,
        probe: Callable[[], Awaitable[bool]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name=f"kafka outage watch ({component})")
        self.component = component
        self._kafka = kafka
        # Without a component's own outage log, the watch's: the same two lines.
        self._owns_target = target is None
        self._target = target or OutageLog(
            "Kafka", logger, retrying="its clients retrying", clock=clock
        )
        self._log = logger
        self.quiet_s = quiet_s
        self.probe_interval_s = probe_interval_s
        self._probe = probe
        self._clock = clock
        self._since: float | None = None
        self._last_error = 0.0
        self._started_target = False
        self._probing = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        # Faust runs its consumer in a thread of its own: its records are filtered there.
        self._lock = threading.Lock()
        self.errors = 0
        """Client errors counted in the ongoing outage."""
        self.outages = 0
        self._installed = False
        self._node_logged: float | None = None
        self._node_reason: str | None = None

    # --- lifecycle ---------------------------------------------------------------------

    async def on_start(self) -> None:
        """Install the filter on aiokafka's loggers and the recovery probe's task."""
        UNAVAILABLE_NOW.labels(self.component).set(0)
        OUTAGES.labels(self.component)  # a series from the start: 0, not absent
        OUTAGE_SECONDS.labels(self.component)
        CLIENT_ERRORS.labels(self.component)
        for name in AIOKAFKA_LOGGERS:
            logging.getLogger(name).addFilter(self)
        self._installed = True
        _WATCHING.append(self)
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(
            self._watch(), name=f"kafka outage watch ({self.component})"
        )

    async def on_stop(self) -> None:
        """Remove the filter (aiokafka logs as it likes again) and stop the probe."""
        if self._installed:
            for name in AIOKAFKA_LOGGERS:
                logging.getLogger(name).removeFilter(self)
            self._installed = False
            _WATCHING.remove(self)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    # --- the filter ----------------------------------------------------------------------

    def filter(self, record: logging.LogRecord) -> bool:
        """False (kept out of the log) for an unavailability record; it is counted."""
        if not is_unavailability(record):
            return True
        if self._probing:
            return False
        message = record.getMessage()
        if NODE_UNREACHABLE.search(message):
            self.node_unreachable(message)
        else:
            self.failed(message)
        return False

    def node_unreachable(self, reason: str) -> None:
        """One broker refused a connection: counted; outside an outage one line at most
        every :data:`NODE_LINE_INTERVAL_S` (a broker of the cluster is down, Kafka answers)."""
        CLIENT_ERRORS.labels(self.component).inc()
        with self._lock:
            if self._since is not None:
                self.errors += 1
                return
            now = self._clock()
            if self._node_logged is not None and now - self._node_logged < NODE_LINE_INTERVAL_S:
                return
            self._node_logged = now
            self._node_reason = " ".join(reason.split())[:300]
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.call_later, NODE_LINE_DELAY_S, self._node_line)

    def _node_line(self) -> None:
        with self._lock:
            reason, self._node_reason = self._node_reason, None
            if reason is None:
                return
            if self._since is not None:
                self._node_logged = None  # the outage's line says it
                return
        self._log.warning(
            "a connection to a Kafka broker failed, aiokafka tries the others: %s (counted in "
            "zapstream_kafka_client_errors_total; this line at most every %.0f minutes)",
            reason,
            NODE_LINE_INTERVAL_S / 60,
        )

    def failed(self, reason: str) -> None:
        """One client error: the first one of an outage starts it (one line)."""
        CLIENT_ERRORS.labels(self.component).inc()
        with self._lock:
            now = self._clock()
            self._last_error = now
            self.errors += 1
            ongoing = self._since is not None
            if not ongoing:
                self._since = now
        if ongoing:
            return
        self.outages += 1
        OUTAGES.labels(self.component).inc()
        UNAVAILABLE_NOW.labels(self.component).set(1)
        reason = " ".join(reason.split())[:300]
        self._started_target = not self._target.ongoing
        self._target.failed(
            f"{reason} (aiokafka's retries are counted in zapstream_kafka_client_errors_total, "
            "not logged)"
        )
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    def recovered(self) -> bool:
        """End the outage if no client error came for ``quiet_s``; True if it ended."""
        with self._lock:
            since = self._since
            if since is None:
                return False
            now = self._clock()
            if now - self._last_error < self.quiet_s:
                return False
            took = now - since
            self._since = None
        UNAVAILABLE_NOW.labels(self.component).set(0)
        OUTAGE_SECONDS.labels(self.component).inc(took)
        if self._started_target:
            if self._owns_target:  # its recovery line counts the client errors
                self._target.attempts = self.errors
            self._target.recovered()
        self._started_target = False
        self.errors = 0
        return True

    # --- the recovery probe ----------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._since is not None:
                wait = max(self.probe_interval_s, self._last_error + self.quiet_s - self._clock())
                await asyncio.sleep(wait)
                if self._clock() - self._last_error < self.quiet_s:
                    continue
                if await self._answers():
                    self.recovered()

    async def _answers(self) -> bool:
        """Does Kafka answer a fresh client? Its own errors are not the process's."""
        self._probing = True
        try:
            if self._probe is not None:
                return await self._probe()
            return await self._bootstrap()
        except Exception:  # noqa: BLE001 - a probe that fails says "not yet"
            return False
        finally:
            self._probing = False

    async def _bootstrap(self) -> bool:
        if self._kafka is None:
            return True
        from aiokafka import AIOKafkaClient

        timeout_ms = round(min(self._kafka.request_timeout_s, 10.0) * 1000)
        client = AIOKafkaClient(
            client_id=f"zapstream-{self.component}-kafka-probe",
            request_timeout_ms=timeout_ms,
            **self._kafka.client_options(),
        )
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await client.bootstrap()
            return True
        finally:
            with contextlib.suppress(Exception):
                await client.close()
