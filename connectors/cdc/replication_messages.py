"""Sans-IO parsing and building of streaming replication CopyData messages.

Once ``START_REPLICATION`` succeeds the connection is in COPY BOTH mode and every
message in either direction is the body of a CopyData ('d') message whose first
byte says what it carries. The server sends XLogData ('w') and primary
keepalives ('k'); the client sends standby status updates ('r'). This module
turns those bodies into typed values and back, without touching a socket, so it
is unit-tested with plain bytes. All integers are big-endian (network order).

See https://www.postgresql.org/docs/15/protocol-replication.html
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from connectors.cdc.lsn import Lsn

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
"""PostgreSQL timestamps on the wire are microseconds since this instant."""

PG_EPOCH_UNIX_S = 946_684_800
""":data:`PG_EPOCH` in seconds since the Unix epoch (what ``time.time()`` counts from)."""

_ONE_MICROSECOND = timedelta(microseconds=1)

# 'w' + Int64 wal_start + Int64 wal_end + Int64 send_time, then the payload.
_XLOG_HEADER = struct.Struct(">cQQq")
# 'k' + Int64 wal_end + Int64 send_time + Byte1 reply_requested.
_KEEPALIVE = struct.Struct(">cQqB")
# 'r' + Int64 write + Int64 flush + Int64 apply + Int64 client_time + Byte1 reply_requested.
_STATUS_UPDATE = struct.Struct(">cQQQqB")

VIEW_MIN_BYTES = 64 * 1024
"""An XLogData payload at least this large stays a ``memoryview`` of the CopyData message
instead of being copied into ``bytes``: a 64 MB row costs one copy of itself (libpq's),
not two. Smaller ones are copied (cheap, and ``bytes`` is the decoder's fast path)."""


class ReplicationProtocolError(ValueError):
    """The server sent a CopyData body this client does not understand.

    A broken invariant, not a transient fault: the relay crashes rather than
    skip WAL it cannot read.
    """

    retriable = False


def from_pg_timestamp(microseconds: int) -> datetime:
    """Convert a wire timestamp (Int64 microseconds since 2000-01-01 UTC) to an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=microseconds)


def pg_timestamp_to_unix(microseconds: int) -> float:
    """A wire timestamp as ``time.time()`` seconds, by arithmetic (no datetime is built)."""
    return PG_EPOCH_UNIX_S + microseconds / 1_000_000


def to_pg_timestamp(moment: datetime) -> int:
    """Convert an aware datetime to wire microseconds since 2000-01-01 UTC."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        # A naive datetime would silently be taken as UTC or local time: refuse.
        raise ValueError("timestamp must be timezone-aware")
    return (moment - PG_EPOCH) // _ONE_MICROSECOND


class XLogData:
    """A chunk of WAL, or for logical replication one output-plugin message ('w').

    The relay's hot path builds one per row, so it keeps the header's wire
    integers and converts on access: no :class:`Lsn` or ``datetime`` is made
    for a message whose positions nobody reads (a frozen dataclass with two
    Lsn fields and a datetime cost ~3 µs per message; this ~0.3 µs).
    """

    __slots__ = ("payload", "send_time_us", "wal_end_value", "wal_start_value")

    def __init__(
        self,
        wal_start_value: int,
        wal_end_value: int,
        send_time_us: int,
        payload: bytes | memoryview,
    ) -> None:
        self.wal_start_value = wal_start_value
        """Where this message's data starts in the WAL (see :attr:`wal_start`)."""
        self.wal_end_value = wal_end_value
        self.send_time_us = send_time_us
        """The server's send time: microseconds since 2000-01-01 UTC (see :attr:`send_time`)."""
        self.payload = payload
        """For a logical slot: one message of the output plugin (here pgoutput); a
        ``memoryview`` when it is :data:`VIEW_MIN_BYTES` or more (see :func:`parse_copy_data`)."""

    @classmethod
    def of(cls, wal_start: Lsn, wal_end: Lsn, send_time: datetime, payload: bytes) -> XLogData:
        """Build one from typed values (tests, fakes)."""
        return cls(wal_start.value, wal_end.value, to_pg_timestamp(send_time), payload)

    @property
    def wal_start(self) -> Lsn:
        """Where this message's data starts in the WAL."""
        return Lsn(self.wal_start_value)

    @property
    def wal_end(self) -> Lsn:
        """The current end of WAL on the server when it sent this."""
        return Lsn(self.wal_end_value)

    @property
    def send_time(self) -> datetime:
        try:
            return from_pg_timestamp(self.send_time_us)
        except OverflowError as exc:
            raise ReplicationProtocolError(f"timestamp out of range in XLogData: {exc}") from exc

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, XLogData):
            return NotImplemented
        return (
            self.wal_start_value == other.wal_start_value
            and self.wal_end_value == other.wal_end_value
            and self.send_time_us == other.send_time_us
            and self.payload == other.payload
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"XLogData(wal_start={self.wal_start}, wal_end={self.wal_end}, "
            f"send_time_us={self.send_time_us}, payload={bytes(self.payload[:16])!r}...)"
        )


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """A heartbeat from the server ('k'); may ask the client to reply at once."""

    wal_end: Lsn
    send_time: datetime
    reply_requested: bool
    """If true the server disconnects after wal_sender_timeout unless a status update arrives."""


def parse_copy_data(data: bytes | bytearray | memoryview) -> XLogData | PrimaryKeepalive:
    """Parse the body of one server-to-client CopyData message.

    Layouts (after the 1-byte tag)::

        'w' XLogData         Int64 wal_start, Int64 wal_end, Int64 send_time, Byte[n] payload
        'k' PrimaryKeepalive Int64 wal_end, Int64 send_time, Byte1 reply_requested (0 or 1)

    Raises :class:`ReplicationProtocolError` on any other tag or a short message.

    A payload of :data:`VIEW_MIN_BYTES` or more from a ``memoryview`` stays a view of it,
    not a copy. That is safe for what psycopg's ``PGconn.get_copy_data`` returns: a view
    that owns its memory (the C implementation's ``PQBuffer``, freed with ``PQfreemem``
    when the last view of it goes; the ctypes one's ``bytes``), never reused by libpq.
    A caller that reuses its buffer must pass ``bytes``. Smaller payloads are copied.
    """
    if len(data) == 0:
        raise ReplicationProtocolError("empty CopyData message")
    tag = data[0]
    try:
        if tag == 0x77:  # 'w'
            if len(data) < _XLOG_HEADER.size:
                raise ReplicationProtocolError(
                    f"XLogData too short: {len(data)} bytes, header needs {_XLOG_HEADER.size}"
                )
            _, start, end, sent = _XLOG_HEADER.unpack_from(data)
            payload = data[_XLOG_HEADER.size :]
            if type(payload) is not memoryview or len(payload) < VIEW_MIN_BYTES:
                payload = bytes(payload)
            return XLogData(start, end, sent, payload)
        if tag == 0x6B:  # 'k'
            if len(data) != _KEEPALIVE.size:
                raise ReplicationProtocolError(
                    f"primary keepalive must be {_KEEPALIVE.size} bytes, got {len(data)}"
                )
            _, end, sent, reply = _KEEPALIVE.unpack_from(data)
            return PrimaryKeepalive(
                wal_end=Lsn(end), send_time=from_pg_timestamp(sent), reply_requested=reply != 0
            )
    except OverflowError as exc:
        # A send_time beyond datetime's range: the bytes are not what we think.
        raise ReplicationProtocolError(f"timestamp out of range in CopyData: {exc}") from exc
    raise ReplicationProtocolError(
        f"unknown CopyData message type {bytes([tag])!r} ({len(data)} bytes)"
    )


def standby_status_update(
    write: Lsn, flush: Lsn, apply: Lsn, now: datetime, reply_requested: bool = False
) -> bytes:
    """Build a standby status update ('r'), the client's acknowledgement of WAL.

    Layout::

        'r' Int64 write, Int64 flush, Int64 apply, Int64 client_time, Byte1 reply_requested

    Each LSN is "the last WAL byte + 1" processed, i.e. for logical replication
    the ``end_lsn`` of the last committed transaction the client has made
    durable. For a logical slot the server stores ``flush`` as the slot's
    ``confirmed_flush_lsn`` and restarts decoding from it after a reconnect.
    """
    return _STATUS_UPDATE.pack(
        b"r",
        write.value,
        flush.value,
        apply.value,
        to_pg_timestamp(now),
        1 if reply_requested else 0,
    )
