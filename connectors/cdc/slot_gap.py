"""Slot gaps: rows the replication slot cannot have streamed, found and restreamed by the relay.

A row committed while no slot exists is never decoded: an operator dropped the slot, a
failover promoted a standby that had no copy of it, a slot was recreated. The relay
keeps, in the database itself (``outbox_relay_slots``, migration 0011, so it replicates
to a standby and survives a promotion), its slot's identity and the last position the
slot confirmed while a relay streamed it (copied from ``confirmed_flush_lsn`` every
``slot_checkpoint_interval_s``, never per confirmation). On start and on every reconnect
:func:`resolve_gap` reads that record beside ``pg_replication_slots`` and
:func:`find_gap` decides:

- ``missing``: zapstream created the slot (the relay found none, or ``db migrate`` did)
  and wrote a restream owed into the record before anything streamed it;
- ``recreated``: the record's identity is not the one this relay streamed before (another
  zapstream process recreated the slot meanwhile);
- ``behind``: the slot's ``confirmed_flush_lsn`` is behind the recorded position (a standby's
  synchronised copy promoted before it caught up, a slot after a PostgreSQL crash, whose
  position is saved at checkpoints). No row is missing: the slot decodes again from its own
  position everything committed since, and the worker drops what it already handled. So it
  is reported (a line, the metric), never restreamed;
- no record but a slot: a slot from before migration 0011; adopted, no gap;
- no slot: nothing yet (replays written now would never be decoded); the relay creates
  the slot, which owes the restream.

What a gap restreams, conservatively: **every PENDING job committed before the restream
commits**, not only those whose commit falls between two LSNs. The jobs table has no
commit LSN, and ``created_at`` is the inserting transaction's start, not its commit; any
bound tighter than that could miss a long transaction that committed in the gap. So a
PENDING job the old slot did stream (in Kafka, not yet written back by the sink) is
replayed too: the worker drops a replay of a job it already handled (settled jobs are
skipped, an in-flight attempt reconciled), so a replay costs a record, never a second
message. A job that left PENDING was streamed; it is not touched.

Order within a conversation: the new slot also streams the jobs committed between its
consistent point and the restream's commit, which the restream replays too. Sent as they
come, such a job would reach the gateway before an older job of its conversation that
only the replay carries. So the restream locks ``outbox_jobs`` in SHARE mode (it waits for
the transactions inserting jobs, and holds new ones for the few milliseconds until it
commits: every job committed before it is among the replays) and the relay drops the
slot's own ``outbox_jobs`` rows of the transactions before the restream's
(:class:`ReplayedBefore`, recognised by its xid, bounded by the WAL insert position read after
its commit). Only a relay restarted between the restream and streaming past it sends such
a job twice, once in the wrong order: the worker drops the second.

The restream is ``zapstream_restream_pending`` (the function ``zapstream outbox restream``
uses), run with the record's update in one transaction under an advisory lock, so two
relays (the active one and a standby) settle a gap once, and a crash before the commit
leaves it owed.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Any

import psycopg

from connectors.cdc.lsn import Lsn
from connectors.cdc.primary import refuse_standby

log = logging.getLogger("connectors.cdc.relay")


class GapReason(enum.Enum):
    """Why the slot cannot have streamed every row (the metric's ``reason`` label)."""

    MISSING = "missing"
    RECREATED = "recreated"
    BEHIND = "behind"


@dataclasses.dataclass(frozen=True, slots=True)
class SlotRecord:
    """The relay's durable record of its slot (a row of ``outbox_relay_slots``)."""

    slot_id: str
    confirmed: Lsn
    restream_reason: str | None
    """Set when zapstream created the slot, until a relay restreamed the gap."""


@dataclasses.dataclass(frozen=True, slots=True)
class SlotGap:
    """A gap found: why, in words for the log line."""

    reason: GapReason
    detail: str


def find_gap(
    record: SlotRecord | None, slot_confirmed: Lsn | None, streamed_id: str | None
) -> SlotGap | None:
    """The gap between what the slot can stream and what the relay last confirmed, if any.

    ``slot_confirmed`` is the slot's ``confirmed_flush_lsn`` (None: no slot, or none yet);
    ``streamed_id`` the identity this relay process last streamed (None: not yet).
    """
    if slot_confirmed is None:
        # No slot (yet): replays written now would never be decoded. The relay creates the
        # slot next, and its creation owes the restream (settled once it exists).
        return None
    if record is None:
        return None  # a slot from before the record existed: adopt it
    if record.restream_reason is not None:
        return SlotGap(GapReason.MISSING, record.restream_reason)
    if streamed_id is not None and record.slot_id != streamed_id:
        return SlotGap(
            GapReason.RECREATED, "the slot was recreated since this relay last streamed it"
        )
    if slot_confirmed < record.confirmed:
        return SlotGap(
            GapReason.BEHIND,
            f"the slot confirmed {slot_confirmed}, behind {record.confirmed} recorded",
        )
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayedBefore:
    """The restream's transaction: ``outbox_jobs`` rows of transactions before it are replayed
    by it (the slot's copy is dropped), up to the Begin of ``xid`` or a transaction ending
    after ``wal_bound`` (read after its commit), whichever comes first."""

    xid: int
    wal_bound: Lsn

    def covers(self, xid: int, final_lsn: Lsn) -> bool:
        """The transaction (``xid``, committed at ``final_lsn``) comes before the restream."""
        return xid != self.xid and final_lsn <= self.wal_bound


@dataclasses.dataclass(frozen=True, slots=True)
class GapOutcome:
    """What :func:`resolve_gap` found and did."""

    slot_id: str | None
    """The slot's identity now (None: no record could be kept, migration 0011 missing)."""
    gap: SlotGap | None
    restreamed: int = 0
    first_job_id: int | None = None
    last_job_id: int | None = None
    replayed_before: ReplayedBefore | None = None
    """Set when jobs were restreamed: the slot's copies before it are dropped."""


_READ = (
    "SELECT s.slot_id::text, s.confirmed_lsn::text, s.restream_reason, "
    "(SELECT r.confirmed_flush_lsn::text FROM pg_replication_slots r WHERE r.slot_name = %(slot)s)"
    " FROM (SELECT 1) one LEFT JOIN outbox_relay_slots s ON s.slot_name = %(slot)s"
)


def has_slot_record(conn: psycopg.Connection[Any]) -> bool:
    """Migration 0011 is applied (an older schema streams without gap recovery)."""
    row = conn.execute("SELECT to_regclass('outbox_relay_slots') IS NOT NULL").fetchone()
    return bool(row and row[0])


def record_created(conn: psycopg.Connection[Any], slot: str, at: Lsn, reason: str | None) -> None:
    """zapstream just created ``slot`` at ``at``: a new identity, a restream owed (None: not)."""
    if has_slot_record(conn):
        conn.execute(
            "SELECT zapstream_relay_slot_created(%s, %s::pg_lsn, %s)", (slot, str(at), reason)
        )


def resolve_gap(dsn: str, slot: str, *, streamed_id: str | None) -> GapOutcome:
    """Find a gap and restream it, in one transaction (blocking: run it in a thread)."""
    with psycopg.connect(dsn) as conn:
        refuse_standby(conn)
        with conn.transaction():
            outcome = _resolve(conn, slot, streamed_id)
        if outcome.restreamed:
            # The insert position, not pg_current_wal_lsn() (the write position): with
            # synchronous_commit=off the restream's commit record may not be written yet, and
            # a bound before it would let the slot's copies of the jobs it replays through.
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None and outcome.replayed_before is not None
            bound = ReplayedBefore(outcome.replayed_before.xid, Lsn.parse(str(row[0])))
            outcome = dataclasses.replace(outcome, replayed_before=bound)
        return outcome


def _resolve(conn: psycopg.Connection[Any], slot: str, streamed_id: str | None) -> GapOutcome:
    if not has_slot_record(conn):
        return GapOutcome(None, None)
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('zapstream.slot_gap.' || %s))", (slot,))
    row = conn.execute(_READ, {"slot": slot}).fetchone()
    assert row is not None
    slot_id, confirmed, restream_reason, slot_confirmed_text = row
    record = (
        None
        if slot_id is None
        else SlotRecord(str(slot_id), Lsn.parse(str(confirmed)), restream_reason)
    )
    slot_confirmed = None if slot_confirmed_text is None else Lsn.parse(str(slot_confirmed_text))
    if slot_confirmed is None:
        return GapOutcome(streamed_id, None)  # settled once the relay created the slot
    gap = find_gap(record, slot_confirmed, streamed_id)
    if gap is None and record is not None:
        return GapOutcome(record.slot_id, None)
    outcome = GapOutcome(None, gap)
    if gap is not None and gap.reason is not GapReason.BEHIND:
        replay = conn.execute(
            "SELECT replayed, first_job_id, last_job_id, "
            "pg_current_xact_id()::text::bigint %% 4294967296 "
            "FROM zapstream_restream_pending(NULL, %s, 'relay')",
            (f"slot gap ({gap.reason.value}): {gap.detail}",),
        ).fetchone()
        assert replay is not None
        restreamed, first, last, xid = int(replay[0]), replay[1], replay[2], int(replay[3])
        outcome = GapOutcome(
            None, gap, restreamed, first, last, ReplayedBefore(xid, Lsn(0)) if restreamed else None
        )
    # Settle: the slot's position now (its start, for a new slot), nothing owed.
    settled = conn.execute(
        "SELECT zapstream_relay_slot_settled(%s, %s::pg_lsn)::text", (slot, str(slot_confirmed))
    ).fetchone()
    assert settled is not None
    return dataclasses.replace(outcome, slot_id=str(settled[0]))
