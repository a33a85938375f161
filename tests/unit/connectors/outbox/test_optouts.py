"""The opt-out API's rules, before anything is written (the SQL path: tests/integration)."""

from __future__ import annotations

import pytest

from connectors.ops.optouts_cli import optouts_table
from connectors.outbox.enqueue import InvalidIntent, _validate
from connectors.outbox.optouts import InvalidOptOut, OptOut, _params, person
from streams.kernel.contract import OptOutAction


@pytest.mark.parametrize(
    "written",
    ["+55 11 98765-4321", "5511987654321", "5511987654321@s.whatsapp.net", "5511987654321@c.us"],
)
def test_every_written_form_of_a_number_is_one_person(written: str) -> None:
    assert person(written) == "5511987654321"


def test_a_group_keeps_its_jid() -> None:
    assert person("120363025-1234@g.us") == "120363025-1234@g.us"


@pytest.mark.parametrize(
    ("instance", "to", "reason", "source", "problem"),
    [
        ("shop-1", "12345", "STOP", "app", "not an international phone number"),
        ("shop-1", "+55 11 98765-4321", " ", "app", "reason is required"),
        ("shop-1", "+55 11 98765-4321", "STOP", "crm", "source must be one of app, meta, operator"),
        ("../x", "+55 11 98765-4321", "STOP", "app", "instance_id"),
    ],
)
def test_invalid_input_is_refused_before_anything_is_written(
    instance: str, to: str, reason: str, source: str, problem: str
) -> None:
    with pytest.raises(InvalidOptOut, match=problem) as refused:
        _params(OptOutAction.OUT, instance, to, reason, source)
    assert "98765" not in str(refused.value)


def test_enqueue_puts_respect_opt_out_in_the_payload_only_when_given() -> None:
    common = {
        "instance_id": "shop-1",
        "to": "+55 11 98765-4321",
        "text": "hi",
        "idempotency_key": "k",
        "conversation_key": None,
        "priority": "operational",
        "purpose": None,
        "expires_at": None,
        "max_attempts": 5,
    }
    assert "respect_opt_out" not in _validate(**common).payload  # type: ignore[arg-type]
    marked = _validate(**common, respect_opt_out=True)  # type: ignore[arg-type]
    assert marked.payload["respect_opt_out"] is True
    with pytest.raises(InvalidIntent, match="respect_opt_out"):
        _validate(**common, respect_opt_out="yes")  # type: ignore[arg-type]


def test_the_cli_list_masks_numbers() -> None:
    import datetime as dt

    at = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)
    text = optouts_table([OptOut("shop-1", "5511987654321", "meta", "131050", 7, at, 1)])
    assert "5511987654321" not in text and "55*******4321" in text and "meta" in text
    assert optouts_table([]) == "nobody is opted out"
