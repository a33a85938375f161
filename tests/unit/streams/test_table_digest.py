"""The worker's table digest: equal tables agree, any difference shows, nothing leaks."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from streams.table_digest import DIGEST_PATH, add_digest_page, entry_hash, table_summary

PHONE = b"5511987654321"


def test_the_digest_does_not_depend_on_order() -> None:
    items = [(b"1", b"a"), (b"2", b"b"), (b"3", b"c")]
    assert table_summary(items) == table_summary(list(reversed(items)))
    assert table_summary(items)["keys"] == 3


def test_a_missing_extra_or_changed_entry_changes_the_digest() -> None:
    base = {b"1": b"a", b"2": b"b"}
    digest = table_summary(base.items())["digest"]
    assert table_summary({b"1": b"a"}.items())["digest"] != digest
    assert table_summary({**base, b"3": b"c"}.items())["digest"] != digest
    assert table_summary({**base, b"2": b"B"}.items())["digest"] != digest
    assert table_summary({b"1": b"b", b"2": b"a"}.items())["digest"] != digest


def test_the_key_value_boundary_is_part_of_the_entry() -> None:
    assert entry_hash(b"ab", b"c") != entry_hash(b"a", b"bc")


def test_entries_are_the_sorted_entry_hashes() -> None:
    summary = table_summary([(b"2", b"b"), (b"1", b"a")], entries=True)
    assert summary["entries"] == sorted([entry_hash(b"1", b"a"), entry_hash(b"2", b"b")])
    assert "entries" not in table_summary([(b"1", b"a")])


class _Web:
    def json(self, body: Any) -> str:
        return json.dumps(body)


class _App:
    def __init__(self, tables: dict[str, Any], *, recovering: bool = False) -> None:
        self.tables = tables
        self.consumer = SimpleNamespace(
            started=True, flow_active=True, assignment=lambda: {("zapstream.intents", 0)}
        )
        self.rebalancing = False
        self.in_recovery = recovering
        self.pages: dict[str, Any] = {}

    def page(self, path: str) -> Any:
        def register(handler: Any) -> Any:
            self.pages[path] = handler
            return handler

        return register


def _get(app: _App, **query: str) -> dict[str, Any]:
    add_digest_page(app)
    body = asyncio.run(app.pages[DIGEST_PATH](_Web(), SimpleNamespace(query=query)))
    assert PHONE.decode() not in body, "a key or value shown in clear"
    result: dict[str, Any] = json.loads(body)
    return result


def test_the_page_answers_counts_and_digests_of_every_table_and_no_data() -> None:
    parked_key = b"shop\x1f" + PHONE
    jobs = SimpleNamespace(data={b"7": b'{"status":"ACCEPTED"}'})
    parked = SimpleNamespace(data={parked_key: b'{"to":"' + PHONE + b'"}'})
    body = _get(_App({"jobs": jobs, "parked": parked}))
    assert body["ready"] is True and body["assigned"] == 1
    assert body["tables"]["jobs"] == table_summary(jobs.data.items())
    assert body["tables"]["parked"]["keys"] == 1
    detailed = _get(_App({"parked": parked}), entries="1")
    assert detailed["tables"]["parked"]["entries"] == [
        entry_hash(parked_key, parked.data[parked_key])
    ]


def test_the_page_says_when_the_tables_are_partial() -> None:
    body = _get(_App({}, recovering=True))
    assert body["ready"] is False and body["not_ready"] == "recovering tables"
