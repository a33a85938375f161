"""The pure parts of `zapstream doctor` and the topic check: messages, report, exit codes."""

from __future__ import annotations

import json
import re

import pytest

from connectors.ops.doctor import CheckResult, Status, print_report
from streams.kernel.contract import (
    BULK_INTENTS,
    CONTROLS,
    DEAD,
    INTENTS,
    INVALID,
    PARKED,
    RESULTS,
    STATE,
)
from streams.kernel.settings import GatewayKind, GatewaySettings, KafkaSettings
from streams.kernel.topics_check import (
    deployable_topic_specs,
    relay_topic_specs,
    topic_problems,
    worker_topic_specs,
)
from tests.unit.connectors.gateways.fake_gateway import FakeGateway, Reply, Seen


def test_worker_needs_every_topic_but_invalid_and_the_relay_what_it_produces_to() -> None:
    kafka = KafkaSettings(partitions=8)
    worker = {s.name: s.partitions for s in worker_topic_specs(kafka)}
    # Not zapstream.invalid: the relay writes it, the sink reads it; with ACLs the worker's
    # user may not even see it (streams/kernel/kafka_access.py).
    assert worker == {
        INTENTS: 8,
        BULK_INTENTS: 8,
        RESULTS: 8,
        STATE: 8,
        PARKED: 8,
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


async def test_meta_gateway_unreachable_fails_naming_the_url_never_the_token() -> None:
    from pydantic import SecretStr

    from connectors.ops.doctor import _gateway_checks
    from streams.kernel.settings import GatewayKind, GatewaySettings

    token = "EAAG-secret-token-0123456789"
    gateway = GatewaySettings(
        kind=GatewayKind.META,
        meta_graph_url="http://127.0.0.1:9",  # nothing listens
        meta_access_token=SecretStr(token),
    )
    (result,) = await _gateway_checks(gateway, 0.5, "106540352242922")
    assert result.status is Status.FAIL
    assert result.remedy == "check META_GRAPH_URL"
    assert token not in result.line()


def _zapapi(request: Seen) -> Reply:
    """A ZAP API: 422 to an empty body on its send route, 401 without the token, else 404."""
    if not re.fullmatch(r"/v1/instances/[^/]+/messages", request.path):
        return Reply(404, body=b"404: Not Found")
    if request.headers.get("Authorization") != f"Bearer {TOKEN}":
        return Reply(401, json={"message": "unauthorized"})
    return Reply(422, json={"message": "type must be 'text'"})


TOKEN = "zap-token-0123456789abcdef"


def _zap_settings(url: str, token: str = TOKEN) -> GatewaySettings:
    from pydantic import SecretStr

    return GatewaySettings(kind=GatewayKind.ZAPAPI, zap_api_url=url, zap_token=SecretStr(token))


@pytest.mark.parametrize(
    ("suffix", "token", "status", "remedy"),
    [
        ("", TOKEN, Status.OK, ""),
        ("/v1", TOKEN, Status.OK, ""),
        ("/api", TOKEN, Status.FAIL, "check ZAP_API_URL: the API's root, without /v1 or a path"),
        ("", "wrong-token-0123456789", Status.FAIL, "check ZAP_TOKEN"),
    ],
)
async def test_zapapi_gateway_check_tells_a_wrong_base_url_and_token(
    suffix: str, token: str, status: Status, remedy: str
) -> None:
    from connectors.ops.doctor import _gateway_checks

    async with FakeGateway(_zapapi) as fake:
        (result,) = await _gateway_checks(_zap_settings(fake.url + suffix, token), 2.0, "inst-1")
        methods = {r.method for r in fake.seen}
    print(result.line())
    assert result.status is status, result.line()
    assert result.remedy == remedy
    assert TOKEN not in result.line() and token not in result.line()
    assert len(fake.seen) == 1 and methods == {"POST"}


async def test_stackzap_gateway_check_fails_an_unreadable_listing_naming_the_setting() -> None:
    from pydantic import SecretStr

    from connectors.ops.doctor import _gateway_checks

    async with FakeGateway(lambda request: Reply(200, json={"total": 2})) as fake:
        gateway = GatewaySettings(
            kind=GatewayKind.STACKZAP, stackzap_api_url=fake.url, stackzap_api_key=SecretStr("k")
        )
        (result,) = await _gateway_checks(gateway, 2.0, "inst-1")
    assert result.status is Status.FAIL
    assert "ZAPSTREAM_STACKZAP_LISTING_FIELDS" in result.remedy


async def test_an_unknown_placeholder_instance_is_ok_and_a_named_one_fails() -> None:
    from pydantic import SecretStr

    from connectors.ops.doctor import DOCTOR_INSTANCE, _gateway_checks

    async with FakeGateway(lambda r: Reply(404, json={"error": "unknown instance"})) as fake:
        gateway = GatewaySettings(
            kind=GatewayKind.STACKZAP, stackzap_api_url=fake.url, stackzap_api_key=SecretStr("k")
        )
        (placeholder,) = await _gateway_checks(gateway, 2.0, DOCTOR_INSTANCE)
        (named,) = await _gateway_checks(gateway, 2.0, "inst-7")
    assert placeholder.status is Status.OK and "--instance" in placeholder.detail
    assert named.status is Status.FAIL and "inst-7" in named.detail
