"""Slot gaps: the decision table of :func:`find_gap`, and the relay settling a gap by itself
before it streams, on start and after a lost connection (fakes of ``test_relay_loop.py``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from connectors.cdc.lsn import Lsn
from connectors.cdc.metrics import SLOT_GAP_RESTREAMED, SLOT_GAPS
from connectors.cdc.replication_stream import ReplicationStreamClosed
from connectors.cdc.slot_gap import (
    GapOutcome,
    GapReason,
    ReplayedBefore,
    SlotGap,
    SlotRecord,
    find_gap,
)
from tests.unit.connectors.cdc.test_relay_faults import _run_until_stop
from tests.unit.connectors.cdc.test_relay_loop import (
    DEADLINE_S,
    Harness,
    Txn,
    relation_message,
    until,
)

RECORDED = Lsn.parse("0/5000")


def _record(*, slot_id: str = "a", owed: str | None = None) -> SlotRecord:
    return SlotRecord(slot_id, RECORDED, owed)


@pytest.mark.parametrize(
    ("record", "slot_confirmed", "streamed_id", "reason"),
    [
        # A slot and its record agree: no gap, whatever the slot did since.
        (_record(), RECORDED, None, None),
        (_record(), Lsn.parse("0/9000"), "a", None),
        # A slot from before migration 0011: adopted.
        (None, Lsn.parse("0/9000"), None, None),
        # zapstream created the slot (relay or db migrate): a restream is owed.
        (_record(owed="zapstream created the slot at 0/9000"), Lsn.parse("0/9000"), "a", "missing"),
        (_record(owed="created"), Lsn.parse("0/9000"), None, "missing"),
        # No slot (yet): its creation owes the restream, settled once it exists.
        (_record(), None, "a", None),
        (_record(owed="created"), None, "a", None),
        (None, None, None, None),
        # Another identity than the one this relay streamed: recreated meanwhile.
        (_record(slot_id="b"), Lsn.parse("0/9000"), "a", "recreated"),
        # Behind what was recorded (an older copy of the slot), even by one byte.
        (_record(), RECORDED - 1, "a", "behind"),
        (_record(), Lsn.parse("0/10"), None, "behind"),
    ],
)
def test_find_gap(
    record: SlotRecord | None,
    slot_confirmed: Lsn | None,
    streamed_id: str | None,
    reason: str | None,
) -> None:
    gap = find_gap(record, slot_confirmed, streamed_id)
    assert (None if gap is None else gap.reason.value) == reason


def test_an_owed_restream_wins_over_a_slot_ahead_of_the_record() -> None:
    # A new slot starts at the current WAL, ahead of anything recorded: only the owed
    # restream written at its creation tells it from the old one.
    gap = find_gap(_record(owed="zapstream created the slot"), Lsn.parse("1/0"), "a")
    assert gap is not None and gap.detail == "zapstream created the slot"


class FakeGaps:
    """Answers the supervisor's gap checks in turn, recording the identity it passed."""

    def __init__(self, *outcomes: GapOutcome) -> None:
        self.outcomes = list(outcomes)
        self.asked: list[str | None] = []

    async def __call__(self, streamed_id: str | None) -> GapOutcome:
        self.asked.append(streamed_id)
        return self.outcomes.pop(0) if self.outcomes else GapOutcome(streamed_id, None)


def _count(reason: str) -> float:
    return SLOT_GAPS.labels(reason)._value.get()


async def test_the_relay_restreams_a_gap_before_streaming_and_checks_again_after_a_reconnect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing = SlotGap(GapReason.MISSING, "zapstream created the slot at 0/9000")
    behind = SlotGap(GapReason.BEHIND, "the slot confirmed 0/10, behind 0/5000 recorded")
    gaps = FakeGaps(GapOutcome("id-1", missing, 3, 10, 12), GapOutcome("id-1", behind, 0))
    h = Harness(sources=2, resolve_gap=gaps, reconnect_initial_s=0.01, reconnect_max_s=0.02)
    first, second = h.sources
    t1, t2 = Txn(1), Txn(2)
    first.push(relation_message(), *t1.messages(), ReplicationStreamClosed("server closed"))
    second.push(relation_message(), *t2.messages())
    restreamed, missing_before, behind_before = (
        SLOT_GAP_RESTREAMED._value.get(),
        _count("missing"),
        _count("behind"),
    )
    with caplog.at_level(logging.INFO, logger="connectors.cdc.relay"):
        await _run_until_stop(h, lambda: len(h.producer.sent) >= 2, "t1 and t2 sent")
    # Once at start, once after the lost connection; the second knows the identity.
    assert gaps.asked == [None, "id-1"]
    assert SLOT_GAP_RESTREAMED._value.get() - restreamed == 3
    assert _count("missing") - missing_before == 1 and _count("behind") - behind_before == 1
    lines = [r.getMessage() for r in caplog.records if "slot gap" in r.getMessage()]
    assert lines[0] == (
        "slot gap on zapstream_outbox (missing: zapstream created the slot at 0/9000): "
        "restreamed 3 PENDING jobs (job ids 10..12)"
    )
    assert len(lines) == 1
    behind_lines = [
        r.getMessage() for r in caplog.records if "is behind its record" in r.getMessage()
    ]
    assert behind_lines == [
        "slot zapstream_outbox is behind its record (the slot confirmed 0/10, behind 0/5000 "
        "recorded): it streams again from its own position (records the worker drops); nothing "
        "to restream"
    ]


def test_replayed_before_covers_the_transactions_before_the_restream_only() -> None:
    replayed = ReplayedBefore(703, Lsn.parse("0/9000"))
    assert replayed.covers(701, Lsn.parse("0/8000"))
    assert replayed.covers(702, Lsn.parse("0/9000"))  # at the bound: still before it
    assert not replayed.covers(703, Lsn.parse("0/8000"))  # the restream itself
    assert not replayed.covers(704, Lsn.parse("0/9001"))  # past the bound


@pytest.mark.parametrize(
    ("replayed", "dropped", "produced"),
    [
        # Up to the restream's own transaction (xid 703): its replays carry txns 1 and 2.
        (ReplayedBefore(703, Txn(9).commit_lsn), (1, 2), (3, 4)),
        # The restream not seen (another relay streamed past it): the WAL bound ends it.
        (ReplayedBefore(999, Txn(2).commit_lsn), (1, 2), (3, 4)),
    ],
)
async def test_the_slots_own_jobs_before_the_restream_are_dropped_and_confirmed(
    replayed: ReplayedBefore, dropped: tuple[int, ...], produced: tuple[int, ...]
) -> None:
    gaps = FakeGaps(GapOutcome("id-1", SlotGap(GapReason.MISSING, "new"), 2, 1, 2, replayed))
    h = Harness(resolve_gap=gaps)
    txns = [Txn(n) for n in (*dropped, *produced)]
    h.source.push(relation_message(), *(m for t in txns for m in t.messages()))
    expected = sorted(j for n in produced for j in Txn(n).job_ids)
    async with h.running() as task:
        await until(lambda: len(h.producer.sent) == len(expected), "the later txns sent")
        h.producer.ack(*expected)
        # Every transaction confirmed, the dropped ones too.
        await until(lambda: txns[-1].end_lsn in h.source.flushes, "all confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    assert sorted(s.job_id for s in h.producer.sent) == expected
