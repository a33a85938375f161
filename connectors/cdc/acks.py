"""Which WAL position the relay may confirm to PostgreSQL.

A transaction becomes confirmable only when Kafka acknowledged every record
produced from it; the confirmed LSN is the end LSN of the highest transaction
such that it and every transaction before it are fully acknowledged. Records
are acknowledged out of order across partitions, so a later transaction can
finish first and must wait for the earlier ones.

When nothing is outstanding, a server keepalive's ``wal_end`` may be confirmed
too: everything before it that concerns us has been received and acknowledged,
and a transaction still open on the server commits after it, so it will be
replayed in full. Without this a slot on a quiet outbox would pin WAL forever
while other tables change.

When a transaction that produced records is fully acknowledged (its Commit
seen, its last record acknowledged), ``on_acknowledged`` is told its commit
timestamp and the moment of that last acknowledgement (the injected ``clock``),
for the relay's commit->Kafka-ack latency. The clock is read once per
transaction, when its outstanding count drops to zero, not per record.

Sans-IO: the relay tells it what happened; it never touches a socket.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

from connectors.cdc.lsn import Lsn


class AckOrderError(RuntimeError):
    """A broken invariant: confirmation would move backwards, or an unknown transaction."""


@dataclasses.dataclass(slots=True)
class _Txn:
    end_lsn: Lsn | None  # None until the Commit message arrived
    outstanding: int = 0
    commit_ts_us: int = 0  # the Begin's commit timestamp (µs since 2000-01-01 UTC)
    records: int = 0  # records sent for it, ever
    acked_at: float = 0.0  # clock() when outstanding last dropped to zero


AckedCallback = Callable[[int, float], None]
"""``on_acknowledged(commit_ts_us, acked_at)``: a transaction's last record was acknowledged."""


class AckTracker:
    """Tracks transactions from Begin to Kafka acknowledgement of all their records."""

    def __init__(
        self,
        confirmed: Lsn,
        *,
        on_acknowledged: AckedCallback | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._confirmed = confirmed
        self._on_acknowledged = on_acknowledged
        self._clock = clock
        self._txns: collections.deque[_Txn] = collections.deque()
        self._open: _Txn | None = None
        self.records_outstanding = 0

    @property
    def confirmed(self) -> Lsn:
        """The highest LSN it is safe to report as flushed."""
        return self._confirmed

    @property
    def pending_transactions(self) -> int:
        return len(self._txns)

    def begin(self, commit_ts_us: int = 0) -> _Txn:
        if self._open is not None:
            raise AckOrderError("Begin inside an open transaction")
        txn = _Txn(end_lsn=None, commit_ts_us=commit_ts_us)
        self._open = txn
        self._txns.append(txn)
        return txn

    def record_sent(self, txn: _Txn) -> None:
        txn.outstanding += 1
        txn.records += 1
        self.records_outstanding += 1

    def record_acked(self, txn: _Txn, count: int = 1) -> None:
        """Kafka acknowledged ``count`` records of ``txn`` (a batch holds several)."""
        if count <= 0 or txn.outstanding < count:
            raise AckOrderError("more acknowledgements than records sent")
        txn.outstanding -= count
        self.records_outstanding -= count
        if txn.outstanding == 0:
            txn.acked_at = self._clock()
            if txn.end_lsn is not None and self._on_acknowledged is not None:
                self._on_acknowledged(txn.commit_ts_us, txn.acked_at)
        self._advance()

    def commit(self, txn: _Txn, end_lsn: Lsn) -> None:
        if txn is not self._open:
            raise AckOrderError("Commit for a transaction that is not open")
        txn.end_lsn = end_lsn
        self._open = None
        if txn.records and txn.outstanding == 0 and self._on_acknowledged is not None:
            # Every record was acknowledged before the Commit was read (a large
            # transaction produced in several batches): the last ack is the moment.
            self._on_acknowledged(txn.commit_ts_us, txn.acked_at)
        self._advance()

    def keepalive(self, wal_end: Lsn) -> None:
        """Confirm the server's position when nothing is outstanding."""
        if not self._txns and self._open is None and wal_end > self._confirmed:
            self._confirmed = wal_end

    def _advance(self) -> None:
        while self._txns:
            head = self._txns[0]
            if head.end_lsn is None or head.outstanding:
                return
            self._txns.popleft()
            if head.end_lsn < self._confirmed:
                # A transaction replayed from before the slot's confirmed position
                # is possible only if PostgreSQL resent it; never report less.
                continue
            self._confirmed = head.end_lsn
