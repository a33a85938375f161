"""AckTracker: confirm only contiguous, fully acknowledged transactions."""

import pytest

from connectors.cdc.acks import AckOrderError, AckTracker
from connectors.cdc.lsn import Lsn


def test_confirms_only_after_every_record_of_a_transaction_is_acked() -> None:
    t = AckTracker(Lsn(100))
    txn = t.begin()
    t.record_sent(txn)
    t.record_sent(txn)
    t.commit(txn, Lsn(200))
    assert t.confirmed == Lsn(100)
    t.record_acked(txn)
    assert t.confirmed == Lsn(100)
    t.record_acked(txn)
    assert t.confirmed == Lsn(200)


def test_later_transaction_acked_first_waits_for_the_earlier_one() -> None:
    t = AckTracker(Lsn(0))
    first = t.begin()
    t.record_sent(first)
    t.commit(first, Lsn(10))
    second = t.begin()
    t.record_sent(second)
    t.commit(second, Lsn(20))
    t.record_acked(second)
    assert t.confirmed == Lsn(0)
    t.record_acked(first)
    assert t.confirmed == Lsn(20)


def test_ack_before_commit_does_not_confirm_an_open_transaction() -> None:
    t = AckTracker(Lsn(0))
    txn = t.begin()
    t.record_sent(txn)
    t.record_acked(txn)
    assert t.confirmed == Lsn(0)
    t.commit(txn, Lsn(5))
    assert t.confirmed == Lsn(5)


def test_empty_transaction_confirms_at_commit() -> None:
    t = AckTracker(Lsn(0))
    t.commit(t.begin(), Lsn(7))
    assert t.confirmed == Lsn(7)


def test_keepalive_advances_only_when_nothing_is_outstanding() -> None:
    t = AckTracker(Lsn(0))
    txn = t.begin()
    t.keepalive(Lsn(50))
    assert t.confirmed == Lsn(0)
    t.record_sent(txn)
    t.commit(txn, Lsn(60))
    t.keepalive(Lsn(70))
    assert t.confirmed == Lsn(0)
    t.record_acked(txn)
    t.keepalive(Lsn(80))
    assert t.confirmed == Lsn(80)
    t.keepalive(Lsn(40))
    assert t.confirmed == Lsn(80)


def test_broken_invariants_raise() -> None:
    t = AckTracker(Lsn(0))
    txn = t.begin()
    with pytest.raises(AckOrderError):
        t.begin()
    with pytest.raises(AckOrderError):
        t.record_acked(txn)
    t.commit(txn, Lsn(1))
    with pytest.raises(AckOrderError):
        t.commit(txn, Lsn(2))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_reports_each_transaction_once_at_its_last_ack_with_its_commit_time() -> None:
    clock = _Clock()
    seen: list[tuple[int, float]] = []
    t = AckTracker(Lsn(0), on_acknowledged=lambda ts, at: seen.append((ts, at)), clock=clock)
    first = t.begin(commit_ts_us=111)
    t.record_sent(first)
    t.record_sent(first)
    t.commit(first, Lsn(10))
    second = t.begin(commit_ts_us=222)
    t.record_sent(second)
    t.commit(second, Lsn(20))
    clock.now = 1000.5
    t.record_acked(first)
    assert seen == []
    clock.now = 1001.0
    t.record_acked(second)  # acknowledged before the earlier one: reported at once
    clock.now = 1002.0
    t.record_acked(first)
    assert seen == [(222, 1001.0), (111, 1002.0)]
    # The clock is read when a transaction's outstanding count reaches zero, not per record.
    assert clock.reads == 2


def test_transaction_acknowledged_before_its_commit_reports_the_ack_moment() -> None:
    clock = _Clock()
    seen: list[tuple[int, float]] = []
    t = AckTracker(Lsn(0), on_acknowledged=lambda ts, at: seen.append((ts, at)), clock=clock)
    txn = t.begin(commit_ts_us=5)
    t.record_sent(txn)
    clock.now = 1000.25
    t.record_acked(txn)
    t.record_sent(txn)  # a later row of the same transaction
    clock.now = 1000.75
    t.record_acked(txn)
    assert seen == []
    clock.now = 1009.0  # the Commit is read much later
    t.commit(txn, Lsn(9))
    assert seen == [(5, 1000.75)]


def test_transactions_without_records_are_not_reported() -> None:
    seen: list[tuple[int, float]] = []
    t = AckTracker(Lsn(0), on_acknowledged=lambda ts, at: seen.append((ts, at)), clock=_Clock())
    t.commit(t.begin(commit_ts_us=1), Lsn(7))
    assert seen == [] and t.confirmed == Lsn(7)


def test_a_batch_acknowledges_several_records_of_a_transaction_at_once() -> None:
    t = AckTracker(Lsn(0))
    txn = t.begin()
    for _ in range(3):
        t.record_sent(txn)
    t.commit(txn, Lsn(30))
    with pytest.raises(AckOrderError):
        t.record_acked(txn, 4)  # more than were sent
    with pytest.raises(AckOrderError):
        t.record_acked(txn, 0)
    t.record_acked(txn, 2)
    assert t.confirmed == Lsn(0) and t.records_outstanding == 1
    t.record_acked(txn, 1)
    assert t.confirmed == Lsn(30) and t.records_outstanding == 0
