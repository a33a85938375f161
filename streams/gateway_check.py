"""The worker's start-up check of the gateway: one harmless request per instance, before any send.

A wrong base URL, a refused key or a listing the reconciler cannot read used to be
seen first when messages failed (or, for the listing, after a crash). At start the
worker asks :meth:`~streams.kernel.ports.Gateway.probe_configuration` once per instance of
``ZAPSTREAM_WORKER_PROBE_INSTANCES`` (else the keys of
``ZAPSTREAM_WORKER_INSTANCE_RATES``, else one placeholder id, which can tell a wrong
route but names no real instance) and says what it found:

- a wrong base URL or route (:class:`~streams.kernel.errors.GatewayMisconfigured`): one
  ERROR naming the setting; the instances asked about pause (their messages wait,
  nothing is FAILED, probes back off), and any other instance pauses at its first
  send with a WARNING only (:mod:`streams.instance_pauses`);
- credentials refused or an unknown instance: the instance pauses, as its first send
  would have paused it (for the placeholder: one ERROR naming the key's setting);
- a listing that does not parse (:class:`~streams.kernel.errors.ListingUnreadable`): one
  ERROR naming ``ZAPSTREAM_STACKZAP_LISTING_FIELDS``; sending goes on, but an
  uncertain send of that gateway cannot be reconciled until it is fixed;
- the gateway down, or no answer within the bound: one WARNING, and the worker
  carries on (the sends will tell, and a down gateway is not a configuration fault).

An instance the start did not ask about is probed once, in the background, when its
first message is seen (:meth:`GatewayStartCheck.first_sight`), with the same report.

The worker keeps running in every case. Nothing is sent to anybody: the clients'
probes are a listing page, an empty send body, a read of the number's node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from streams.instance_pauses import InstancePauses
from streams.kernel.errors import (
    GatewayError,
    GatewayMisconfigured,
    InstanceUnavailableError,
    ListingUnreadable,
)
from streams.kernel.ports import Gateway
from streams.kernel.runtime.service import Service

log = logging.getLogger(__name__)

PLACEHOLDER_INSTANCE = "zapstream-probe"
"""The instance asked about when none is configured: tells a wrong route, not an instance."""
CONCURRENCY = 8
"""Probes in flight at once (one request each)."""

Outcome = str | GatewayError | TimeoutError


class GatewayStartCheck(Service):
    """A worker resource started right after the gateway client: probes, logs, pauses."""

    name = "gateway start check"

    def __init__(
        self,
        gateway: Gateway,
        pauses: InstancePauses,
        instances: Sequence[str] = (),
        *,
        timeout_s: float = 25.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.gateway = gateway
        self.pauses = pauses
        self.instances = list(dict.fromkeys(instances))
        self.timeout_s = timeout_s
        self.clock = clock
        self.outcomes: dict[str, Outcome] = {}
        """What each probe found, once :meth:`start` ran (for tests and the summary)."""
        self._done = False
        self._seen: set[str] = set()
        self._unreadable_reported = False
        """An unreadable listing was named at ERROR (once per gateway and worker)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._gate = asyncio.Semaphore(1)
        """First-sight probes: one at a time (never a burst at the gateway)."""

    async def on_start(self) -> None:
        self._done = True
        placeholder = not self.instances
        instances = self.instances or [PLACEHOLDER_INSTANCE]
        gate = asyncio.Semaphore(CONCURRENCY)
        found = await asyncio.gather(*(self._probe(i, gate) for i in instances))
        self.outcomes = dict(zip(instances, found, strict=True))
        self._report(self.outcomes, placeholder)

    def first_sight(self, instance: str) -> None:
        """An instance the start did not ask about is seen (its first message): probe it once,
        in the background, so a listing it cannot read is named now, not after a crash."""
        if not self._done or instance in self.outcomes or instance in self._seen:
            return
        self._seen.add(instance)
        task = asyncio.get_running_loop().create_task(self._probe_one(instance))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe_one(self, instance: str) -> None:
        outcome = await self._probe(instance, self._gate)
        self.outcomes[instance] = outcome
        self._report({instance: outcome}, placeholder=False)

    async def _probe(self, instance: str, gate: asyncio.Semaphore) -> Outcome:
        async with gate:
            try:
                return await asyncio.wait_for(
                    self.gateway.probe_configuration(instance), self.timeout_s
                )
            except (GatewayError, TimeoutError) as exc:
                return exc

    async def on_stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _report(self, outcomes: dict[str, Outcome], placeholder: bool) -> None:
        name = self.gateway.name
        now = self.clock()
        ok: list[str] = []
        unreadable: list[tuple[str, ListingUnreadable]] = []
        unknown: list[tuple[str, BaseException]] = []
        for instance, outcome in outcomes.items():
            if isinstance(outcome, str):
                ok.append(instance)
            elif isinstance(outcome, GatewayMisconfigured):
                if placeholder:
                    self.pauses.note_misconfigured(
                        outcome, now, where=f"{name}, placeholder instance {instance}"
                    )
                else:
                    self.pauses.pause(instance, outcome, now, parked=True)
            elif isinstance(outcome, InstanceUnavailableError):
                if not placeholder:
                    self.pauses.pause(instance, outcome, now, parked=True)
                elif outcome.status_code in (401, 403):
                    log.error(
                        "gateway check (%s): credentials refused (%s), check %s: %s; every "
                        "instance using them pauses at its first send",
                        name,
                        outcome.status_code,
                        getattr(self.gateway, "credential_setting", "") or "the gateway key",
                        outcome,
                    )
                else:
                    # The placeholder is unknown, as it should be: route and key answered.
                    ok.append(instance)
            elif isinstance(outcome, ListingUnreadable):
                unreadable.append((instance, outcome))
            else:
                unknown.append((instance, outcome))
        if unreadable and self._unreadable_reported:
            # Named at ERROR once for the gateway; a later instance with the same fault is
            # one INFO line, not another alarm.
            log.info(
                "gateway check (%s): the job listing is unreadable for instance(s) %s too",
                name,
                ", ".join(i for i, _ in unreadable[:5]),
            )
        elif unreadable:
            self._unreadable_reported = True
            first, error = unreadable[0]
            log.error(
                "gateway check (%s): the job listing is unreadable for %d instance(s) "
                "(first: %s): %s; sending goes on, but an uncertain send cannot be reconciled "
                "(it ends UNCERTAIN after ZAPSTREAM_WORKER_RECONCILE_MAX_WAIT_S): set "
                "ZAPSTREAM_STACKZAP_LISTING_FIELDS to the names the gateway uses",
                name,
                len(unreadable),
                first,
                error,
            )
        if unknown:
            first, problem = unknown[0]
            log.warning(
                "gateway check (%s): no conclusion for %d instance(s) (first: %s: %s); "
                "carrying on, the sends will tell",
                name,
                len(unknown),
                first,
                str(problem) or type(problem).__name__,
            )
        if ok:
            detail = outcomes[ok[0]]
            log.info(
                "gateway check (%s): %d of %d answered as configured (%s: %s)",
                name,
                len(ok),
                len(outcomes),
                ok[0],
                detail if isinstance(detail, str) else "unknown instance, as expected",
            )
