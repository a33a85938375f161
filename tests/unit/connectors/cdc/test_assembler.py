"""The transaction assembler, sans-IO: pgoutput bytes in, transactions and records out.

No event loop anywhere here: the assembler is fed payloads built by the pgoutput
encoder of ``test_relay_loop`` and asserted on what it returns.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson

import connectors.cdc.assembler as assembler_module
from connectors.cdc.assembler import RowCaptured, TransactionAssembler, TxnBegun, TxnCommitted
from connectors.cdc.lsn import Lsn
from connectors.cdc.metrics import RelayStats
from connectors.cdc.outbox_rows import TRUNCATION_MARKER, CapturedIntent
from connectors.cdc.pgoutput import Column, Relation
from connectors.cdc.replication_messages import to_pg_timestamp
from connectors.cdc.settings import RelaySettings
from connectors.cdc.shaping import RecordShaper
from streams.kernel.contract import IntentRejected
from tests.unit.connectors.cdc.test_relay_loop import (
    COMMIT_TS,
    OUTBOX,
    Txn,
    encode_begin,
    encode_commit,
    encode_insert,
    encode_relation,
)

LIMIT = 4096


def _assembler(*, skip_before: Lsn | None = None) -> tuple[TransactionAssembler, RelayStats]:
    stats = RelayStats()
    shaper = RecordShaper(RelaySettings(max_record_bytes=LIMIT), stats)
    assembler = TransactionAssembler(
        shaper,
        max_value_bytes=LIMIT,
        oversized_head_bytes=16,
        skip_before=skip_before or Lsn(0),
    )
    assert assembler.feed(encode_relation(OUTBOX)) is None
    return assembler, stats


def _values(job_id: int, payload: str | None = None) -> list[str | None]:
    text = payload or orjson.dumps({"type": "text", "to": "5511987654321", "text": "hi"}).decode()
    return [str(job_id), "inst-1", f"key-{job_id}", text, "operational", None]


def test_the_module_is_sans_io() -> None:
    assert "asyncio" not in vars(assembler_module)
    source = Path(assembler_module.__file__).read_text()
    assert "import asyncio" not in source and "await " not in source


def test_a_transaction_is_begun_rows_captured_and_committed() -> None:
    assembler, _ = _assembler()
    txn = Txn(1)
    begun = assembler.feed(encode_begin(txn.commit_lsn, COMMIT_TS, 701))
    assert begun == TxnBegun(txn.commit_lsn, to_pg_timestamp(COMMIT_TS))
    assert assembler.lsn == str(txn.commit_lsn)
    assert assembler.committed_at == COMMIT_TS.isoformat()

    row = assembler.feed(encode_insert(OUTBOX.oid, _values(100)))
    assert isinstance(row, RowCaptured)
    assert row.table == "outbox_jobs" and not row.too_large
    assert isinstance(row.record, CapturedIntent)
    assert row.record.job_id == 100
    assert row.record.lsn == str(txn.commit_lsn)
    assert row.record.committed_at == COMMIT_TS.isoformat()
    assert row.row["idempotency_key"] == "key-100"

    committed = assembler.feed(encode_commit(txn.commit_lsn, txn.end_lsn, COMMIT_TS))
    assert committed == TxnCommitted(txn.end_lsn, skipped=False)


def test_a_row_breaking_a_rule_becomes_its_rejection() -> None:
    assembler, _ = _assembler()
    assembler.feed(encode_begin(Txn(1).commit_lsn, COMMIT_TS, 701))
    row = assembler.feed(encode_insert(OUTBOX.oid, _values(100, '{"type": "text"}')))
    assert isinstance(row, RowCaptured)
    assert isinstance(row.record, IntentRejected)
    assert row.record.job_id == 100 and row.record.reason
    assert not row.too_large


def test_a_table_outside_the_publication_yields_nothing() -> None:
    assembler, _ = _assembler()
    other = dataclasses.replace(OUTBOX, oid=17000, name="not_published")
    assert assembler.feed(encode_relation(other)) is None
    assembler.feed(encode_begin(Txn(1).commit_lsn, COMMIT_TS, 701))
    assert assembler.feed(encode_insert(other.oid, _values(100))) is None


def test_an_oversized_value_is_rejected_on_its_size_unparsed() -> None:
    assembler, stats = _assembler()
    assembler.feed(encode_begin(Txn(1).commit_lsn, COMMIT_TS, 701))
    huge = '{"type": "text", "to": "1", "text": "' + "x" * LIMIT + '"}'
    row = assembler.feed(encode_insert(OUTBOX.oid, _values(100, huge)))
    assert isinstance(row, RowCaptured) and row.too_large
    assert isinstance(row.record, IntentRejected)
    assert row.record.job_id == 100
    assert (
        "payload is" in row.record.reason
        and "ZAPSTREAM_RELAY_MAX_RECORD_BYTES" in row.record.reason
    )
    payload = row.row["payload"]
    assert payload is not None
    assert payload == huge[:16] + TRUNCATION_MARKER.format(size=len(huge))
    assert stats.reduced == 0  # counted when produced, not when assembled


def _wide_outbox() -> Relation:
    """outbox_jobs with a column the intent does not read (the decoder steps over it)."""
    extra = Column(flags=0, name="last_error", type_oid=25, type_modifier=-1)
    return dataclasses.replace(OUTBOX, columns=(*OUTBOX.columns, extra))


def test_a_row_decoded_in_part_is_completed_on_demand() -> None:
    assembler, _ = _assembler()
    wide = _wide_outbox()
    assembler.feed(encode_relation(wide))
    assembler.feed(encode_begin(Txn(1).commit_lsn, COMMIT_TS, 701))

    row = assembler.feed(encode_insert(wide.oid, [*_values(100), "PENDING"]))
    # Only the intent's columns were decoded: the others are stepped over.
    assert isinstance(row, RowCaptured) and not row.complete
    assert "last_error" not in row.row
    full = assembler.completed(row)
    assert full.complete and full.row["last_error"] == "PENDING"
    assert full.record is row.record  # the intent reads none of the other columns

    # A rejection carries the whole row: converted again from it.
    bad = assembler.feed(encode_insert(wide.oid, [*_values(101, "[]"), "PENDING"]))
    assert isinstance(bad, RowCaptured) and isinstance(bad.record, IntentRejected)
    assert "last_error" not in bad.record.row
    whole = assembler.completed(bad)
    assert isinstance(whole.record, IntentRejected)
    assert whole.record.row["last_error"] == "PENDING"
    assert whole.record.reason == bad.record.reason
    # A complete row is returned as it is.
    assert assembler.completed(whole) is whole


def _with_status() -> Relation:
    """outbox_jobs with its ``status`` column, which the relay decodes (SCHEDULED rows)."""
    status = Column(flags=0, name="status", type_oid=25, type_modifier=-1)
    return dataclasses.replace(OUTBOX, columns=(*OUTBOX.columns, status))


def test_a_scheduled_row_waits_for_its_release_and_a_broken_one_is_rejected_now() -> None:
    assembler, _ = _assembler()
    table = _with_status()
    assembler.feed(encode_relation(table))
    assembler.feed(encode_begin(Txn(1).commit_lsn, COMMIT_TS, 701))

    # Migration 0008's trigger made it SCHEDULED: nothing is produced for it now.
    assert assembler.feed(encode_insert(table.oid, [*_values(100), "SCHEDULED"])) is None
    # A broken scheduled row is rejected at once, not at its due time.
    bad = assembler.feed(encode_insert(table.oid, [*_values(101, "[]"), "SCHEDULED"]))
    assert isinstance(bad, RowCaptured) and isinstance(bad.record, IntentRejected)
    # PENDING rows are captured as ever.
    row = assembler.feed(encode_insert(table.oid, [*_values(102), "PENDING"]))
    assert isinstance(row, RowCaptured) and isinstance(row.record, CapturedIntent)


def test_transactions_already_in_kafka_are_skipped_whole() -> None:
    t1, t2 = Txn(1), Txn(2)
    assembler, _ = _assembler(skip_before=t1.end_lsn)
    assert assembler.feed(encode_begin(t1.commit_lsn, COMMIT_TS, 701)) is not None
    assert assembler.feed(encode_insert(OUTBOX.oid, _values(100))) is None
    assert assembler.feed(encode_commit(t1.commit_lsn, t1.end_lsn, COMMIT_TS)) == TxnCommitted(
        t1.end_lsn, skipped=True
    )
    assembler.feed(encode_begin(t2.commit_lsn, COMMIT_TS, 702))
    row = assembler.feed(encode_insert(OUTBOX.oid, _values(200)))
    assert isinstance(row, RowCaptured) and row.record.lsn == str(t2.commit_lsn)
    assert assembler.feed(encode_commit(t2.commit_lsn, t2.end_lsn, COMMIT_TS)) == TxnCommitted(
        t2.end_lsn, skipped=False
    )


def test_intent_headers_are_the_headers_of_the_intent() -> None:
    assembler, _ = _assembler()
    shaper = RecordShaper(RelaySettings(max_record_bytes=LIMIT), RelayStats())
    for number in (1, 2):
        assembler.feed(encode_begin(Txn(number).commit_lsn, COMMIT_TS, 700 + number))
        row = assembler.feed(encode_insert(OUTBOX.oid, _values(100 * number)))
        assert isinstance(row, RowCaptured) and isinstance(row.record, CapturedIntent)
        assert shaper.intent_headers(row.record) == shaper.headers(row.record)
        assert shaper.headers(row.record) == shaper.intent_headers(row.record)
