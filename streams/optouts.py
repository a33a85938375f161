"""Recipients who opted out, as every worker knows them, and the decision to skip a job.

An application (``connectors.outbox.optouts.opt_out``, or a plain ``INSERT INTO
outbox_optouts``), an operator (``zapstream optouts add``) or the gateway (Meta's
131050, recorded by the state sink's trigger) writes a row into ``outbox_optouts``; the
relay streams it to ``zapstream.controls`` as an :class:`~streams.kernel.contract.OptOutChanged`
keyed per instance and person. Every worker reads the whole topic (the controls reader,
:class:`streams.controls.ControlsReader`) and keeps the people opted out now, of every
instance, in :class:`OptOuts`.

Memory is bounded by the people opted out, not by the history: one 64-bit digest of the
person per opted-out (instance, person), in one set per instance; an opt-in removes it.
About 60-100 bytes each (``make bench`` section ``optouts`` measures it: 10^6 opt-outs
are in ``docs/performance.md``). The topic is compacted per key, so it holds one record
per person ever opted out or in, whatever the history.

A worker that has not read the topic to its end since it started (:attr:`OptOuts.ready`
is False) does not know who opted out: a job the list would decide waits (its
conversation parks for :data:`NOT_READY_WAIT_S`) instead of being sent on a guess.

:func:`skip_reason` is the decision, sans-IO: a job whose opt-out applies
(:func:`~streams.kernel.contract.opt_out_applies`: bulk by default, or what the
application said with ``respect_opt_out``) to a person on the list ends OPTED_OUT.
"""

from __future__ import annotations

import logging

from streams.kernel.contract import (
    IntentCaptured,
    OptOutAction,
    OptOutChanged,
    ReceiptReceived,
    opt_out_applies,
    opt_out_person,
)
from streams.metrics import OPTOUTS_KNOWN

log = logging.getLogger(__name__)

NOT_READY_WAIT_S = 1.0
"""How long a job waits for the opt-out list when the worker has not read it all yet."""


def _digest(person: str) -> int:
    # Python's string hash: 64 bits, process-local (only this worker compares them); a
    # collision needs ~4e9 people on one instance to become likely.
    return hash(person)


class OptOuts:
    """The people opted out of each instance now, as digests (see the module docstring)."""

    def __init__(self, *, ready: bool = True) -> None:
        self._people: dict[str, set[int]] = {}
        self._count = 0
        self.ready = ready
        """Whether the whole opt-out list was read (the controls reader caught up once)."""

    def __len__(self) -> int:
        return self._count

    def apply(self, change: OptOutChanged) -> None:
        """An opt-out or opt-in read from ``zapstream.controls``."""
        if change.action == OptOutAction.OUT:
            self.add(change.instance_id, change.person)
        elif change.action == OptOutAction.IN:
            self.remove(change.instance_id, change.person)
        else:
            log.error("opt-out action %r of instance %s not understood", change.action,
                      change.instance_id)  # fmt: skip

    def add(self, instance_id: str, person: str) -> None:
        people = self._people.setdefault(instance_id, set())
        before = len(people)
        people.add(_digest(person))
        self._count += len(people) - before
        OPTOUTS_KNOWN.set(self._count)

    def remove(self, instance_id: str, person: str) -> None:
        people = self._people.get(instance_id)
        if people is None:
            return
        before = len(people)
        people.discard(_digest(person))
        self._count -= before - len(people)
        if not people:
            del self._people[instance_id]
        OPTOUTS_KNOWN.set(self._count)

    def opted_out(self, instance_id: str, person: str) -> bool:
        people = self._people.get(instance_id)
        return people is not None and _digest(person) in people

    def instances(self) -> dict[str, int]:
        """Opted-out people per instance."""
        return {instance: len(people) for instance, people in self._people.items()}


def applies(intent: IntentCaptured) -> bool:
    """Whether the recipient's opt-out stops this intent (bulk, unless it says otherwise)."""
    return opt_out_applies(intent.priority, intent.respect_opt_out)


def skip_reason(optouts: OptOuts, intent: IntentCaptured) -> str | None:
    """Why the intent is not sent (its recipient opted out), or None: send it.

    Call only when :attr:`OptOuts.ready` (else the list is incomplete).
    """
    if not applies(intent):
        return None
    if not optouts.opted_out(intent.instance_id, opt_out_person(intent.to)):
        return None
    kind = "bulk" if intent.respect_opt_out is None else "respect_opt_out"
    return (
        f"recipient opted out of instance {intent.instance_id} ({kind} message not sent; "
        "see `zapstream optouts list`)"
    )


META_OPT_OUT_CODE = "131050"
"""Meta's error code: the user stopped marketing messages from the business."""


def opted_out_by_receipt(receipt: ReceiptReceived) -> bool:
    """A failed receipt saying the recipient opted out: Meta's status webhook with error
    131050 (its reason starts with the code, ``connectors.webhook.meta.error_reason``)."""
    reason = receipt.reason or ""
    return receipt.gateway == "meta" and reason.split(" ", 1)[0] == META_OPT_OUT_CODE
