"""``outbox restream``: its duration argument, and replay rows becoming the job's own intent."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

from connectors.cdc.outbox_rows import replay_row_to_record
from connectors.cdc.restream import parse_duration
from streams.kernel.contract import IntentCaptured, IntentRejected


@pytest.mark.parametrize(
    ("text", "seconds"), [("0s", 0), ("90s", 90), ("10m", 600), ("2h", 7200), ("1.5d", 129600)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "10", "ten minutes", "-5m", "5w"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="e.g. 10m"):
        parse_duration(text)


def _replay_row(payload: dict[str, object]) -> dict[str, str | None]:
    return {
        "id": "9001",
        "job_id": "42",
        "reason": "restream",
        "actor": "ops",
        "created_at": "2026-12-01 10:00:00+00",
        "instance_id": "inst-1",
        "idempotency_key": "order-42",
        "conversation_key": "inst-1:5511987654321",
        "payload": orjson.dumps(payload).decode(),
        "priority": "operational",
        "purpose": None,
        "expires_at": None,
        "max_attempts": "5",
        "job_created_at": "2026-12-01 09:00:00+00",
    }


def test_a_replay_row_is_the_jobs_own_intent() -> None:
    row = _replay_row({"type": "text", "to": "+5511987654321", "text": "hi"})
    record = replay_row_to_record(row, lsn="0/10", committed_at=None)
    assert isinstance(record, IntentCaptured)
    assert record.job_id == 42 and record.idempotency_key == "order-42"
    assert record.conversation_key == "inst-1:5511987654321"
    assert record.created_at == "2026-12-01T09:00:00+00:00"


def test_a_replay_of_an_invalid_job_is_rejected_with_the_replay_row() -> None:
    row = _replay_row({"type": "text", "to": "+5511987654321", "text": ""})
    record = replay_row_to_record(row, lsn="0/10", committed_at=None)
    assert isinstance(record, IntentRejected)
    assert record.job_id == 42 and record.row["id"] == "9001"
