"""The relay's supervisor: provisioning, standby, reconnects and what follows a session.

:class:`SlotSupervisor` holds the slot for the relay. It provisions the
publication and slot (retrying while PostgreSQL is away), opens a replication
connection per attempt (a :class:`~connectors.cdc.replication_stream.ReplicationStream`
unless a source factory is injected) and, depending on the answer:

- the slot is streamed by another relay: :attr:`SlotState.STANDBY`, retrying
  every ``standby_retry_s`` (announced once per standby spell);
- the slot is missing: recreate it; the rows committed meanwhile are restreamed
  before it streams (below);
- before each connection after provisioning, a recreation or a lost session: settle a slot
  gap (:mod:`connectors.cdc.slot_gap`): a slot new or of another identity has every PENDING
  job restreamed, with one line and ``zapstream_relay_slot_gap_restreamed_total``; a slot
  behind what it last confirmed is only reported (it streams that part again itself);
- PostgreSQL is away: :attr:`SlotState.CONNECTING`, capped, jittered backoff,
  the outage logged once when it starts and once when it ends;
- streaming: :attr:`SlotState.STREAMING` while the
  :class:`~connectors.cdc.streaming.Streamer` runs one session; then a transient
  Kafka failure is waited out and the slot streamed again from its confirmed
  position, a permanent one stops the relay.

Permanent failures raise :class:`~streams.kernel.failures.StartRefused` (exit 2)
or :class:`~connectors.cdc.failures.RelayError` (Kafka refused a record).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable

import psycopg
from aiokafka.errors import ProducerFenced

from connectors.cdc.exactly_once import KafkaTransactions
from connectors.cdc.failures import (
    Backoff,
    OutageLog,
    RelayError,
    classify_exception,
    kafka_transient,
    refused,
)
from connectors.cdc.lsn import Lsn
from connectors.cdc.metrics import ACTIVE, SLOT_GAP_RESTREAMED, SLOT_GAPS
from connectors.cdc.primary import StandbyServer
from connectors.cdc.provisioning import ProvisioningError, ensure_replication
from connectors.cdc.publisher import Publisher
from connectors.cdc.replication_stream import (
    ReplicationError,
    ReplicationStream,
    ReplicationStreamClosed,
    SlotInUse,
    SlotNotFound,
)
from connectors.cdc.settings import RelaySettings
from connectors.cdc.slot_gap import GapOutcome, GapReason, resolve_gap
from connectors.cdc.source import ReplicationSource
from connectors.cdc.streaming import Streamer
from connectors.cdc.transactions import transactional_id

# The relay's log lines keep the logger name they always had: operators filter on it.
log = logging.getLogger("connectors.cdc.relay")

PG_FLAP_WINDOW_S = 30.0
"""A PostgreSQL failure this soon after the relay's recovery line continues that outage."""


class SlotState(enum.Enum):
    """Where this relay stands with the slot (``/readyz``'s reason while not streaming)."""

    CONNECTING = "connecting"
    STANDBY = "standby"
    """Another relay streams the slot; this one retries every ``standby_retry_s``."""
    STREAMING = "streaming"
    STOPPED = "stopped"


class SlotSupervisor:
    """Gets and keeps the slot streamed (see the module docstring); :attr:`state` says where."""

    def __init__(
        self,
        settings: RelaySettings,
        publisher: Publisher,
        streamer: Streamer,
        *,
        transactions: KafkaTransactions | None,
        new_source: Callable[[], ReplicationSource] | None = None,
        provision: Callable[[], Awaitable[Lsn]] | None = None,
        resolve: Callable[[str | None], Awaitable[GapOutcome]] | None = None,
        sleep: Callable[[float], Awaitable[bool]],
        stopping: Callable[[], bool],
        kafka_outage: OutageLog,
    ) -> None:
        self._settings = settings
        self._publisher = publisher
        self._streamer = streamer
        self._eos = transactions
        self._new_source = new_source or self._replication_stream
        self._provision = provision or self._ensure_replication
        # Gap recovery needs the database: on by default with the production source only.
        self._resolve = resolve or (self._resolve_gap if new_source is None else None)
        self._gap_check_due = True
        self._streamed_id: str | None = None
        """The slot identity this relay last settled (None: not yet, or no record)."""
        self._sleep = sleep
        self._stopping = stopping
        # A failover or a restart often drops the new connection again within seconds (the
        # promoted server settling, an HA manager's checks): one outage, not a line per drop.
        self.pg_outage = OutageLog("PostgreSQL", log, flap_window_s=PG_FLAP_WINDOW_S)
        self._kafka_outage = kafka_outage
        self._backoff = Backoff(settings.reconnect_initial_s, settings.reconnect_max_s)
        self._announced_standby = False
        self._history: tuple[str, int] | None = None
        """The (system id, timeline) of the last session: a change is a promotion."""
        self.state = SlotState.CONNECTING

    def set_state(self, state: SlotState) -> None:
        self.state = state
        ACTIVE.set(1 if state is SlotState.STREAMING else 0)

    def _replication_stream(self) -> ReplicationSource:
        s = self._settings
        return ReplicationStream(
            s.postgres.dsn,
            slot=s.slot,
            publication=s.publication,
            connect_timeout_s=s.postgres.connect_timeout_s,
            silence_timeout_s=s.replication_timeout_s,
        )

    async def _ensure_replication(self) -> Lsn:
        s = self._settings
        return await asyncio.to_thread(
            ensure_replication,
            s.postgres.dsn,
            slot=s.slot,
            publication=s.publication,
            failover=s.slot_failover,
        )

    async def _resolve_gap(self, streamed_id: str | None) -> GapOutcome:
        s = self._settings
        return await asyncio.to_thread(
            resolve_gap, s.postgres.service_dsn, s.slot, streamed_id=streamed_id
        )

    async def _settle_gap(self) -> bool:
        """Restream a slot gap if there is one; False while PostgreSQL is away (retry)."""
        if self._resolve is None or not self._gap_check_due:
            return True
        try:
            outcome = await self._resolve(self._streamed_id)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise refused(
                f"the relay may not keep its slot's record ({exc}): run `zapstream db migrate` "
                "(it grants zapstream_relay what migration 0011 needs)",
                dependency="postgres",
            ) from exc
        except psycopg.Error as exc:
            self.set_state(SlotState.CONNECTING)
            self._pg_failed(exc)
            await self._sleep(self._backoff.next_delay_s())
            return False
        self._gap_check_due = False
        self._streamed_id = outcome.slot_id
        gap = outcome.gap
        if outcome.replayed_before is not None:
            self._streamer.replayed_before = outcome.replayed_before
        if gap is None:
            return True
        SLOT_GAPS.labels(gap.reason.value).inc()
        if gap.reason is GapReason.BEHIND:
            log.info(
                "slot %s is behind its record (%s): it streams again from its own position "
                "(records the worker drops); nothing to restream",
                self._settings.slot,
                gap.detail,
            )
        else:
            SLOT_GAP_RESTREAMED.inc(outcome.restreamed)
            log.log(
                logging.WARNING if outcome.restreamed else logging.INFO,
                "slot gap on %s (%s: %s): restreamed %d PENDING jobs%s",
                self._settings.slot,
                gap.reason.value,
                gap.detail,
                outcome.restreamed,
                ""
                if outcome.first_job_id is None
                else f" (job ids {outcome.first_job_id}..{outcome.last_job_id})",
            )
        return True

    async def run(self) -> None:
        """Stream the slot until a stop is requested (or a permanent failure raises)."""
        confirmed = await self._provision_until_ready()
        while confirmed is not None and not self._stopping():
            if not await self._settle_gap():
                continue
            source = self._new_source()
            try:
                await source.start(Lsn(0))
            except SlotInUse:
                await source.close()
                await self._standby()
                continue
            except SlotNotFound:
                await source.close()
                confirmed = await self._recreate_slot(confirmed)
                self._gap_check_due = True
                continue
            except ReplicationError as exc:
                await source.close()
                self.set_state(SlotState.CONNECTING)
                self._pg_failed(exc)
                await self._sleep(self._backoff.next_delay_s())
                continue
            self.pg_outage.recovered()
            self._backoff.reset()
            self._announced_standby = False
            confirmed = self._follow_history(source, confirmed)
            confirmed = await self._session(source, confirmed)
            self._gap_check_due = True  # a reconnect: the slot may have gone meanwhile

    def _follow_history(self, source: ReplicationSource, confirmed: Lsn) -> Lsn:
        """After a promotion, forget the positions confirmed on the old primary's timeline.

        A promoted standby's WAL goes on from where *it* stopped receiving, so a position the
        relay confirmed on the old primary may name other transactions there (only with
        ``synchronized_standby_slots`` is it never ahead of the standby). The slot's own
        position (the synchronised copy, or a new slot's start) is the truth: replays
        before it are duplicates the worker drops.
        """
        identity = getattr(source, "identity", None)
        if identity is None:
            return confirmed
        history = (identity.system_id, identity.timeline)
        before, self._history = self._history, history
        if before is None or before == history:
            return confirmed
        log.warning(
            "PostgreSQL %s (timeline %s -> %s): the relay resumes from slot %s's own position",
            "was promoted" if before[0] == history[0] else "is another cluster now",
            before[1],
            history[1],
            self._settings.slot,
        )
        self._streamer.reported = Lsn(0)
        return Lsn(0)

    async def _provision_until_ready(self) -> Lsn | None:
        """Run provisioning, retrying transient failures; None if a stop came first."""
        while not self._stopping():
            try:
                return await self._provision()
            except ProvisioningError as exc:
                raise refused(str(exc), dependency="postgres") from exc
            except psycopg.Error as exc:
                self._pg_failed(exc)
                if await self._sleep(self._backoff.next_delay_s()):
                    return None
        return None

    def _pg_failed(self, exc: BaseException) -> None:
        """Permanent: raise StartRefused. Transient: note the outage (logged once)."""
        if isinstance(exc, StandbyServer):  # until a promotion, or the DSN reaches the primary
            self.pg_outage.failed(str(exc))
            return
        failure = classify_exception(exc)
        if not failure.retriable:
            raise refused(f"PostgreSQL: {failure.problem}", dependency="postgres") from exc
        self.pg_outage.failed(failure.problem)

    async def _standby(self) -> None:
        self.pg_outage.recovered()
        self.set_state(SlotState.STANDBY)
        if not self._announced_standby:
            log.info(
                "relay standby: slot %s is streamed by another relay; waiting", self._settings.slot
            )
            self._announced_standby = True
        await self._sleep(self._settings.standby_retry_s)
        # The relay that has the slot may die before settling a gap its creation owes: check
        # again before taking the slot over (a read of one row while nothing is owed).
        self._gap_check_due = True

    async def _recreate_slot(self, confirmed: Lsn) -> Lsn | None:
        self.set_state(SlotState.CONNECTING)
        log.warning(
            "replication slot %s is missing; recreating it (the rows committed while it was "
            "missing are restreamed before it streams)",
            self._settings.slot,
        )
        provisioned = await self._provision_until_ready()
        # This relay recreated it: the restream owed in its record says what is missing, the
        # new identity alone is no gap of its own.
        self._streamed_id = None
        return None if provisioned is None else max(confirmed, provisioned)

    async def _session(self, source: ReplicationSource, confirmed: Lsn) -> Lsn:
        """Stream one connection to its end; the LSN the next one resumes from."""
        self.set_state(SlotState.STREAMING)
        try:
            if self._eos is not None:
                await self._begin_eos_session(source, confirmed)
            if self._publisher.failure is None:
                confirmed = await self._streamer.stream(source, confirmed)
        except ReplicationStreamClosed as exc:
            confirmed = await self._connection_lost(exc)
        finally:
            self.set_state(SlotState.CONNECTING)
            await source.close()
            if self._eos is not None:
                await self._eos.end_session(self._publisher)
        return await self._after_session(confirmed)

    async def _connection_lost(self, exc: ReplicationStreamClosed) -> Lsn:
        if not exc.retriable:
            raise refused(
                f"PostgreSQL ended replication: {classify_exception(exc).problem}",
                dependency="postgres",
            ) from exc
        # PostgreSQL restarted or the connection dropped: what Kafka acknowledged
        # but PostgreSQL did not hear about is replayed from the slot (duplicates
        # the worker drops), nothing is skipped.
        self.pg_outage.failed(f"replication connection lost: {exc}")
        if self._eos is None:  # exactly-once: the open transaction goes with its producer
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.drain_timeout_s):
                    await self._publisher.producer.flush()
        confirmed = self._streamer.reported
        await self._sleep(self._backoff.next_delay_s())
        return confirmed

    async def _begin_eos_session(self, source: ReplicationSource, confirmed: Lsn) -> None:
        assert self._eos is not None
        resume = await self._eos.begin_session(
            self._publisher, source, max(confirmed, self._streamer.reported)
        )
        if self._publisher.failure is None:
            self._kafka_outage.recovered()
        if resume is not None:
            await self._streamer.confirm(source, resume)

    async def _after_session(self, confirmed: Lsn) -> Lsn:
        """Raise for a permanent Kafka failure; wait out a transient one."""
        failure = self._publisher.failure
        if failure is None:
            if self._kafka_outage.ongoing and self._publisher.tracker is not None:
                self._kafka_outage.recovered()
            return confirmed
        if isinstance(failure, ProducerFenced):
            raise RelayError(
                f"fenced: another relay produces as {transactional_id(self._settings)} (it "
                "took the slot); this one stops without committing"
            ) from failure
        if not kafka_transient(failure):
            raise RelayError("Kafka did not acknowledge a record") from failure
        # E.g. a batch expired while the brokers were away: confirm nothing past
        # it, let the rest settle, and stream again from the slot's position.
        self._publisher.kafka_ok = False
        self._kafka_outage.failed(repr(failure))
        pending = self._publisher.pending
        if pending:
            await asyncio.wait(pending, timeout=self._settings.drain_timeout_s)
        self._publisher.recover()
        await self._sleep(self._backoff.next_delay_s())
        return self._streamer.reported
