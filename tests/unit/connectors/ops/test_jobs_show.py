"""``zapstream jobs show`` and ``--json``: attempts from events, masking, every section."""

from __future__ import annotations

import datetime as dt
import json

from connectors.ops.jobs_render import job_history_json, job_history_text, jobs_json
from connectors.ops.jobs_sql import (
    Attempt,
    JobCommand,
    JobDetail,
    JobEvent,
    JobHistory,
    JobReplay,
    ListedJob,
    attempts_of,
)

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
PHONE = "5511987654321"


def _at(seconds: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _event(
    version: int,
    frm: str | None,
    to: str,
    *,
    actor: str = "worker",
    reason: str | None = None,
    outcome: str | None = None,
    command_id: int | None = None,
) -> JobEvent:
    return JobEvent(version, version, frm, to, actor, reason, _at(version), outcome, command_id)


EVENTS = [
    _event(1, "PENDING", "ATTEMPTING"),
    _event(2, "ATTEMPTING", "RETRY_WAIT", reason="HTTP 503"),
    _event(3, "RETRY_WAIT", "ATTEMPTING"),
    _event(4, "ATTEMPTING", "ATTEMPTING", reason="outcome unknown; reconciling again"),
    _event(5, "ATTEMPTING", "DEAD", reason="attempts exhausted"),
    _event(
        6,
        "DEAD",
        "PENDING",
        actor="alice",
        reason="gateway fixed",
        outcome="reprocessed",
        command_id=77,
    ),
    _event(7, "PENDING", "ATTEMPTING"),
]


def test_attempts_are_moves_into_attempting_and_notes_do_not_count() -> None:
    assert attempts_of(EVENTS) == [
        Attempt(1, _at(1), "RETRY_WAIT", "HTTP 503", _at(2)),
        Attempt(2, _at(3), "DEAD", "attempts exhausted", _at(5)),
        Attempt(3, _at(7), None, None, None),
    ]
    assert attempts_of([]) == []
    assert attempts_of(EVENTS)[2].reference(42) == "42-3"


def _history() -> JobHistory:
    job = JobDetail(
        id=42,
        instance_id="shop-1",
        recipient=PHONE,
        conversation_key=PHONE,
        payload_type="text",
        status="ATTEMPTING",
        priority="operational",
        purpose="orders",
        attempts=1,
        max_attempts=3,
        state_version=7,
        gateway_job_id="gw-9",
        last_error="attempts exhausted",
        created_at=T0,
        updated_at=_at(7),
        sent_at=None,
        expires_at=None,
    )
    return JobHistory(
        job=job,
        events=EVENTS,
        commands=[
            JobCommand(77, "reprocess", "alice", "gateway fixed", _at(6)),
            JobCommand(78, "cancel", "bob", "customer asked", _at(8)),
        ],
        replays=[JobReplay(5, "carol", "slot was dropped", _at(0))],
        paused_by=[("instance", "shop-1", "dave", "number flagged", _at(9))],
    )


def test_text_shows_the_job_masked_with_every_section() -> None:
    text = job_history_text(_history(), now=_at(600))
    assert text.startswith("job 42\n")
    assert "status:         ATTEMPTING (version 7)" in text
    assert "recipient:      55*******4321" in text and "conversation:   55*******4321" in text
    assert PHONE not in text and "98765" not in text
    assert "message:        text (text not shown)" in text
    assert "created:        2026-03-01 12:00:00Z (10m00s ago)" in text
    assert "attempts (3):" in text
    assert "1  42-1       2026-03-01 12:00:01Z  RETRY_WAIT   HTTP 503" in text
    assert "3  42-3       2026-03-01 12:00:07Z  in progress" in text
    assert "history (7 events):" in text
    assert "DEAD -> PENDING" in text and "[reprocessed] gateway fixed" in text
    assert "77  reprocess  alice  gateway fixed   2026-03-01 12:00:06Z  reprocessed at" in text
    assert "78  cancel     bob    customer asked  2026-03-01 12:00:08Z  not answered yet" in text
    assert "restreams (1):" in text and "slot was dropped" in text
    assert (
        "paused now:\n  instance shop-1 by dave since 2026-03-01 12:00:09Z: number flagged" in text
    )


def test_text_of_a_job_with_no_history() -> None:
    history = _history()
    bare = JobHistory(history.job, [], [], [], [])
    text = job_history_text(bare, now=_at(5))
    assert "attempts (0):\n  none" in text
    assert "history (0 events):\n  none recorded" in text
    assert "restreams" not in text and "paused now" not in text


def test_json_has_the_same_facts_masked() -> None:
    payload = json.loads(job_history_json(_history(), now=_at(600)))
    assert payload["job"]["recipient"] == "55*******4321"
    assert payload["job"]["conversation"] == "55*******4321"
    assert payload["job"]["age_s"] == 600.0
    assert "text" not in payload["job"]
    assert [a["reference"] for a in payload["attempts"]] == ["42-1", "42-2", "42-3"]
    assert payload["attempts"][1]["outcome"] == "DEAD"
    assert payload["events"][5]["outcome"] == "reprocessed"
    assert payload["commands"][0]["outcome"] == "reprocessed"
    assert payload["commands"][1]["outcome"] is None
    assert payload["restreams"][0]["actor"] == "carol"
    assert payload["paused_by"][0]["target"] == "shop-1"
    assert PHONE not in json.dumps(payload)


def test_list_json_masks_and_paginates() -> None:
    job = ListedJob(1, "shop-1", PHONE, "FAILED", 3, T0, "boom", _at(5))
    payload = json.loads(jobs_json([job], now=_at(60), page=2, limit=1, total=3))
    assert payload["page"] == 2 and payload["pages"] == 3 and payload["total"] == 3
    assert payload["jobs"][0]["recipient"] == "55*******4321"
    assert payload["jobs"][0]["age_s"] == 60.0
    assert PHONE not in json.dumps(payload)
