"""`zapstream jobs show` and `jobs list --json` on a real PostgreSQL.

The job's events are written through the state sink's own SQL
(:func:`~connectors.sink.state_sink.apply_states`) from records the worker's
state machine makes, the command through :mod:`connectors.outbox.commands` and
the pause through :mod:`connectors.outbox.controls`: what `show` reads is what
the pipeline writes.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json

import psycopg
import pytest

from connectors.ops.jobs_cli import add_jobs_parser, list_jobs, show_job
from connectors.outbox.commands import request_reprocess
from connectors.outbox.controls import pause_campaign
from connectors.outbox.enqueue import enqueue
from connectors.sink.state_sink import apply_states
from streams.kernel.contract import CommandOutcome, JobStatus, StatusChanged
from streams.kernel.state_machine import JobRef, transition

pytestmark = pytest.mark.integration

RECIPIENT = "+55 11 98765-4321"
NORMALIZED = "5511987654321"
TEXT = "your secret code is 445566"
KEY = "show-order-1"


@pytest.fixture(scope="module")
def story(outbox_db: str) -> int:
    """A job that failed twice, went DEAD, was reprocessed by alice and then accepted."""
    with psycopg.connect(outbox_db) as conn:
        job_id = enqueue(
            conn,
            instance_id="show-shop",
            to=RECIPIENT,
            text=TEXT,
            idempotency_key=KEY,
            purpose="show-campaign",
            max_attempts=2,
        )
    ref = JobRef(job_id, KEY, "show-shop", NORMALIZED)
    states: list[StatusChanged] = []

    def move(to: JobStatus, **kwargs: object) -> None:
        states.append(transition(ref, states[-1] if states else None, to, **kwargs))  # type: ignore[arg-type]

    move(JobStatus.ATTEMPTING, attempts=1, attempt_seq=1)
    move(JobStatus.RETRY_WAIT, reason="transient: HTTP 503")
    move(JobStatus.ATTEMPTING, attempts=2, attempt_seq=2)
    move(JobStatus.DEAD, reason="2 attempts failed: HTTP 503")
    with psycopg.connect(outbox_db) as conn:
        command_id = request_reprocess(conn, job_id, "gateway is back", "alice")
    move(
        JobStatus.DEAD,
        actor="alice",
        reason="gateway is back",
        outcome=CommandOutcome.REPROCESSED,
        command_id=command_id,
    )
    move(JobStatus.ATTEMPTING, attempts=1, attempt_seq=3)
    move(JobStatus.ACCEPTED, gateway_job_id="gw-77")
    with psycopg.connect(outbox_db) as conn:
        pause_campaign(conn, "show-campaign", reason="copy under review", actor="carol")

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(outbox_db, autocommit=True) as conn:
            await apply_states(conn, states)

    asyncio.run(write())
    return job_id


def _show(dsn: str, *args: object, **kwargs: object) -> tuple[int, str]:
    out = io.StringIO()
    code = show_job(dsn, *args, out=out, **kwargs)  # type: ignore[arg-type]
    return code, out.getvalue()


def test_show_by_id_tells_the_whole_story_masked(outbox_db: str, story: int) -> None:
    code, text = _show(outbox_db, story)
    assert code == 0
    assert text.startswith(f"job {story}\n")
    assert "status:         ACCEPTED (version 7)" in text
    assert "recipient:      55*******4321" in text
    assert NORMALIZED not in text and "98765" not in text
    assert TEXT not in text and "445566" not in text and KEY not in text
    assert "gateway job id: gw-77" in text
    lines = text.splitlines()
    attempts = [line.split() for line in lines if f" {story}-" in line]
    assert [(a[0], a[1]) for a in attempts] == [
        ("1", f"{story}-1"),
        ("2", f"{story}-2"),
        ("3", f"{story}-3"),
    ]
    assert [a[4] for a in attempts] == ["RETRY_WAIT", "DEAD", "ACCEPTED"]
    assert "history (7 events):" in text
    assert "[reprocessed] gateway is back" in text
    assert "reprocess  alice  gateway is back" in text and "reprocessed at" in text
    assert "paused now:\n  campaign show-campaign by carol" in text


def test_show_by_key_and_as_json(outbox_db: str, story: int) -> None:
    code, raw = _show(outbox_db, key=KEY, as_json=True)
    assert code == 0
    payload = json.loads(raw)
    assert payload["job"]["id"] == story
    assert payload["job"]["recipient"] == "55*******4321"
    assert [a["outcome"] for a in payload["attempts"]] == ["RETRY_WAIT", "DEAD", "ACCEPTED"]
    assert [e["version"] for e in payload["events"]] == list(range(1, 8))
    assert payload["commands"][0]["actor"] == "alice"
    assert payload["commands"][0]["outcome"] == "reprocessed"
    assert payload["paused_by"][0]["kind"] == "campaign"
    assert NORMALIZED not in raw and TEXT not in raw and KEY not in raw


def test_show_of_an_unknown_job_is_exit_2(outbox_db: str) -> None:
    assert _show(outbox_db, 987654) == (2, "no job 987654\n")
    assert _show(outbox_db, key="no-such-key") == (2, "no job with that key\n")


def test_list_json(outbox_db: str, story: int) -> None:
    out = io.StringIO()
    assert list_jobs(outbox_db, instance="show-shop", as_json=True, out=out) == 0
    payload = json.loads(out.getvalue())
    assert payload["total"] == 1 and payload["page"] == 1 and payload["pages"] == 1
    (job,) = payload["jobs"]
    assert job["id"] == story and job["status"] == "ACCEPTED"
    assert job["recipient"] == "55*******4321" and NORMALIZED not in out.getvalue()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zapstream")
    add_jobs_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_the_command_line(
    outbox_db: str,
    story: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ZAPSTREAM_DATABASE_URL", outbox_db)
    args = _parser().parse_args(["jobs", "show", "--key", KEY, "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["job"]["id"] == story
    args = _parser().parse_args(["jobs", "show", str(story)])
    assert args.func(args) == 0
    assert f"job {story}" in capsys.readouterr().out
    args = _parser().parse_args(["jobs", "list", "--instance", "show-shop", "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 1
    for argv in (["jobs", "show"], ["jobs", "show", "1", "--key", "k"]):
        args = _parser().parse_args(argv)
        with pytest.raises(SystemExit):
            args.func(args)
    assert "give a job ID or --key KEY" in capsys.readouterr().err
