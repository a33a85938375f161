"""The sink's retry loop and record sorting, with scripted failures (no I/O)."""

from __future__ import annotations

import asyncio
import logging

import orjson
import psycopg
import pytest
from aiokafka import ConsumerRecord
from aiokafka import errors as kafka_errors
from psycopg import errors as pg_errors

from connectors.sink import state_sink
from connectors.sink.failures import SinkConfigError
from connectors.sink.settings import SinkSettings
from connectors.sink.state_sink import StateSink, is_command_rejection
from streams.kernel.contract import INVALID, STATE, IntentRejected, JobStatus
from streams.kernel.state_machine import JobRef, transition

REFUSED = "connection failed: Connection refused"


def _sink() -> StateSink:
    return StateSink(SinkSettings(retry_initial_s=0.001, retry_max_s=0.002, metrics_port=0))


class Script:
    """A step that fails with the given errors, then returns ``"done"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


async def test_transient_failures_are_retried_and_logged_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = _sink()
    step = Script(*(psycopg.OperationalError(REFUSED) for _ in range(4)))
    with caplog.at_level(logging.INFO, logger=state_sink.__name__):
        assert await sink._retry(step) == "done"
        assert await sink._retry(Script(kafka_errors.KafkaConnectionError("down"))) == "done"
    assert step.calls == 5
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [m for m in messages if "unavailable" in m[1]] == [
        ("WARNING", messages[0][1]),
        ("WARNING", messages[2][1]),
    ]
    assert "postgres unavailable" in messages[0][1]
    assert (
        "postgres available again after" in messages[1][1] and "4 failed attempts" in messages[1][1]
    )
    assert "kafka unavailable" in messages[2][1] and "kafka available again after" in messages[3][1]
    assert sink.outages == {"postgres": 1, "kafka": 1}


async def test_permanent_failure_stops_at_once_naming_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = _sink()
    step = Script(pg_errors.UndefinedTable('relation "outbox_jobs" does not exist'))
    with caplog.at_level(logging.INFO, logger=state_sink.__name__):
        with pytest.raises(SinkConfigError, match=r"run `zapstream db migrate`"):
            await sink._retry(step)
    assert caplog.records == []  # `zapstream sink` prints the one line, exit 2
    assert step.calls == 1


async def test_bugs_and_rebalances_are_not_retried() -> None:
    sink = _sink()
    with pytest.raises(ValueError, match="bug"):
        await sink._retry(Script(ValueError("bug")))
    with pytest.raises(kafka_errors.CommitFailedError):
        await sink._retry(Script(kafka_errors.CommitFailedError("rebalanced")))


async def test_a_stop_request_ends_the_wait_of_an_outage() -> None:
    sink = StateSink(SinkSettings(retry_initial_s=30, retry_max_s=30, metrics_port=0))
    step = Script(*(psycopg.OperationalError(REFUSED) for _ in range(100)))
    task = asyncio.ensure_future(sink._retry(step))
    await asyncio.sleep(0.01)
    sink.request_stop()
    with pytest.raises(state_sink._Stopped):
        await asyncio.wait_for(task, 5)
    assert step.calls == 1


def _record(topic: str, value: bytes, offset: int = 0) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic, 0, offset, 0, 0, None, value, None, 0, len(value), ())


def test_records_are_sorted_into_states_rejections_and_poison() -> None:
    sink = _sink()
    ref = JobRef(7, "k", "i", "c")
    state = transition(ref, None, JobStatus.ATTEMPTING)
    bad_status = transition(ref, None, JobStatus.ATTEMPTING).to_dict() | {"status": "SLEEPING"}

    records = [
        _record(STATE, state.dumps()),
        _record(STATE, b"not json", 1),
        _record(STATE, orjson.dumps(bad_status), 2),
        _record(INVALID, IntentRejected(job_id=8, reason="payload is a JSON list", row={}).dumps()),
        _record(INVALID, IntentRejected(job_id=None, reason="id is missing", row={}).dumps()),
        _record(
            INVALID,
            IntentRejected(
                job_id=9, reason="cannot reprocess", row={"command": "reprocess"}
            ).dumps(),
        ),
    ]
    decoded = sink._decode(records)
    assert decoded.states == [state]
    assert decoded.invalid == [(8, "payload is a JSON list")]
    assert [r.offset for r, _ in decoded.poison] == [1, 2]
    assert "SLEEPING" in decoded.poison[1][1]
    assert sink.rejections_ignored == 2


def test_old_state_records_without_outcome_still_decode() -> None:
    from streams.kernel.contract import StatusChanged

    old = (
        b'{"schema":"zapstream.status.v1","job_id":1,"idempotency_key":"k","instance_id":"i",'
        b'"conversation_key":"c","status":"ACCEPTED","previous":"ATTEMPTING","version":2}'
    )
    state = StatusChanged.loads(old)
    assert state.outcome is None and state.command_id is None


def test_command_rows_are_told_from_job_rows() -> None:
    assert is_command_rejection(IntentRejected(job_id=1, reason="r", row={"command": "cancel"}))
    assert not is_command_rejection(IntentRejected(job_id=1, reason="r", row={"payload": "[]"}))
