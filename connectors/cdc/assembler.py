"""The transaction assembler: pgoutput payloads in, transaction boundaries and records out.

Sans-IO (no asyncio, no sockets): :meth:`TransactionAssembler.feed` takes the
payload of one ``XLogData`` message and returns what it means for the relay:

- :class:`TxnBegun` for a Begin (the transaction's final LSN and commit time),
- :class:`RowCaptured` for an INSERT into a published table: the record it
  becomes (through :class:`~connectors.cdc.shaping.RecordShaper`), the row, and
  whether the row was rejected on its size before anything parsed it,
- :class:`TxnCommitted` for a Commit (the end LSN the slot may be confirmed to),
- None for everything else (Relation messages, other tables, and a valid
  ``outbox_jobs`` row inserted SCHEDULED: it waits in PostgreSQL until
  :mod:`connectors.cdc.scheduled_release` releases it).

``outbox_jobs`` rows are decoded with only the columns an intent is made of
(the rest are stepped over); :meth:`TransactionAssembler.completed` decodes a
row again whole for the rare caller that needs every column (a rejection
carries, and a reduction cuts, all of them). Size before parse: a value over
``max_record_bytes`` is never decoded; its row becomes a rejection on its size.

With exactly-once (:mod:`connectors.cdc.transactions`), ``skip_before`` names
the transactions Kafka already holds: their rows are not captured again and
their Commit says ``skipped``. After a slot gap, ``replayed_before`` names the
restream's transaction: ``outbox_jobs`` rows of the transactions before it are in
its replays, so they are not captured from the slot (:mod:`connectors.cdc.slot_gap`).
"""

from __future__ import annotations

import dataclasses

from connectors.cdc.lsn import Lsn
from connectors.cdc.outbox_rows import (
    CAPTURED_COLUMNS,
    CapturedIntent,
    row_to_intent,
    waits_for_release,
    with_cut_values,
)
from connectors.cdc.pgoutput import Begin, Commit, Insert, Payload, PgOutputDecoder
from connectors.cdc.provisioning import OUTBOX_TABLE, PUBLISHED_TABLES
from connectors.cdc.shaping import Converted, RecordShaper, Row
from connectors.cdc.slot_gap import ReplayedBefore
from connectors.cdc.transactions import already_in_kafka

NO_LSN = Lsn(0)


@dataclasses.dataclass(slots=True)
class TxnBegun:
    """A transaction's Begin: its records carry ``lsn`` and ``committed_at``."""

    final_lsn: Lsn
    commit_ts_us: int
    """PostgreSQL's commit timestamp (microseconds since 2000-01-01)."""


@dataclasses.dataclass(slots=True)
class RowCaptured:
    """One inserted row of a published table and the record it becomes."""

    table: str
    record: Converted
    row: Row
    """The row's values; only the intent's columns while ``complete`` is False."""
    payload: Payload
    """The INSERT as pgoutput sent it, to decode again whole (see ``completed()``)."""
    complete: bool = True
    too_large: bool = False
    """Rejected on a value over ``max_record_bytes``, unparsed."""


@dataclasses.dataclass(slots=True)
class TxnCommitted:
    """A transaction's Commit: confirmable up to ``end_lsn`` once Kafka took its records."""

    end_lsn: Lsn
    skipped: bool = False
    """Exactly-once: a replayed transaction Kafka already held; none of its rows came out."""


Step = TxnBegun | RowCaptured | TxnCommitted


class TransactionAssembler:
    """Turns one connection's pgoutput payloads into transactions and records (sans-IO)."""

    def __init__(
        self,
        shaper: RecordShaper,
        *,
        max_value_bytes: int,
        oversized_head_bytes: int,
        skip_before: Lsn = NO_LSN,
        start_lsn: Lsn = NO_LSN,
        replayed_before: ReplayedBefore | None = None,
    ) -> None:
        self._shaper = shaper
        self._decoder = PgOutputDecoder(
            columns={OUTBOX_TABLE: CAPTURED_COLUMNS},
            max_value_bytes=max_value_bytes,
            oversized_head_bytes=oversized_head_bytes,
        )
        self._skip_before = skip_before
        self._skipping = False
        self.replayed_before = replayed_before
        """Until the restream's transaction is seen (then None)."""
        self._replayed_jobs = False
        """This transaction's ``outbox_jobs`` rows are in the restream's replays."""
        self.lsn = str(start_lsn)
        """The LSN the current transaction's records carry (its final LSN)."""
        self.committed_at: str | None = None
        """The current transaction's commit time, ISO 8601 (one datetime per transaction)."""

    def feed(self, payload: Payload) -> Step | None:
        """What one pgoutput message means (see the module docstring)."""
        if not self._skipping:
            # The common case first, in as few calls as it takes (the relay's hot path).
            kept = self._decoder.kept_insert(payload)
            if kept is not None and kept[0].name == OUTBOX_TABLE:
                if self._replayed_jobs:
                    return None
                row = kept[1]
                intent = row_to_intent(row, lsn=self.lsn, committed_at=self.committed_at)
                if type(intent) is CapturedIntent and waits_for_release(row):
                    # Scheduled: it waits in PostgreSQL; its release is its intent. (A
                    # row breaking a rule is rejected now, not at its due time.)
                    return None
                return RowCaptured(OUTBOX_TABLE, intent, row, payload, False)
        decoded = self._decoder.decode(payload)
        kind = type(decoded)
        if kind is Insert:
            assert isinstance(decoded, Insert)
            if self._skipping or (self._replayed_jobs and decoded.relation.name == OUTBOX_TABLE):
                return None
            if decoded.oversized is None and decoded.relation.name == OUTBOX_TABLE:
                # The common case first, in as few calls as it takes (the relay's hot path).
                intent = row_to_intent(decoded.new, lsn=self.lsn, committed_at=self.committed_at)
                if type(intent) is CapturedIntent and waits_for_release(decoded.new):
                    # Scheduled: it waits in PostgreSQL; its release is its intent. (A
                    # row breaking a rule is rejected now, not at its due time.)
                    return None
                return RowCaptured(OUTBOX_TABLE, intent, decoded.new, payload, decoded.complete)
            return self._insert(decoded, payload)
        if kind is Begin:
            assert isinstance(decoded, Begin)
            self.committed_at = decoded.commit_ts.isoformat()
            self.lsn = str(decoded.final_lsn)
            # Replayed by the slot, but committed to Kafka by an earlier relay: its inserts
            # are not produced again.
            self._skipping = already_in_kafka(decoded.final_lsn, self._skip_before)
            replayed = self.replayed_before
            if replayed is not None:
                self._replayed_jobs = replayed.covers(decoded.xid, decoded.final_lsn)
                if not self._replayed_jobs:
                    self.replayed_before = None  # the restream itself, or past it
            return TxnBegun(decoded.final_lsn, decoded.commit_ts_us)
        if kind is Commit:
            assert isinstance(decoded, Commit)
            skipped, self._skipping = self._skipping, False
            return TxnCommitted(decoded.end_lsn, skipped)
        return None

    def completed(self, step: RowCaptured) -> RowCaptured:
        """``step`` with every column of its row (an oversized one as its head, cut)."""
        if step.complete:
            return step
        full = self._decoder.decode_complete(step.payload)
        assert isinstance(full, Insert)
        row = with_cut_values(full.new, full.oversized)
        record = step.record
        if not isinstance(record, CapturedIntent):
            # Rejected: converted again from the whole row, which the rejection carries.
            record = self._shaper.convert(step.table, row, self.lsn, self.committed_at)
        return RowCaptured(step.table, record, row, step.payload)

    def _insert(self, insert: Insert, payload: Payload) -> RowCaptured | None:
        table = insert.relation.name
        if table not in PUBLISHED_TABLES:
            return None
        if insert.oversized:
            if not insert.complete:
                # A column the intent is made of is too large to parse: see all the others.
                full = self._decoder.decode_complete(payload)
                assert isinstance(full, Insert)
                insert = full
            rejection, row = self._shaper.oversized(table, insert, self.lsn, self.committed_at)
            return RowCaptured(table, rejection, row, payload, too_large=True)
        record = self._shaper.convert(table, insert.new, self.lsn, self.committed_at)
        return RowCaptured(table, record, insert.new, payload, complete=insert.complete)
