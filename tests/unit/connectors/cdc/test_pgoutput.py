"""Tests for the pgoutput decoder, on payloads captured from PostgreSQL 15 (see data/)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from connectors.cdc.lsn import Lsn
from connectors.cdc.pgoutput import (
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgOutputDecoder,
    PgOutputError,
    PgOutputMessage,
    Relation,
    Truncate,
    TypeMessage,
    Update,
)
from connectors.cdc.replication_messages import to_pg_timestamp
from tests.unit.connectors.cdc.data.pgoutput_capture import PAYLOADS

OUTBOX_OID = 16390
NOTES_OID = 16399
AUDIT_OID = 16406
PRIORITY_TYPE_OID = 16385


@pytest.fixture(scope="module")
def decoded() -> list[PgOutputMessage]:
    decoder = PgOutputDecoder()
    return [decoder.decode(payload) for payload in PAYLOADS]


def decoder_after(index: int) -> PgOutputDecoder:
    """A decoder that has seen every payload before ``index`` (so knows their Relations)."""
    decoder = PgOutputDecoder()
    for payload in PAYLOADS[:index]:
        decoder.decode(payload)
    return decoder


def test_message_kinds_in_stream_order(decoded: list[PgOutputMessage]) -> None:
    kinds = [type(m).__name__ for m in decoded]
    assert kinds == [
        *("Begin", "TypeMessage", "Relation", "Insert", "Commit"),
        *("Begin", "Insert", "Insert", "Insert", "Commit"),
        *("Begin", "Update", "Commit"),
        *("Begin", "Update", "Commit"),
        *("Begin", "Delete", "Commit"),
        *("Begin", "Relation", "Insert", "Commit"),
        *("Begin", "Update", "Commit"),
        *("Begin", "Relation", "Insert", "Update", "Delete", "Commit"),
        *("Begin", "TypeMessage", "Relation", "Relation", "Truncate", "Commit"),
        *("Begin", "LogicalMessage", "Insert", "Commit"),
        "LogicalMessage",
        *("Begin", "Origin", "Insert", "Commit"),
    ]


def test_begin_and_commit(decoded: list[PgOutputMessage]) -> None:
    commit_ts = datetime(2026, 11, 29, 16, 2, 0, 880564, tzinfo=UTC)
    commit_ts_us = to_pg_timestamp(commit_ts)
    assert decoded[0] == Begin(final_lsn=Lsn.parse("0/154AF08"), commit_ts_us=commit_ts_us, xid=732)
    assert decoded[4] == Commit(
        flags=0,
        commit_lsn=Lsn.parse("0/154AF08"),
        end_lsn=Lsn.parse("0/154AF38"),
        commit_ts_us=commit_ts_us,
    )
    # The wire integer is kept; the datetime is made only when asked for.
    assert decoded[0].commit_ts == commit_ts
    assert decoded[4].commit_ts == commit_ts
    begins = [m for m in decoded if isinstance(m, Begin)]
    commits = [m for m in decoded if isinstance(m, Commit)]
    assert [b.xid for b in begins] == list(range(732, 743))
    for begin, commit in zip(begins, commits, strict=True):
        assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
        assert begin.commit_ts == commit.commit_ts
    # Transactions arrive in commit order.
    assert [c.end_lsn for c in commits] == sorted(c.end_lsn for c in commits)


def test_relation_and_type(decoded: list[PgOutputMessage]) -> None:
    assert decoded[1] == TypeMessage(oid=PRIORITY_TYPE_OID, namespace="public", name="priority")
    relation = decoded[2]
    assert relation == Relation(
        oid=OUTBOX_OID,
        namespace="public",
        name="outbox_jobs",
        replica_identity="d",
        columns=(
            Column(flags=1, name="id", type_oid=20, type_modifier=-1),
            Column(flags=0, name="instance_id", type_oid=25, type_modifier=-1),
            Column(flags=0, name="payload", type_oid=3802, type_modifier=-1),
            Column(flags=0, name="idempotency_key", type_oid=25, type_modifier=-1),
            Column(flags=0, name="purpose", type_oid=25, type_modifier=-1),
            Column(flags=0, name="priority", type_oid=PRIORITY_TYPE_OID, type_modifier=-1),
        ),
    )
    assert [c.is_key for c in relation.columns] == [True, False, False, False, False, False]
    audit = decoded[27]
    assert isinstance(audit, Relation)
    assert audit.replica_identity == "f"
    assert all(c.is_key for c in audit.columns)


def test_insert_with_jsonb_unicode_and_null(decoded: list[PgOutputMessage]) -> None:
    insert = decoded[3]
    assert isinstance(insert, Insert)
    assert insert.relation is decoded[2]
    assert insert.new == {
        "id": "1",
        "instance_id": "inst-1",
        # jsonb's own text form: keys re-ordered, non-ASCII kept as UTF-8.
        "payload": '{"to": "5511987654321", "text": "Olá, mundo ✓ 🚀", "type": "text"}',
        "idempotency_key": "k-1",
        "purpose": None,
        "priority": "operational",
    }
    payload = insert.new["payload"]
    assert payload is not None
    assert json.loads(payload)["text"] == "Olá, mundo ✓ 🚀"


def test_transaction_with_several_inserts(decoded: list[PgOutputMessage]) -> None:
    inserts = decoded[6:9]
    assert all(isinstance(m, Insert) for m in inserts)
    assert [(m.new["id"], m.new["idempotency_key"], m.new["payload"]) for m in inserts] == [  # type: ignore[union-attr]
        ("2", "k-2", '{"n": 1}'),
        ("3", "k-3", '{"n": 2}'),
        ("4", "k-4", '[1, null, "x"]'),
    ]
    last = inserts[2]
    assert isinstance(last, Insert)
    # An empty string is a value, not NULL.
    assert last.new["purpose"] == ""
    assert last.new["priority"] == "marketing"


def test_update_without_old_tuple(decoded: list[PgOutputMessage]) -> None:
    update = decoded[11]
    assert isinstance(update, Update)
    assert update.old is None
    assert update.old_is_key is False
    assert update.unchanged_toast == frozenset()
    assert update.new["id"] == "1"
    assert update.new["purpose"] == "reminder"


def test_update_changing_the_key_sends_old_key(decoded: list[PgOutputMessage]) -> None:
    update = decoded[14]
    assert isinstance(update, Update)
    assert update.old_is_key is True
    assert update.old == {
        "id": "2",
        "instance_id": None,
        "payload": None,
        "idempotency_key": None,
        "purpose": None,
        "priority": None,
    }
    assert update.new["id"] == "20"
    assert update.new["idempotency_key"] == "k-2"


def test_delete_by_key(decoded: list[PgOutputMessage]) -> None:
    delete = decoded[17]
    assert isinstance(delete, Delete)
    assert delete.relation.name == "outbox_jobs"
    assert delete.old_is_key is True
    assert delete.old["id"] == "3"
    assert delete.old["payload"] is None


def test_unchanged_toast_is_left_out_not_null(decoded: list[PgOutputMessage]) -> None:
    insert = decoded[21]
    assert isinstance(insert, Insert)
    assert insert.new["body"] == "abcdefghij" * 250
    update = decoded[24]
    assert isinstance(update, Update)
    assert update.new == {"id": "1", "title": "renamed"}
    assert "body" not in update.new
    assert update.unchanged_toast == frozenset({"body"})


def test_replica_identity_full_sends_old_row(decoded: list[PgOutputMessage]) -> None:
    update, delete = decoded[29], decoded[30]
    assert isinstance(update, Update)
    assert update.old == {"at_id": "7", "what": "created"}
    assert update.old_is_key is False
    assert update.new == {"at_id": "7", "what": "changed"}
    assert isinstance(delete, Delete)
    assert delete.old == {"at_id": "7", "what": "changed"}
    assert delete.old_is_key is False


def test_truncate(decoded: list[PgOutputMessage]) -> None:
    truncate = decoded[36]
    assert isinstance(truncate, Truncate)
    assert [r.name for r in truncate.relations] == ["outbox_jobs", "notes"]
    assert truncate.cascade is True
    assert truncate.restart_identity is True


def test_logical_messages(decoded: list[PgOutputMessage]) -> None:
    assert decoded[39] == LogicalMessage(
        transactional=True,
        lsn=Lsn.parse("0/154DEE8"),
        prefix="zapstream",
        content=b"hello \\x00 bytes",
    )
    assert decoded[42] == LogicalMessage(
        transactional=False, lsn=Lsn.parse("0/154DFA0"), prefix="ping", content=b"\xde\xad\xbe\xef"
    )


def test_origin(decoded: list[PgOutputMessage]) -> None:
    assert decoded[44] == Origin(commit_lsn=Lsn.parse("0/ABCDEF"), name="upstream")
    begin = decoded[43]
    assert isinstance(begin, Begin)
    assert begin.commit_ts == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_relation_cache_is_replaced_by_newer_relation_messages() -> None:
    decoder = decoder_after(len(PAYLOADS))
    assert set(decoder.relations) == {OUTBOX_OID, NOTES_OID, AUDIT_OID}
    assert decoder.relations[NOTES_OID].name == "notes"


def test_insert_for_unknown_relation_is_an_error() -> None:
    with pytest.raises(PgOutputError, match=f"relation oid {OUTBOX_OID}"):
        PgOutputDecoder().decode(PAYLOADS[3])


@pytest.mark.parametrize("index", [11, 17, 36])
def test_other_row_changes_for_unknown_relation_are_errors(index: int) -> None:
    with pytest.raises(PgOutputError, match="relation oid"):
        PgOutputDecoder().decode(PAYLOADS[index])


@pytest.mark.parametrize("index", range(len(PAYLOADS)))
def test_every_truncation_of_every_captured_payload_is_an_error(
    index: int, decoded: list[PgOutputMessage]
) -> None:
    decoder = decoder_after(index)
    payload = PAYLOADS[index]
    for cut in range(len(payload)):
        with pytest.raises(PgOutputError):
            decoder.decode(payload[:cut])
    # The decoder is still usable afterwards: failed attempts left no trace.
    assert decoder.decode(payload) == decoded[index]


@pytest.mark.parametrize("index", [0, 2, 3, 4, 14, 36, 39, 44])
def test_trailing_bytes_are_an_error(index: int) -> None:
    with pytest.raises(PgOutputError, match="trailing bytes"):
        decoder_after(index).decode(PAYLOADS[index] + b"\x00")


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"", "empty"),
        (b"S\x00\x00\x00\x01\x01", "unknown pgoutput message type b'S'"),  # stream start (v2)
        (b"P" + b"\x00" * 20, "unknown pgoutput message type b'P'"),  # prepare (v3)
        (b"Z", "unknown pgoutput message type b'Z'"),
    ],
)
def test_unknown_message_types_are_errors(payload: bytes, match: str) -> None:
    with pytest.raises(PgOutputError, match=match):
        PgOutputDecoder().decode(payload)


def test_pgoutput_error_is_a_value_error() -> None:
    assert issubclass(PgOutputError, ValueError)
    assert PgOutputError.retriable is False


def _insert_audit(values: bytes) -> bytes:
    return b"I" + AUDIT_OID.to_bytes(4, "big") + b"N" + values


def test_binary_values_are_refused() -> None:
    decoder = decoder_after(28)
    payload = _insert_audit(b"\x00\x02" + b"b\x00\x00\x00\x04\x00\x00\x00\x07" + b"n")
    with pytest.raises(PgOutputError, match="binary value for column 'at_id'"):
        decoder.decode(payload)


def test_unknown_tuple_kind_and_column_count_mismatch_are_errors() -> None:
    decoder = decoder_after(28)
    assert decoder.decode(_insert_audit(b"\x00\x02" + b"t\x00\x00\x00\x017" + b"n")) == Insert(
        relation=decoder.relations[AUDIT_OID], new={"at_id": "7", "what": None}
    )
    with pytest.raises(PgOutputError, match="unknown tuple value kind b'x'"):
        decoder.decode(_insert_audit(b"\x00\x02" + b"x" + b"n"))
    with pytest.raises(PgOutputError, match="tuple has 3 columns"):
        decoder.decode(_insert_audit(b"\x00\x03" + b"nnn"))
    with pytest.raises(PgOutputError, match="claims -1 bytes"):
        decoder.decode(_insert_audit(b"\x00\x02" + b"t\xff\xff\xff\xff" + b"n"))
    with pytest.raises(PgOutputError, match="unchanged TOAST"):
        decoder.decode(_insert_audit(b"\x00\x02" + b"u" + b"n"))


def test_invalid_utf8_is_an_error() -> None:
    decoder = decoder_after(28)
    with pytest.raises(PgOutputError, match="invalid UTF-8"):
        decoder.decode(_insert_audit(b"\x00\x02" + b"t\x00\x00\x00\x01\xff" + b"n"))


def test_bad_markers_are_errors() -> None:
    decoder = decoder_after(len(PAYLOADS))
    oid = OUTBOX_OID.to_bytes(4, "big")
    with pytest.raises(PgOutputError, match="INSERT: expected 'N'"):
        decoder.decode(b"I" + oid + b"K\x00\x00")
    with pytest.raises(PgOutputError, match="UPDATE: expected 'N'"):
        decoder.decode(b"U" + oid + b"X\x00\x00")
    with pytest.raises(PgOutputError, match="DELETE: expected 'K' or 'O'"):
        decoder.decode(b"D" + oid + b"N\x00\x00")
    with pytest.raises(PgOutputError, match="TRUNCATE claims"):
        decoder.decode(b"T\xff\xff\xff\xff\x00")


def _filtered_decoder(keep: set[str]) -> PgOutputDecoder:
    """Like decoder_after(28), keeping only ``keep`` of the audit table's INSERT columns."""
    name = decoder_after(28).relations[AUDIT_OID].name
    decoder = PgOutputDecoder(columns={name: keep})
    for payload in PAYLOADS[:28]:
        decoder.decode(payload)
    return decoder


def test_columns_filter_keeps_only_the_named_columns_and_decode_complete_all() -> None:
    decoder = _filtered_decoder({"what"})
    payload = _insert_audit(b"\x00\x02" + b"t\x00\x00\x00\x017" + b"t\x00\x00\x00\x02ok")
    some = decoder.decode(payload)
    assert isinstance(some, Insert)
    assert some.new == {"what": "ok"} and some.complete is False
    full = decoder.decode_complete(payload)
    assert full == Insert(
        relation=decoder.relations[AUDIT_OID], new={"at_id": "7", "what": "ok"}, complete=True
    )
    # The filter applies again after decode_complete; NULLs are kept or skipped alike.
    nulls = decoder.decode(_insert_audit(b"\x00\x02" + b"nn"))
    assert isinstance(nulls, Insert) and nulls.new == {"what": None}
    # Other tables are decoded whole.
    assert decoder_after(28).decode(payload) == full


def test_columns_filter_still_checks_skipped_values() -> None:
    decoder = _filtered_decoder({"what"})
    with pytest.raises(PgOutputError, match="binary value for column 'at_id'"):
        decoder.decode(_insert_audit(b"\x00\x02" + b"b\x00\x00\x00\x04\x00\x00\x00\x07" + b"n"))
    with pytest.raises(PgOutputError, match="column .at_id. claims 9 bytes"):
        decoder.decode(_insert_audit(b"\x00\x02" + b"t\x00\x00\x00\x097" + b"n"))
    with pytest.raises(PgOutputError, match="unchanged TOAST"):
        decoder.decode(_insert_audit(b"\x00\x02" + b"u" + b"n"))
    with pytest.raises(PgOutputError, match="trailing bytes"):
        decoder.decode(_insert_audit(b"\x00\x02" + b"nn" + b"x"))


def test_kept_insert_is_decode_of_a_sound_filtered_insert_and_none_for_the_rest() -> None:
    decoder = _filtered_decoder({"what"})
    relation = decoder.relations[AUDIT_OID]
    sound = _insert_audit(b"\x00\x02" + b"t\x00\x00\x00\x017" + b"t\x00\x00\x00\x02ok")
    assert decoder.kept_insert(sound) == (relation, {"what": "ok"})
    assert decoder.kept_insert(_insert_audit(b"\x00\x02" + b"nn")) == (relation, {"what": None})
    # Everything decode() raises on, sets aside or does not filter is left to decode().
    for payload in (
        *(sound[:cut] for cut in range(len(sound))),
        sound + b"x",
        _insert_audit(b"\x00\x02" + b"b\x00\x00\x00\x04\x00\x00\x00\x07" + b"n"),
        _insert_audit(b"\x00\x02" + b"t\x00\x00\x00\x097" + b"n"),
        _insert_audit(b"\x00\x02" + b"u" + b"n"),
        _insert_audit(b"\x00\x03" + b"nnn"),
        _insert_audit(b"\x00\x02" + b"n" + b"t\x00\x00\x00\x02\xff\xfe"),
        memoryview(sound),
        *PAYLOADS[:28],
    ):
        assert decoder.kept_insert(payload) is None
    # A value over max_value_bytes is decode()'s to set aside.
    capped = PgOutputDecoder(columns={relation.name: {"what"}}, max_value_bytes=1)
    for payload in PAYLOADS[:28]:
        capped.decode(payload)
    assert capped.kept_insert(sound) is None
    # Tables outside ``columns`` are decoded whole, by decode().
    assert decoder_after(28).kept_insert(sound) is None
