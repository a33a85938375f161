"""Template intents: the rules, and proof that the API and the relay apply them alike."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from connectors.cdc.outbox_rows import row_to_intent, row_to_record
from connectors.outbox.enqueue import InvalidIntent, _template_row, _validate, _with_fallback
from connectors.outbox.rules import RuleViolation, check_template
from streams.kernel.contract import ContractError, IntentCaptured, IntentRejected

TEMPLATE: dict[str, Any] = {
    "name": "appointment_reminder",
    "language": {"code": "pt_BR"},
    "components": [
        {"type": "header", "parameters": [{"type": "document", "document": {"id": "1234"}}]},
        {
            "type": "body",
            "parameters": [
                {"type": "text", "text": "Ana"},
                {
                    "type": "currency",
                    "currency": {"fallback_value": "R$ 80", "code": "BRL", "amount_1000": 80000},
                },
                {"type": "date_time", "date_time": {"fallback_value": "amanhã 14h"}},
            ],
        },
        {
            "type": "button",
            "sub_type": "quick_reply",
            "index": 0,
            "parameters": [{"type": "payload", "payload": "CONFIRM-7"}],
        },
    ],
}
INTENT: dict[str, object] = {
    "instance_id": "106540352242922",
    "to": "+55 11 98765-4321",
    "idempotency_key": "reminder-7",
    "conversation_key": None,
    "priority": "operational",
    "purpose": None,
    "expires_at": None,
    "max_attempts": 5,
}


def _changed(path: tuple[object, ...], value: object) -> dict[str, Any]:
    """TEMPLATE with the value at ``path`` replaced (``...`` as value: removed)."""
    template = copy.deepcopy(TEMPLATE)
    target: Any = template
    for step in path[:-1]:
        target = target[step]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return template


def test_a_valid_template_is_returned_with_the_language_as_an_object() -> None:
    assert check_template(TEMPLATE) == TEMPLATE
    bare = {**TEMPLATE, "language": "pt_BR"}
    assert check_template(bare)["language"] == {"code": "pt_BR"}
    minimal = check_template({"name": "hello_world", "language": "en_US"})
    assert minimal == {"name": "hello_world", "language": {"code": "en_US"}}


BODY = ("components", 1, "parameters")
BAD = [
    ("not a template", "template must be an object with name, language and components"),
    ({**TEMPLATE, "namespace": "x"}, "template has unknown keys ['namespace']"),
    (_changed(("name",), "Order Confirmation"), "template.name must be lowercase letters"),
    (_changed(("name",), ...), "template.name must be lowercase letters"),
    (_changed(("language",), "portuguese"), "template.language must be a language code"),
    (_changed(("language",), {"code": "pt_BR", "policy": "fallback"}), "template.language takes"),
    (_changed(("components",), {}), "template.components must be a list"),
    (_changed(("components", 0, "type"), "footer"), "components[0].type must be one of"),
    (_changed(("components", 2, "sub_type"), "call"), "components[2].sub_type must be one of"),
    (_changed(("components", 2, "index"), 10), "components[2].index must be a button position"),
    (_changed(("components", 1, "index"), 0), "components[1]: sub_type and index belong"),
    (_changed((*BODY, 0, "type"), "emoji"), "parameters[0].type must be one of"),
    (_changed((*BODY, 0, "text"), " "), "parameters[0].text must be a non-empty string"),
    (_changed((*BODY, 0, "text"), "x" * 4097), "parameters[0].text is longer than 4096"),
    (_changed((*BODY, 1, "currency", "code"), "R$"), "currency.code must be an ISO 4217 code"),
    (_changed((*BODY, 1, "currency", "amount_1000"), 8.5), "amount_1000 must be an integer"),
    (_changed((*BODY, 1, "currency", "fallback_value"), ...), "currency needs a fallback_value"),
    (_changed((*BODY, 2, "date_time"), {}), "date_time needs a fallback_value"),
    (
        _changed(("components", 0, "parameters", 0, "document"), {"id": "1", "link": "https://x"}),
        "document needs exactly one of link and id",
    ),
    (
        _changed(("components", 0, "parameters", 0, "document"), {"link": "ftp://x/a.pdf"}),
        "document.link must be an http(s) URL",
    ),
]


@pytest.mark.parametrize(("template", "reason"), BAD)
def test_template_rejections_name_the_first_problem(template: object, reason: str) -> None:
    with pytest.raises(RuleViolation) as raised:
        check_template(template)
    assert reason in str(raised.value)


def _row(payload: dict[str, Any]) -> dict[str, str | None]:
    return {
        "id": "42",
        "instance_id": "106540352242922",
        "payload": orjson.dumps(payload).decode(),
        "idempotency_key": "reminder-7",
        "conversation_key": None,
        "priority": "operational",
        "purpose": None,
        "expires_at": None,
        "max_attempts": "5",
        "created_at": "2026-11-29 15:50:00+00",
    }


def test_the_api_and_the_relay_make_the_same_template_intent() -> None:
    row = _template_row(template={**TEMPLATE, "language": "pt_BR"}, **INTENT)  # type: ignore[arg-type]
    assert row.payload == {"type": "template", "to": "5511987654321", "template": TEMPLATE}
    record = row_to_record(_row(row.payload), lsn="0/1", committed_at=None)
    assert isinstance(record, IntentCaptured)
    assert (record.message_type, record.template) == ("template", TEMPLATE)
    assert record.text == "[template appointment_reminder/pt_BR]"
    # The relay's hot path is byte for byte the record's encoding, template included.
    fast = row_to_intent(_row(row.payload), lsn="0/1", committed_at=None)
    assert not isinstance(fast, IntentRejected)
    assert fast.dumps() == record.dumps()
    assert IntentCaptured.loads(fast.dumps()) == record


@pytest.mark.parametrize(("template", "reason"), BAD[:6])
def test_api_and_relay_reject_a_template_by_the_same_rule(template: object, reason: str) -> None:
    with pytest.raises(InvalidIntent) as raised:
        _template_row(template=template, **INTENT)  # type: ignore[arg-type]
    record = row_to_record(
        _row({"type": "template", "to": "5511987654321", "template": template}),
        lsn="0/1",
        committed_at=None,
    )
    assert isinstance(record, IntentRejected)
    assert reason in str(raised.value) and str(raised.value) == record.reason


def test_a_template_row_without_its_template_is_rejected() -> None:
    record = row_to_record(
        _row({"type": "template", "to": "5511987654321", "text": "hi"}),
        lsn="0/1",
        committed_at=None,
    )
    assert isinstance(record, IntentRejected)
    assert record.reason.startswith("template must be an object")


def test_a_text_may_name_a_fallback_template_at_both_ends() -> None:
    text_row = _validate(text="Seu pedido saiu", **INTENT)  # type: ignore[arg-type]
    row = _with_fallback(text_row, {**TEMPLATE, "language": "pt_BR"})
    assert row.payload == {
        "type": "text",
        "to": "5511987654321",
        "text": "Seu pedido saiu",
        "fallback_template": TEMPLATE,
    }
    record = row_to_record(_row(row.payload), lsn="0/1", committed_at=None)
    assert isinstance(record, IntentCaptured)
    assert (record.message_type, record.text, record.template) == (
        "text",
        "Seu pedido saiu",
        TEMPLATE,
    )
    with pytest.raises(InvalidIntent, match="fallback_template.name"):
        _with_fallback(text_row, {"name": "Bad Name", "language": "pt_BR"})
    bad = row_to_record(
        _row({**row.payload, "fallback_template": {"name": "x", "language": "?"}}),
        lsn="0/1",
        committed_at=None,
    )
    assert isinstance(bad, IntentRejected)
    assert bad.reason.startswith("fallback_template.language must be")


def test_a_plain_text_carries_no_template_and_old_records_decode() -> None:
    record = row_to_record(
        _row({"type": "text", "to": "5511987654321", "text": "oi"}), lsn="0/1", committed_at=None
    )
    assert isinstance(record, IntentCaptured) and record.template is None
    old = orjson.loads(record.dumps())
    del old["template"]  # a record written before templates
    assert IntentCaptured.from_dict(old) == record


def test_a_template_intent_on_the_wire_must_carry_its_template() -> None:
    payload = {"type": "template", "to": "5511987654321", "template": TEMPLATE}
    record = row_to_record(_row(payload), lsn="0/1", committed_at=None)
    forged = orjson.loads(record.dumps())
    forged["template"] = None
    with pytest.raises(ContractError, match="a template intent needs its template"):
        IntentCaptured.from_dict(forged)
