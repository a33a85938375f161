"""``outbox restream``: replay rows becoming the job's own intent (durations: test_durations)."""

from __future__ import annotations

import orjson

from connectors.cdc.outbox_rows import replay_row_to_record
from streams.kernel.contract import IntentCaptured, IntentRejected


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
