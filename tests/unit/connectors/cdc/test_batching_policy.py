"""The relay's batching policy: when partition batches go once the source runs dry."""

from __future__ import annotations

import pytest

from connectors.cdc.publisher import BatchingPolicy, Linger

POLICY = BatchingPolicy(linger_s=0.002, hold_s=0.010, poll_s=0.0005, full_records=5_000)


def test_the_defaults_are_the_relays_measured_ones() -> None:
    assert BatchingPolicy() == POLICY


def test_a_dry_source_lingers_from_the_first_dry_read_then_sends() -> None:
    linger = Linger(POLICY)
    assert linger.wait(100.0, kafka_busy=False) == (pytest.approx(0.002), False)
    # Counted from the first dry read, not from each one: WAL trickling in must not
    # hold the batches back.
    assert linger.wait(100.0015, kafka_busy=False) == (pytest.approx(0.0005), False)
    assert linger.wait(100.002, kafka_busy=False) is None


def test_batches_keep_filling_while_kafka_answers_earlier_ones_up_to_the_hold() -> None:
    linger = Linger(POLICY)
    assert linger.wait(200.0, kafka_busy=True) == (0.0005, True)
    assert linger.wait(200.009, kafka_busy=True) == (0.0005, True)
    assert linger.wait(200.010, kafka_busy=True) is None
    # Kafka answered meanwhile: past the linger too, so they go.
    assert linger.wait(200.005, kafka_busy=False) is None


def test_reset_starts_a_new_dry_spell() -> None:
    linger = Linger(POLICY)
    assert linger.wait(300.0, kafka_busy=False) is not None
    assert linger.wait(300.003, kafka_busy=False) is None
    linger.reset()
    assert linger.wait(300.003, kafka_busy=False) == (pytest.approx(0.002), False)
