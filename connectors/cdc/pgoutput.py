"""Sans-IO decoder for PostgreSQL's ``pgoutput`` logical replication plugin.

Scope: protocol version 1 (``proto_version '1'``) as sent by PostgreSQL 15 to 18 (the
relay asks for nothing else; :mod:`connectors.cdc.relay` says why), with
tuple values in text format (the default; ``binary 'true'`` is not supported).
Every XLogData payload of a pgoutput slot is exactly one of the messages below.
Layouts are documented beside each parser; all integers are big-endian and
``String`` means a NUL-terminated string in the connection's client_encoding
(the replication connection sets UTF8). Reference:
https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html

Protocol version 1 never sends the streaming (``S``/``E``/``c``/``A``) or
two-phase (``b``/``P``/``K``/``r``/``p``) messages, and none of its messages
carry the leading Int32 xid that versions 2+ add inside streamed transactions.
Anything this decoder does not understand, including trailing bytes after a
message, raises :class:`PgOutputError`: the relay must crash on it rather than
skip WAL it cannot read and then acknowledge past it.

Text values are kept as ``str`` (``None`` for SQL NULL); converting them (e.g.
parsing a jsonb column with orjson) is the caller's business and costs nothing
for columns it ignores.

Sizes before values: with ``max_value_bytes`` an INSERT's text value longer than that
is never decoded. It is left out of :attr:`Insert.new` and described in
:attr:`Insert.oversized` by its byte length and a short head, so a 64 MB jsonb
value costs the process no more than the message that carries it (PostgreSQL
accepts jsonb values up to ~255 MB; the relay's caller rejects such a row on its
size, see :func:`connectors.cdc.outbox_rows.oversized_rejection`). A payload may
be a ``memoryview`` (the relay keeps large messages as a view of libpq's buffer,
see :func:`connectors.cdc.replication_messages.parse_copy_data`): tuple values
are decoded straight from it, with no intermediate copy of the message.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

from connectors.cdc.lsn import Lsn
from connectors.cdc.replication_messages import from_pg_timestamp, to_pg_timestamp

_U8 = struct.Struct(">B")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

# Fixed-size message bodies, tag byte included so unpack_from starts at 0.
_BEGIN = struct.Struct(">cQqI")  # 'B', final_lsn, commit_ts, xid
_COMMIT = struct.Struct(">cBQQq")  # 'C', flags, commit_lsn, end_lsn, commit_ts

_EMPTY_NAMES: frozenset[str] = frozenset()

TupleValues: TypeAlias = dict[str, str | None]
"""A row: column name -> text value, ``None`` for SQL NULL."""

Payload: TypeAlias = bytes | memoryview
"""One pgoutput message: ``bytes``, or a ``memoryview`` of a large one (never copied)."""


class PgOutputError(ValueError):
    """A pgoutput payload that is truncated, malformed or of an unsupported kind.

    A broken invariant (bug or misconfiguration), never retried.
    """

    retriable = False


@dataclass(frozen=True, slots=True)
class Column:
    """One column as described by a Relation message."""

    flags: int
    """Bit 1 set: the column is part of the replica identity (the key)."""
    name: str
    type_oid: int
    type_modifier: int
    """``atttypmod``: -1 when the type has none."""

    @property
    def is_key(self) -> bool:
        """Whether this column is part of the table's replica identity."""
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a transaction; its row changes follow, then a :class:`Commit`."""

    final_lsn: Lsn
    """LSN of the transaction's commit record (equals ``Commit.commit_lsn``)."""
    commit_ts_us: int
    """Commit time as on the wire: microseconds since 2000-01-01 UTC (see :attr:`commit_ts`)."""
    xid: int

    @property
    def commit_ts(self) -> datetime:
        return from_pg_timestamp(self.commit_ts_us)


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction."""

    flags: int
    """Unused by PostgreSQL 15; always 0."""
    commit_lsn: Lsn
    end_lsn: Lsn
    """End of the commit record: the LSN to confirm once the transaction is durable downstream."""
    commit_ts_us: int
    """Commit time as on the wire: microseconds since 2000-01-01 UTC (see :attr:`commit_ts`)."""

    @property
    def commit_ts(self) -> datetime:
        return from_pg_timestamp(self.commit_ts_us)


@dataclass(frozen=True, slots=True)
class Origin:
    """Replication origin of the transaction (sent only for changes replayed from elsewhere)."""

    commit_lsn: Lsn
    """Commit LSN on the origin server."""
    name: str


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape, sent before its first change in a session and after schema changes."""

    oid: int
    namespace: str
    """Schema name; the empty string stands for ``pg_catalog``."""
    name: str
    replica_identity: str
    """``relreplident``: 'd' default (primary key), 'n' nothing, 'f' full, 'i' index."""
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class TypeMessage:
    """A non-built-in data type used by a following Relation ('Y')."""

    oid: int
    namespace: str
    """Schema name; the empty string stands for ``pg_catalog``."""
    name: str


@dataclass(frozen=True, slots=True)
class OversizedValue:
    """A text value over the decoder's ``max_value_bytes``: its size and head, never the whole."""

    size: int
    """The value's length in bytes, as on the wire (UTF-8)."""
    head: str
    """Its first ``oversized_head_bytes`` bytes, decoded (a character cut at the end is dropped)."""


@dataclass(slots=True)
class Insert:
    """A new row.

    Not frozen: the relay decodes one per row, and a frozen dataclass sets each
    field through ``object.__setattr__`` (several times slower). Treat it as read-only.
    """

    relation: Relation
    new: TupleValues
    complete: bool = True
    """False when the decoder keeps only some of this table's columns (see
    :class:`PgOutputDecoder`): :attr:`new` then lacks the others."""
    oversized: Mapping[str, OversizedValue] | None = None
    """Text values over the decoder's ``max_value_bytes``, by column (None: none). They are
    *left out of* :attr:`new` (never decoded), so a caller can never mistake them for NULL."""


@dataclass(frozen=True, slots=True)
class Update:
    """A changed row.

    Unchanged TOASTed columns (large values the UPDATE did not touch) are not
    sent by the server; they are *left out of* :attr:`new` and listed in
    :attr:`unchanged_toast` so a caller can never mistake them for NULL.
    """

    relation: Relation
    new: TupleValues
    old: TupleValues | None
    """The old row, or only its key columns (see :attr:`old_is_key`), or None when not sent."""
    old_is_key: bool
    """True when :attr:`old` holds only the replica identity columns (the rest are None)."""
    unchanged_toast: frozenset[str]


@dataclass(frozen=True, slots=True)
class Delete:
    """A deleted row, identified by its key or (REPLICA IDENTITY FULL) its whole old value."""

    relation: Relation
    old: TupleValues
    old_is_key: bool
    """True when :attr:`old` holds only the replica identity columns (the rest are None)."""


@dataclass(frozen=True, slots=True)
class Truncate:
    """TRUNCATE of one or more tables."""

    relations: tuple[Relation, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A message from ``pg_logical_emit_message`` (sent only with ``messages 'true'``)."""

    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes


PgOutputMessage: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeMessage
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
)


_MIN_TS_US = to_pg_timestamp(datetime.min.replace(tzinfo=UTC))
_MAX_TS_US = to_pg_timestamp(datetime.max.replace(tzinfo=UTC))


def _check_timestamp(microseconds: int) -> None:
    # The timestamp stays an int (no datetime per transaction), but one that no
    # datetime can hold means we parsed the bytes wrong: refuse it here, as before.
    if not _MIN_TS_US <= microseconds <= _MAX_TS_US:
        raise PgOutputError(f"commit timestamp out of range: {microseconds} µs since 2000-01-01")


def _view_text(view: memoryview) -> str:
    # str(..., "utf-8") decodes a view without copying it into bytes first.
    return str(view, "utf-8")


def _tag(buf: Payload) -> bytes:
    """The message's type byte, for error messages (a memoryview's repr would not show it)."""
    return bytes(buf[:1])


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    """Read a NUL-terminated string at ``pos``; return it and the position after the NUL."""
    end = buf.find(0, pos)
    if end < 0:
        raise PgOutputError(f"unterminated string at offset {pos}")
    return buf[pos:end].decode(), end + 1


class PgOutputDecoder:
    """Turns pgoutput payloads into typed messages, keeping the Relation cache.

    pgoutput describes each table once per session (and again after a schema
    change) in a Relation message and then refers to it by OID alone, so the
    decoder must see every payload of the stream in order. A row change for an
    OID it has not seen described is an error, never a guess. One decoder per
    replication connection: after a reconnect the server resends Relations.

    ``columns`` (table name -> column names) makes INSERTs of those tables
    carry only the columns named (``Insert.complete`` False): the others are
    stepped over, not decoded. :meth:`decode_complete` decodes a payload again
    with every column, for the rare row that needs them all.

    ``max_value_bytes``: an INSERT's text value longer than this is not decoded but
    described in ``Insert.oversized`` (its size and its first ``oversized_head_bytes``
    bytes); None decodes every value whatever its size. UPDATE and DELETE tuples are
    always decoded whole (the relay's publication sends inserts only).
    """

    def __init__(
        self,
        columns: Mapping[str, Collection[str]] | None = None,
        *,
        max_value_bytes: int | None = None,
        oversized_head_bytes: int = 4096,
    ) -> None:
        if max_value_bytes is not None and max_value_bytes < 0:
            raise ValueError(f"max_value_bytes must be >= 0, got {max_value_bytes}")
        self._max_value = sys.maxsize if max_value_bytes is None else max_value_bytes
        self._head_bytes = max(0, oversized_head_bytes)
        self._relations: dict[int, Relation] = {}
        # Column names per OID, cached apart from Relation so the row hot path
        # does not rebuild them for every tuple.
        self._names: dict[int, tuple[str, ...]] = {}
        self._columns = {table: frozenset(names) for table, names in (columns or {}).items()}
        # Per OID of a table in ``columns``: each column's name, None if not kept.
        self._keep: dict[int, tuple[str | None, ...]] = {}
        self._parsers: dict[int, Callable[[bytes], PgOutputMessage]] = {
            ord("B"): self._begin,
            ord("C"): self._commit,
            ord("O"): self._origin,
            ord("R"): self._relation,
            ord("Y"): self._type,
            ord("I"): self._insert,
            ord("U"): self._update,
            ord("D"): self._delete,
            ord("T"): self._truncate,
            ord("M"): self._message,
        }

    @property
    def relations(self) -> Mapping[int, Relation]:
        """Relations seen so far, by OID (read-only view)."""
        return self._relations

    def decode(self, payload: Payload) -> PgOutputMessage:
        """Decode one pgoutput message (one XLogData payload, ``bytes`` or a ``memoryview``)."""
        if not payload:
            raise PgOutputError("empty pgoutput message")
        tag = payload[0]
        parser = self._parsers.get(tag)
        if parser is None:
            raise PgOutputError(
                f"unknown pgoutput message type {_tag(payload)!r} ({len(payload)} bytes); "
                "only protocol version 1 is supported"
            )
        try:
            if tag == 0x49:  # 'I'
                return self._insert(payload)
            # Only INSERTs are read from a view (they are what grows large); every other
            # message is small and its parser uses bytes methods (find).
            return parser(payload if type(payload) is bytes else bytes(payload))
        except PgOutputError:
            raise
        except (struct.error, IndexError) as exc:
            raise PgOutputError(
                f"truncated pgoutput {_tag(payload)!r} message ({len(payload)} bytes): {exc}"
            ) from exc
        except UnicodeDecodeError as exc:
            raise PgOutputError(
                f"invalid UTF-8 in pgoutput {_tag(payload)!r} message: {exc}"
            ) from exc
        except OverflowError as exc:
            raise PgOutputError(
                f"value out of range in pgoutput {_tag(payload)!r} message: {exc}"
            ) from exc

    @staticmethod
    def _end(buf: Payload, pos: int) -> None:
        # A message longer than its layout means we parsed it wrong (or the
        # server speaks a newer protocol): never ignore the rest.
        if pos != len(buf):
            raise PgOutputError(
                f"{len(buf) - pos} trailing bytes after pgoutput {_tag(buf)!r} message "
                f"({len(buf)} bytes)"
            )

    def _begin(self, buf: bytes) -> Begin:
        # 'B' | Int64 final_lsn | Int64 commit_ts (µs since 2000-01-01 UTC) | Int32 xid
        _, final_lsn, ts, xid = _BEGIN.unpack_from(buf)
        self._end(buf, _BEGIN.size)
        _check_timestamp(ts)
        return Begin(final_lsn=Lsn(final_lsn), commit_ts_us=ts, xid=xid)

    def _commit(self, buf: bytes) -> Commit:
        # 'C' | Int8 flags (0) | Int64 commit_lsn | Int64 end_lsn | Int64 commit_ts
        _, flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf)
        self._end(buf, _COMMIT.size)
        _check_timestamp(ts)
        return Commit(
            flags=flags, commit_lsn=Lsn(commit_lsn), end_lsn=Lsn(end_lsn), commit_ts_us=ts
        )

    def _origin(self, buf: bytes) -> Origin:
        # 'O' | Int64 commit_lsn on the origin | String origin name
        (lsn,) = _U64.unpack_from(buf, 1)
        name, pos = _cstring(buf, 9)
        self._end(buf, pos)
        return Origin(commit_lsn=Lsn(lsn), name=name)

    def _relation(self, buf: bytes) -> Relation:
        # 'R' | Int32 oid | String namespace | String name | Int8 replica identity
        #     | Int16 ncolumns | ncolumns x (Int8 flags | String name | Int32 type oid
        #     | Int32 atttypmod)
        (oid,) = _U32.unpack_from(buf, 1)
        namespace, pos = _cstring(buf, 5)
        name, pos = _cstring(buf, pos)
        (identity,) = _U8.unpack_from(buf, pos)
        (ncols,) = _I16.unpack_from(buf, pos + 1)
        pos += 3
        columns = []
        for _ in range(ncols):
            (flags,) = _U8.unpack_from(buf, pos)
            col_name, pos = _cstring(buf, pos + 1)
            (type_oid,) = _U32.unpack_from(buf, pos)
            (typmod,) = _I32.unpack_from(buf, pos + 4)
            pos += 8
            columns.append(Column(flags, col_name, type_oid, typmod))
        self._end(buf, pos)
        relation = Relation(
            oid=oid,
            namespace=namespace,
            name=name,
            replica_identity=chr(identity),
            columns=tuple(columns),
        )
        self._relations[oid] = relation
        self._names[oid] = tuple(c.name for c in columns)
        wanted = self._columns.get(name)
        if wanted is None:
            self._keep.pop(oid, None)
        else:
            self._keep[oid] = tuple(c.name if c.name in wanted else None for c in columns)
        return relation

    def _type(self, buf: bytes) -> TypeMessage:
        # 'Y' | Int32 type oid | String namespace | String type name
        (oid,) = _U32.unpack_from(buf, 1)
        namespace, pos = _cstring(buf, 5)
        name, pos = _cstring(buf, pos)
        self._end(buf, pos)
        return TypeMessage(oid=oid, namespace=namespace, name=name)

    def _lookup(self, buf: Payload, oid: int) -> Relation:
        try:
            return self._relations[oid]
        except KeyError:
            raise PgOutputError(
                f"pgoutput {_tag(buf)!r} message for relation oid {oid} that no Relation "
                "message described (payloads decoded out of order or by a fresh decoder "
                "mid-stream?)"
            ) from None

    def _tuple(
        self,
        buf: Payload,
        pos: int,
        oid: int,
        keep: tuple[str | None, ...] | None = None,
        capped: bool = False,
    ) -> tuple[TupleValues, frozenset[str], dict[str, OversizedValue] | None, int]:
        """Parse TupleData at ``pos``; return (values, unchanged TOAST columns, oversized, end).

        With ``keep`` (per column its name, None to skip it) only those are decoded.
        ``capped``: a text value over ``max_value_bytes`` goes to oversized, undecoded.
        """
        # TupleData: Int16 ncolumns, then per column one of
        #   'n'                       NULL
        #   'u'                       unchanged TOASTed value (UPDATE only; not sent)
        #   't' Int32 len Byte[len]   text representation
        #   'b' Int32 len Byte[len]   binary representation (only with binary 'true')
        names = self._names[oid]
        (ncols,) = _I16.unpack_from(buf, pos)
        if ncols != len(names):
            raise PgOutputError(
                f"tuple has {ncols} columns but relation {oid} was described with {len(names)}"
            )
        pos += 2
        size = len(buf)
        values: TupleValues = {}
        unchanged: frozenset[str] = _EMPTY_NAMES
        oversized: dict[str, OversizedValue] | None = None
        max_value = self._max_value if capped else sys.maxsize
        unpack_i32 = _I32.unpack_from
        # bytes.decode is the fast path; a memoryview (a large message) has no decode().
        text: Callable[[Any], str] = bytes.decode if type(buf) is bytes else _view_text
        if keep is not None:
            some = self._some(buf, pos, keep, max_value)
            if some is not None:
                return some[0], unchanged, None, some[1]
            # A value kind the filtered path does not handle, or a kept value too large:
            # the complete parse below decodes it, sets it aside or raises the precise error.
        for name in names:
            kind = buf[pos]
            if kind == 0x74:  # 't'
                (length,) = unpack_i32(buf, pos + 1)
                start = pos + 5
                pos = start + length
                if length < 0 or pos > size:
                    raise PgOutputError(
                        f"text value of column {name!r} claims {length} bytes, {size - start} left"
                    )
                if length > max_value:
                    if oversized is None:
                        oversized = {}
                    oversized[name] = self._oversized(buf, start, length)
                else:
                    values[name] = text(buf[start:pos])
            elif kind == 0x6E:  # 'n'
                values[name] = None
                pos += 1
            elif kind == 0x75:  # 'u'
                unchanged = unchanged | {name}
                pos += 1
            elif kind == 0x62:  # 'b'
                raise PgOutputError(
                    f"binary value for column {name!r}: this decoder expects text format "
                    "(do not start replication with binary 'true')"
                )
            else:
                raise PgOutputError(
                    f"unknown tuple value kind {bytes([kind])!r} for column {name!r} "
                    f"at offset {pos}"
                )
        return values, unchanged, oversized, pos

    def _oversized(self, buf: Payload, start: int, length: int) -> OversizedValue:
        head = buf[start : start + min(length, self._head_bytes)]
        # "ignore": the head may end inside a multi-byte character.
        return OversizedValue(size=length, head=str(head, "utf-8", "ignore"))

    @staticmethod
    def _some(
        buf: Payload, pos: int, keep: tuple[str | None, ...], max_value: int
    ) -> tuple[TupleValues, int] | None:
        """The kept columns' values and the end; None at anything but a sound text or NULL
        (or a kept value over ``max_value`` bytes)."""
        size = len(buf)
        values: TupleValues = {}
        unpack_i32 = _I32.unpack_from
        text: Callable[[Any], str] = bytes.decode if type(buf) is bytes else _view_text
        for name in keep:
            kind = buf[pos]
            if kind == 0x74:  # 't'
                (length,) = unpack_i32(buf, pos + 1)
                start = pos + 5
                pos = start + length
                if length < 0 or pos > size:
                    return None  # the complete parse below names the column
                if name is not None:
                    if length > max_value:
                        return None  # the complete parse sets it aside
                    values[name] = text(buf[start:pos])
            elif kind == 0x6E:  # 'n'
                if name is not None:
                    values[name] = None
                pos += 1
            else:
                return None
        return values, pos

    def kept_insert(self, payload: Payload) -> tuple[Relation, TupleValues] | None:
        """The relay's hot path: an INSERT of a table in ``columns``, as its kept values.

        What :meth:`decode` gives as ``Insert(relation, new, complete=False)`` for a sound
        INSERT of such a table with no value over ``max_value_bytes``, without the message
        object or the dispatch. None for anything else (another message or table, a
        ``memoryview``, a value it would set aside, anything malformed): :meth:`decode`
        it, which decodes, sets aside or raises the precise error as ever.
        """
        # 'I' | Int32 oid | Byte1 'N' | TupleData new  (TupleData: see _tuple)
        if type(payload) is not bytes:
            return None
        buf = payload
        try:
            if buf[0] != 0x49:  # 'I'
                return None
            (oid,) = _U32.unpack_from(buf, 1)
            keep = self._keep.get(oid)
            if keep is None or buf[5] != 0x4E or _I16.unpack_from(buf, 6)[0] != len(keep):
                return None
            found = self._some(buf, 8, keep, self._max_value)
            if found is None or found[1] != len(buf):
                return None
            return self._relations[oid], found[0]
        except (struct.error, IndexError, UnicodeDecodeError):
            return None

    def decode_complete(self, payload: Payload) -> PgOutputMessage:
        """:meth:`decode`, with every column of an INSERT whatever ``columns`` said.

        ``max_value_bytes`` still applies: an oversized value stays undecoded.
        """
        if not payload or payload[0] != 0x49:  # 'I'
            return self.decode(payload)
        keep = self._keep
        self._keep = {}
        try:
            return self.decode(payload)
        finally:
            self._keep = keep

    def _insert(self, buf: Payload) -> Insert:
        # 'I' | Int32 oid | Byte1 'N' | TupleData new
        # The relay's hot path (one call per outbox row): checks are inlined.
        (oid,) = _U32.unpack_from(buf, 1)
        relation = self._relations.get(oid)
        if relation is None:
            relation = self._lookup(buf, oid)  # raises
        if buf[5] != 0x4E:  # 'N'
            raise PgOutputError(f"INSERT: expected 'N' at offset 5, got {bytes(buf[5:6])!r}")
        keep = self._keep.get(oid)
        new, unchanged, oversized, pos = self._tuple(buf, 6, oid, keep, True)
        if unchanged:
            raise PgOutputError(f"INSERT with unchanged TOAST columns {sorted(unchanged)}")
        if pos != len(buf):
            self._end(buf, pos)  # raises
        return Insert(relation, new, keep is None, oversized)

    def _update(self, buf: bytes) -> Update:
        # 'U' | Int32 oid | [Byte1 'K' | TupleData old key] or [Byte1 'O' | TupleData old row]
        #     | Byte1 'N' | TupleData new
        # The old part is present only when the key changed ('K') or the table
        # has REPLICA IDENTITY FULL ('O').
        (oid,) = _U32.unpack_from(buf, 1)
        relation = self._lookup(buf, oid)
        pos = 5
        old: TupleValues | None = None
        marker = buf[pos]
        old_is_key = marker == 0x4B  # 'K'
        if marker in (0x4B, 0x4F):  # 'K', 'O'
            old, _, _, pos = self._tuple(buf, pos + 1, oid)
            marker = buf[pos]
        if marker != 0x4E:  # 'N'
            raise PgOutputError(f"UPDATE: expected 'N' at offset {pos}, got {buf[pos : pos + 1]!r}")
        new, unchanged, _, pos = self._tuple(buf, pos + 1, oid)
        self._end(buf, pos)
        return Update(
            relation=relation, new=new, old=old, old_is_key=old_is_key, unchanged_toast=unchanged
        )

    def _delete(self, buf: bytes) -> Delete:
        # 'D' | Byte1 'K' (key columns only) or 'O' (whole old row) | TupleData old
        (oid,) = _U32.unpack_from(buf, 1)
        relation = self._lookup(buf, oid)
        marker = buf[5]
        if marker not in (0x4B, 0x4F):
            raise PgOutputError(f"DELETE: expected 'K' or 'O' at offset 5, got {buf[5:6]!r}")
        old, _, _, pos = self._tuple(buf, 6, oid)
        self._end(buf, pos)
        return Delete(relation=relation, old=old, old_is_key=marker == 0x4B)

    def _truncate(self, buf: bytes) -> Truncate:
        # 'T' | Int32 nrelations | Int8 options (1 = CASCADE, 2 = RESTART IDENTITY)
        #     | nrelations x Int32 oid
        (count,) = _U32.unpack_from(buf, 1)
        (options,) = _U8.unpack_from(buf, 5)
        if 6 + 4 * count > len(buf):
            # Checked before unpacking so a corrupt count cannot build a huge format.
            raise PgOutputError(f"TRUNCATE claims {count} relations, {len(buf)} bytes in message")
        oids = struct.unpack_from(f">{count}I", buf, 6)
        self._end(buf, 6 + 4 * count)
        return Truncate(
            relations=tuple(self._lookup(buf, oid) for oid in oids),
            cascade=bool(options & 1),
            restart_identity=bool(options & 2),
        )

    def _message(self, buf: bytes) -> LogicalMessage:
        # 'M' | Int8 flags (1 = transactional) | Int64 lsn | String prefix
        #     | Int32 length | Byte[length] content
        (flags,) = _U8.unpack_from(buf, 1)
        (lsn,) = _U64.unpack_from(buf, 2)
        prefix, pos = _cstring(buf, 10)
        (length,) = _I32.unpack_from(buf, pos)
        start = pos + 4
        content = buf[start : start + length]
        if length < 0 or len(content) != length:
            raise PgOutputError(
                f"logical message content claims {length} bytes, {len(buf) - start} left"
            )
        self._end(buf, start + length)
        return LogicalMessage(
            transactional=bool(flags & 1), lsn=Lsn(lsn), prefix=prefix, content=content
        )
