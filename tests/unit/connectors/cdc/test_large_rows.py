"""Size before parse: a row with a value over ``max_record_bytes`` is rejected unparsed.

The decoder (:mod:`connectors.cdc.pgoutput`) leaves such a value undecoded, the relay
turns the row into :func:`~connectors.cdc.outbox_rows.oversized_rejection` without ever
calling ``orjson.loads`` on it, and large WAL messages stay a view of libpq's buffer
(:func:`~connectors.cdc.replication_messages.parse_copy_data`). The boundary is exact:
a value of exactly ``max_record_bytes`` is decoded and parsed, one byte more is not.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

import connectors.cdc.outbox_rows as outbox_rows
from connectors.cdc.outbox_rows import (
    TRUNCATION_MARKER,
    oversized_rejection,
    reduced_rejection,
    with_cut_values,
)
from connectors.cdc.pgoutput import Column, Insert, OversizedValue, PgOutputDecoder, Relation
from connectors.cdc.replication_messages import VIEW_MIN_BYTES, XLogData, parse_copy_data
from streams.kernel.contract import INTENTS, INVALID
from tests.unit.connectors.cdc.test_relay_loop import (
    COMMIT_TS,
    DEADLINE_S,
    OUTBOX,
    SLOT_CONFIRMED,
    Harness,
    _xlog,
    encode_begin,
    encode_commit,
    encode_relation,
    until,
)

LIMIT = 4096
"""``max_record_bytes`` in these tests (its smallest allowed value)."""


def _insert(oid: int, values: Iterable[bytes | None]) -> bytes:
    # 'I' | Int32 oid | Byte1 'N' | TupleData (Int16 n, then 'n' or 't' Int32 len Byte[len])
    cells = list(values)
    out = bytearray(struct.pack(">cIch", b"I", oid, b"N", len(cells)))
    for value in cells:
        out += b"n" if value is None else b"t" + struct.pack(">i", len(value)) + value
    return bytes(out)


def _payload_of(size: int) -> bytes:
    """A valid text intent's payload of exactly ``size`` bytes (the rest is extra data)."""
    head = b'{"type": "text", "to": "+5511987650000", "text": "hi", "extra": "'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def _row(job_id: int, payload: bytes) -> list[bytes | None]:
    return [str(job_id).encode(), b"inst-1", f"key-{job_id}".encode(), payload, None, None]


def _decoder(**options: Any) -> PgOutputDecoder:
    decoder = PgOutputDecoder(**options)
    decoder.decode(encode_relation(OUTBOX))
    return decoder


# --- the decoder ------------------------------------------------------------------------


def test_a_value_over_the_limit_is_set_aside_undecoded_and_the_boundary_is_exact() -> None:
    decoder = _decoder(max_value_bytes=LIMIT, oversized_head_bytes=16)
    at_limit = decoder.decode(_insert(OUTBOX.oid, _row(1, _payload_of(LIMIT))))
    assert isinstance(at_limit, Insert)
    assert at_limit.oversized is None
    assert at_limit.new["payload"] == _payload_of(LIMIT).decode()

    # One byte more, and bytes that are not UTF-8 after the head: decoding it would raise.
    over = _payload_of(LIMIT)[:16] + b"\xff" * (LIMIT + 1 - 16)
    message = decoder.decode(_insert(OUTBOX.oid, _row(2, over)))
    assert isinstance(message, Insert)
    assert "payload" not in message.new  # never mistaken for NULL
    assert message.oversized == {"payload": OversizedValue(size=LIMIT + 1, head=over[:16].decode())}
    assert message.new["idempotency_key"] == "key-2"


def test_the_head_drops_a_character_cut_in_two() -> None:
    decoder = _decoder(max_value_bytes=8, oversized_head_bytes=5)
    message = decoder.decode(_insert(OUTBOX.oid, _row(1, "abcd\u00e9fghij".encode())))
    assert isinstance(message, Insert) and message.oversized is not None
    assert message.oversized["payload"] == OversizedValue(size=11, head="abcd")


def test_kept_columns_are_capped_and_a_complete_decode_keeps_the_cap() -> None:
    decoder = PgOutputDecoder(
        columns={"outbox_jobs": {"id", "payload"}}, max_value_bytes=LIMIT, oversized_head_bytes=4
    )
    decoder.decode(encode_relation(OUTBOX))
    big = b"y" * (LIMIT + 1)
    # A column the caller did not keep is stepped over, whatever its size.
    row = [b"1", b"inst-1", big, _payload_of(100), None, None]
    kept = decoder.decode(_insert(OUTBOX.oid, row))
    assert isinstance(kept, Insert)
    assert kept.oversized is None and kept.new == {"id": "1", "payload": _payload_of(100).decode()}
    # ... and set aside, undecoded, when every column is decoded.
    full = decoder.decode_complete(_insert(OUTBOX.oid, row))
    assert isinstance(full, Insert) and full.complete
    assert full.oversized == {"idempotency_key": OversizedValue(size=LIMIT + 1, head="yyyy")}
    # A kept column over the limit is set aside as well.
    row = [b"1", b"inst-1", b"key-1", big, None, None]
    message = decoder.decode(_insert(OUTBOX.oid, row))
    assert isinstance(message, Insert) and message.oversized is not None
    assert set(message.oversized) == {"payload"} and "payload" not in message.new


def test_without_a_limit_every_value_is_decoded() -> None:
    decoder = _decoder()
    message = decoder.decode(_insert(OUTBOX.oid, _row(1, _payload_of(100_000))))
    assert isinstance(message, Insert) and message.oversized is None
    assert len(message.new["payload"] or "") == 100_000


def test_an_insert_decodes_the_same_from_a_memoryview() -> None:
    payload = _insert(OUTBOX.oid, _row(7, _payload_of(500)))
    from_bytes = _decoder(max_value_bytes=LIMIT).decode(payload)
    from_view = _decoder(max_value_bytes=LIMIT).decode(memoryview(payload))
    assert from_view == from_bytes
    # Other messages are read from a copy: a Relation from a view is the same Relation.
    assert PgOutputDecoder().decode(memoryview(encode_relation(OUTBOX))) == OUTBOX


# --- the CopyData message ---------------------------------------------------------------


def _copy_data(payload: bytes) -> bytes:
    return struct.pack(">cQQq", b"w", 1, 2, 3) + payload


def test_a_large_payload_stays_a_view_of_the_message_and_a_small_one_is_copied() -> None:
    large = memoryview(_copy_data(b"I" * VIEW_MIN_BYTES))
    message = parse_copy_data(large)
    assert isinstance(message, XLogData)
    assert type(message.payload) is memoryview
    assert message.payload.obj is large.obj  # the same memory: no copy
    assert len(message.payload) == VIEW_MIN_BYTES
    small = parse_copy_data(memoryview(_copy_data(b"I" * (VIEW_MIN_BYTES - 1))))
    assert isinstance(small, XLogData) and type(small.payload) is bytes
    assert repr(message).endswith("payload=b'IIIIIIIIIIIIIIII'...)")


# --- the rejection ----------------------------------------------------------------------


def test_an_oversized_rejection_names_size_and_setting_and_carries_the_head() -> None:
    value = OversizedValue(size=8_388_670, head="[" + "x" * 200)
    record = oversized_rejection(
        row={"id": "42", "instance_id": "inst-1", "idempotency_key": "k"},
        oversized={"payload": value},
        job_id_column="id",
        limit_bytes=262_144,
        lsn="0/1000",
        committed_at=None,
        max_record_bytes=LIMIT,
        max_value_bytes=100,
    )
    assert record.job_id == 42
    assert record.reason == (
        "payload is 8388670 bytes, over the relay's ZAPSTREAM_RELAY_MAX_RECORD_BYTES "
        "(262144): rejected unparsed"
    )
    # Cut to max_value_bytes, and the marker still gives the value's full size.
    assert record.row["payload"] == "[" + "x" * 99 + TRUNCATION_MARKER.format(size=8_388_670)
    assert record.row["idempotency_key"] == "k"
    assert len(record.dumps()) <= LIMIT


def test_cutting_a_cut_value_keeps_its_full_size() -> None:
    row = with_cut_values({"id": "1"}, {"payload": OversizedValue(size=999_999, head="a" * 300)})
    for limit in (400, 64):
        reduced = reduced_rejection(
            job_id=1,
            reason="r",
            row=row,
            lsn="0/1",
            committed_at=None,
            max_record_bytes=LIMIT,
            max_value_bytes=limit,
        )
        expected_head = "a" * min(300, limit)
        assert reduced.row["payload"] == expected_head + TRUNCATION_MARKER.format(size=999_999)
    # A value that merely ends like a marker, without a size, is cut like any other.
    odd = "b" * 100 + TRUNCATION_MARKER.format(size="many")
    reduced = reduced_rejection(
        job_id=1,
        reason="r",
        row={"payload": odd},
        lsn="0/1",
        committed_at=None,
        max_record_bytes=LIMIT,
        max_value_bytes=10,
    )
    assert reduced.row["payload"] == "b" * 10 + TRUNCATION_MARKER.format(size=len(odd))


# --- the relay --------------------------------------------------------------------------


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every text ``outbox_rows`` hands to ``orjson.loads``."""
    sizes: list[int] = []

    def counting(data: Any) -> Any:
        sizes.append(len(data))
        return orjson.loads(data)

    # Only outbox_rows' own name: the test's orjson stays the real one.
    counted = SimpleNamespace(
        loads=counting, dumps=orjson.dumps, JSONDecodeError=orjson.JSONDecodeError
    )
    monkeypatch.setattr(outbox_rows, "orjson", counted)
    return sizes


async def _relay(rows: list[list[bytes | None]], **settings: Any) -> Harness:
    h = Harness(max_record_bytes=LIMIT, rejected_value_max_bytes=256, **settings)
    commit_lsn = SLOT_CONFIRMED + 0x1000
    end_lsn = commit_lsn + 0x30
    h.source.push(
        _xlog(encode_relation(OUTBOX), SLOT_CONFIRMED),
        _xlog(encode_begin(commit_lsn, COMMIT_TS, 900), commit_lsn),
        *(_xlog(_insert(OUTBOX.oid, row), commit_lsn) for row in rows),
        _xlog(encode_commit(commit_lsn, end_lsn, COMMIT_TS), end_lsn),
    )
    async with h.running() as task:
        await until(lambda: len(h.producer.sent) == len(rows), f"{len(rows)} sends")
        for sent in h.producer.sent:
            sent.future.set_result(None)
        await until(lambda: end_lsn in h.source.flushes, "the transaction confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    return h


async def test_the_relay_rejects_an_oversized_payload_without_parsing_it(
    parsed: list[int],
) -> None:
    huge = _payload_of(LIMIT + 1)
    h = await _relay([_row(100, huge), _row(101, _payload_of(LIMIT))])
    rejected, accepted = h.producer.sent
    assert rejected.topic == INVALID and len(rejected.value) <= LIMIT
    record = orjson.loads(rejected.value)
    assert record["job_id"] == 100
    assert record["reason"] == (
        f"payload is {LIMIT + 1} bytes, over the relay's ZAPSTREAM_RELAY_MAX_RECORD_BYTES "
        f"({LIMIT}): rejected unparsed"
    )
    assert record["lsn"] == str(SLOT_CONFIRMED + 0x1000)
    assert record["row"]["idempotency_key"] == "key-100"
    assert record["row"]["payload"] == huge[:256].decode() + TRUNCATION_MARKER.format(
        size=LIMIT + 1
    )
    # The row at the limit exactly is parsed and sent, without its extra data.
    assert accepted.topic == INTENTS
    assert orjson.loads(accepted.value)["job_id"] == 101
    assert parsed == [LIMIT], "only the payload at the limit reached orjson.loads"
    assert h.relay.stats.rejected == 1 and h.relay.stats.intents == 1
    assert h.relay.stats.reduced == 1


async def test_any_column_over_the_limit_rejects_the_row_unparsed(parsed: list[int]) -> None:
    row = _row(200, _payload_of(100))
    row[2] = b"k" * (LIMIT + 10)
    h = await _relay([row])
    (sent,) = h.producer.sent
    record = orjson.loads(sent.value)
    assert sent.topic == INVALID and record["job_id"] == 200
    assert record["reason"].startswith(f"idempotency_key is {LIMIT + 10} bytes, over")
    assert parsed == []


def test_a_64mb_value_costs_no_decoded_copy() -> None:
    # 64 MB as in the integration test: the decoder holds only the head of it.
    value = b"z" * (64 * 1024 * 1024)
    payload = memoryview(_insert(OUTBOX.oid, _row(1, value)))
    message = _decoder(max_value_bytes=256 * 1024, oversized_head_bytes=4096).decode(payload)
    assert isinstance(message, Insert) and message.oversized is not None
    assert message.oversized["payload"].size == len(value)
    assert len(message.oversized["payload"].head) == 4096
    assert all(len(v or "") < 100 for v in message.new.values())


COMMANDS = Relation(
    oid=16420,
    namespace="public",
    name="outbox_commands",
    replica_identity="d",
    columns=tuple(
        Column(flags=1 if name == "id" else 0, name=name, type_oid=25, type_modifier=-1)
        for name in ("id", "job_id", "command", "payload")
    ),
)


async def test_an_oversized_command_row_names_its_job_and_keeps_the_command() -> None:
    # The reprocess of a job whose payload is too large: rejected the same way, unparsed;
    # the rejection names the job (job_id) and keeps "command", so the sink leaves the job be.
    h = Harness(max_record_bytes=LIMIT, rejected_value_max_bytes=256)
    commit_lsn = SLOT_CONFIRMED + 0x1000
    end_lsn = commit_lsn + 0x30
    row = [b"9", b"77", b"reprocess", _payload_of(LIMIT + 1)]
    h.source.push(
        _xlog(encode_relation(COMMANDS), SLOT_CONFIRMED),
        _xlog(encode_begin(commit_lsn, COMMIT_TS, 900), commit_lsn),
        _xlog(_insert(COMMANDS.oid, row), commit_lsn),
        _xlog(encode_commit(commit_lsn, end_lsn, COMMIT_TS), end_lsn),
    )
    async with h.running() as task:
        await until(lambda: len(h.producer.sent) == 1, "one send")
        h.producer.sent[0].future.set_result(None)
        await until(lambda: end_lsn in h.source.flushes, "the transaction confirmed")
        h.relay.request_stop()
        await asyncio.wait_for(task, DEADLINE_S)
    (sent,) = h.producer.sent
    record = orjson.loads(sent.value)
    assert sent.topic == INVALID and sent.key == b"77"
    assert record["job_id"] == 77
    assert record["row"]["command"] == "reprocess" and record["row"]["id"] == "9"
    assert record["reason"].startswith(f"payload is {LIMIT + 1} bytes, over the relay's")
