"""Tests for the streaming replication CopyData envelope, on bytes captured from PostgreSQL 15."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from connectors.cdc.lsn import Lsn
from connectors.cdc.replication_messages import (
    PG_EPOCH,
    PrimaryKeepalive,
    ReplicationProtocolError,
    XLogData,
    from_pg_timestamp,
    parse_copy_data,
    standby_status_update,
    to_pg_timestamp,
)

# Captured from a PostgreSQL 15 walsender streaming a pgoutput slot.
KEEPALIVE = bytes.fromhex("6b000000000152a7580003046b2fcdcacd00")
XLOG_BEGIN = bytes.fromhex(
    "77000000000152a758000000000152a7580003046b2fcdcbd542000000000152a7980003046b2fcdb661000002d6"
)
# pgoutput's Relation messages go out with wal_start = wal_end = 0/0.
XLOG_RELATION = bytes.fromhex(
    "77000000000000000000000000000000000003046b2fcdcbed"
    "52000040007075626c69630074006400010069640000000017ffffffff"
)


def test_parses_captured_keepalive() -> None:
    message = parse_copy_data(KEEPALIVE)
    assert message == PrimaryKeepalive(
        wal_end=Lsn.parse("0/152A758"),
        send_time=datetime(2026, 11, 29, 16, 2, 20, 159693, tzinfo=UTC),
        reply_requested=False,
    )


def test_keepalive_reply_requested_flag() -> None:
    message = parse_copy_data(KEEPALIVE[:-1] + b"\x01")
    assert isinstance(message, PrimaryKeepalive)
    assert message.reply_requested is True


def test_parses_captured_xlogdata() -> None:
    message = parse_copy_data(XLOG_BEGIN)
    assert isinstance(message, XLogData)
    assert message.wal_start == Lsn.parse("0/152A758")
    assert message.wal_end == Lsn.parse("0/152A758")
    assert message.send_time == datetime(2026, 11, 29, 16, 2, 20, 159957, tzinfo=UTC)
    assert message.payload == XLOG_BEGIN[25:]
    assert message.payload[:1] == b"B"


def test_accepts_memoryview_and_copies_payload() -> None:
    buffer = bytearray(XLOG_RELATION)
    message = parse_copy_data(memoryview(buffer))
    assert isinstance(message, XLogData)
    assert message.wal_start == Lsn.ZERO
    buffer[25] = 0  # the payload must not alias libpq's buffer
    assert type(message.payload) is bytes
    assert message.payload[:1] == b"R"


def test_xlogdata_with_empty_payload() -> None:
    message = parse_copy_data(XLOG_BEGIN[:25])
    assert isinstance(message, XLogData)
    assert message.payload == b""


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "empty"),
        (XLOG_BEGIN[:24], "XLogData too short"),
        (KEEPALIVE[:-1], "keepalive must be 18 bytes"),
        (KEEPALIVE + b"\x00", "keepalive must be 18 bytes"),
        (b"r" + KEEPALIVE[1:], "unknown CopyData message type b'r'"),
        (b"d" + XLOG_BEGIN[1:], "unknown CopyData message type b'd'"),
        (b"k" + b"\x00" * 8 + b"\x7f" + b"\xff" * 7 + b"\x00", "timestamp out of range"),
    ],
)
def test_rejects_unknown_or_malformed(data: bytes, match: str) -> None:
    with pytest.raises(ReplicationProtocolError, match=match):
        parse_copy_data(data)


def test_standby_status_update_layout() -> None:
    now = PG_EPOCH + timedelta(seconds=1, microseconds=2)
    message = standby_status_update(
        Lsn.parse("1/2"), Lsn.parse("3/4"), Lsn.parse("5/6"), now, reply_requested=True
    )
    assert message == (
        b"r"
        + bytes.fromhex("0000000100000002")
        + bytes.fromhex("0000000300000004")
        + bytes.fromhex("0000000500000006")
        + (1_000_002).to_bytes(8, "big")
        + b"\x01"
    )


def test_standby_status_update_defaults_to_no_reply() -> None:
    moment = datetime(2026, 11, 29, 16, 2, 20, 159693, tzinfo=UTC)
    message = standby_status_update(Lsn.ZERO, Lsn.ZERO, Lsn.ZERO, moment)
    assert len(message) == 34
    assert message[-1] == 0
    # Same clock encoding as the server's: the captured keepalive's send_time.
    assert message[25:33] == KEEPALIVE[9:17]


def test_timestamps_convert_both_ways_and_respect_offsets() -> None:
    assert from_pg_timestamp(0) == datetime(2000, 1, 1, tzinfo=UTC)
    assert from_pg_timestamp(-1) == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    brasilia = timezone(timedelta(hours=-3))
    assert to_pg_timestamp(datetime(2000, 1, 1, 0, 0, 1, tzinfo=brasilia)) == (3 * 3600 + 1) * 10**6
    value = 848_419_340_159_693
    assert to_pg_timestamp(from_pg_timestamp(value)) == value


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        to_pg_timestamp(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        standby_status_update(Lsn.ZERO, Lsn.ZERO, Lsn.ZERO, datetime(2026, 1, 1))
