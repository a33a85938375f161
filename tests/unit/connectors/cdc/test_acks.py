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
