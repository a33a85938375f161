"""The pure parts of `zapstream doctor` and the topic check: messages, report, exit codes."""

from __future__ import annotations

import json

import pytest

from connectors.ops.doctor import CheckResult, Status, print_report
from connectors.ops.topics import (
    deployable_topic_specs,
    relay_topic_specs,
    topic_problems,
    worker_topic_specs,
)
from streams.contract import (
    BULK_INTENTS,
    CONTROLS,
    DEAD,
    INTENTS,
    INVALID,
    PARKED,
    RESULTS,
    STATE,
)
from streams.settings import KafkaSettings


def test_worker_needs_every_topic_and_the_relay_what_it_produces_to() -> None:
    kafka = KafkaSettings(partitions=8)
    worker = {s.name: s.partitions for s in worker_topic_specs(kafka)}
    assert worker == {
        INTENTS: 8,
        BULK_INTENTS: 8,
        RESULTS: 8,
        STATE: 8,
        PARKED: 8,
        INVALID: 1,
        DEAD: 1,
        CONTROLS: 1,
    }
    assert {s.name for s in relay_topic_specs(kafka)} == {INTENTS, BULK_INTENTS, INVALID, CONTROLS}
    assert {s.name for s in deployable_topic_specs("sink", kafka)} == {STATE, INVALID, DEAD}
    assert {s.name for s in deployable_topic_specs("webhook", kafka)} == {INTENTS, DEAD}


def test_matching_topics_have_no_problem() -> None:
    specs = worker_topic_specs(KafkaSettings(partitions=8))
    assert topic_problems({s.name: s.partitions for s in specs} | {"other": 3}, specs) == []


def test_a_partition_mismatch_names_the_topic_and_the_setting() -> None:
    specs = relay_topic_specs(KafkaSettings(partitions=8))
    problems = topic_problems({INTENTS: 4, BULK_INTENTS: 8, INVALID: 1, CONTROLS: 1}, specs)
    assert problems == [
        "topic zapstream.intents has 4 partitions, ZAPSTREAM_KAFKA_PARTITIONS says 8: run "
        "`zapstream topics ensure` on a fresh cluster, or set ZAPSTREAM_KAFKA_PARTITIONS=4 if "
        "every partitioned topic has 4"
    ]


def test_a_missing_topic_says_topics_ensure() -> None:
    specs = relay_topic_specs(KafkaSettings(partitions=8))
    assert topic_problems({INTENTS: 8, BULK_INTENTS: 8, CONTROLS: 1}, specs) == [
        "topic zapstream.invalid does not exist: run `zapstream topics ensure`"
    ]


def test_a_single_partition_topic_with_more_partitions_is_named() -> None:
    specs = relay_topic_specs(KafkaSettings(partitions=8))
    (problem,) = topic_problems({INTENTS: 8, BULK_INTENTS: 8, INVALID: 4, CONTROLS: 1}, specs)
    assert problem.startswith("topic zapstream.invalid has 4 partitions, zapstream needs 1")


def test_report_lines_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    ok = CheckResult("wal_level", Status.OK, "logical")
    skip = CheckResult("gateway", Status.SKIP, "not checkable")
    fail = CheckResult(
        "migrations", Status.FAIL, "not applied: 0005_x", "run `zapstream db migrate`"
    )
    assert print_report([ok, skip]) == 0
    assert print_report([ok, fail]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "OK   wal_level: logical" in out
    assert "FAIL migrations: not applied: 0005_x -> run `zapstream db migrate`" in out
    assert out[-1] == "zapstream doctor: some checks FAILED"


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    fail = CheckResult("kafka", Status.FAIL, "cannot reach", "check ZAPSTREAM_KAFKA_BROKERS")
    assert print_report([fail], as_json=True) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload == {
        "ok": False,
        "checks": [
            {
                "check": "kafka",
                "status": "FAIL",
                "detail": "cannot reach",
                "remedy": "check ZAPSTREAM_KAFKA_BROKERS",
            }
        ],
    }


async def test_meta_gateway_is_skipped_without_calling_it_or_showing_the_token() -> None:
    from pydantic import SecretStr

    from connectors.ops.doctor import _gateway_checks
    from streams.settings import GatewayKind, GatewaySettings

    token = "EAAG-secret-token-0123456789"
    gateway = GatewaySettings(
        kind=GatewayKind.META,
        meta_graph_url="http://127.0.0.1:9",  # nothing listens: a call would fail, not skip
        meta_access_token=SecretStr(token),
    )
    (result,) = await _gateway_checks(gateway, 0.5, "106540352242922")
    assert result.status is Status.SKIP
    assert "META_ACCESS_TOKEN is set" in result.detail
    assert token not in result.detail
