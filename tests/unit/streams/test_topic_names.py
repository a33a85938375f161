"""``ZAPSTREAM_KAFKA_TOPIC_PREFIX``: every topic and consumer group named from one setting.

Without a prefix the names are the contract's (``zapstream.intents``, ``zapstream-worker``);
with one, every topic ``topics ensure`` creates or a deployable checks, every topic the worker
declares to Faust (changelogs and Faust's leader topic included), every group and the relay's
routing carry it; an invalid prefix refuses the start in one line naming the setting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr, ValidationError

from connectors.cdc.outbox_rows import CapturedIntent, row_to_intent
from connectors.cdc.relay import OutboxRelay
from connectors.cdc.settings import RelaySettings
from connectors.sink.settings import SinkSettings
from connectors.startup import render_validation_error
from streams.controls import ControlsReader
from streams.kernel.contract import (
    BULK_INTENTS,
    CONTROLS,
    DEFAULT_NAMES,
    INTENTS,
    INVALID,
    LOGICAL_TOPICS,
    STATE,
    TOPIC_NAME_MAX,
    CommandRequested,
    ControlAction,
    ControlChanged,
    ControlKind,
    IntentRejected,
    Record,
    TopicNames,
    control_key,
    topic_specs,
)
from streams.kernel.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.kernel.settings import KafkaSettings, LagMonitorSettings
from streams.kernel.topics_check import _NEEDS, all_topic_specs, deployable_topic_specs
from streams.lag_monitor import LagMonitor
from streams.sink_progress import SinkProgress
from streams.worker import build_worker_app
from streams.worker_settings import WorkerSettings

PREFIX = "staging-"


def test_without_a_prefix_every_name_is_the_contracts() -> None:
    names = KafkaSettings().names
    assert names == DEFAULT_NAMES == TopicNames("")
    assert names.all() == LOGICAL_TOPICS
    assert (names.intents, names.bulk_intents, names.state, names.controls) == (
        "zapstream.intents",
        "zapstream.intents.bulk",
        "zapstream.state",
        "zapstream.controls",
    )
    assert [s.name for s in topic_specs(12)] == list(LOGICAL_TOPICS)
    assert [s.name for s in all_topic_specs(KafkaSettings())] == list(LOGICAL_TOPICS)
    worker = WorkerSettings()
    assert (worker.group_id, worker.sink_group_id) == ("zapstream-worker", "zapstream-state-sink")
    assert SinkSettings().consumer_group == "zapstream-state-sink"
    assert LagMonitorSettings().watched() == {
        "zapstream-worker": [INTENTS, BULK_INTENTS],
        "zapstream-state-sink": [STATE, INVALID],
    }


def test_the_prefix_goes_before_every_topic_and_every_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZAPSTREAM_KAFKA_TOPIC_PREFIX", PREFIX)
    kafka = KafkaSettings()
    names = kafka.names
    assert names.prefix == PREFIX
    assert names.all() == tuple(PREFIX + t for t in LOGICAL_TOPICS)
    assert names.by_logical() == {t: PREFIX + t for t in LOGICAL_TOPICS}
    assert (names.intents_for("bulk"), names.intents_for("operational")) == (
        f"{PREFIX}zapstream.intents.bulk",
        f"{PREFIX}zapstream.intents",
    )
    # topics ensure, and what each deployable checks at start: the same topics, prefixed.
    unprefixed = {s.name: (s.partitions, dict(s.configs)) for s in topic_specs(12)}
    specs = {s.name: (s.partitions, dict(s.configs)) for s in all_topic_specs(kafka)}
    assert specs == {PREFIX + name: spec for name, spec in unprefixed.items()}
    for deployable in _NEEDS:
        checked = [s.name for s in deployable_topic_specs(deployable, kafka)]
        assert checked and all(n.startswith(PREFIX) and n in specs for n in checked), deployable
    # Groups: the worker's (its Faust app id), the sink's, the lag monitor's defaults.
    worker = WorkerSettings()
    assert worker.group_id == f"{PREFIX}zapstream-worker"
    assert worker.sink_group_id == f"{PREFIX}zapstream-state-sink"
    assert SinkSettings().consumer_group == f"{PREFIX}zapstream-state-sink"
    monkeypatch.setenv("ZAPSTREAM_SINK_GROUP_ID", "sink-b")
    assert SinkSettings().consumer_group == f"{PREFIX}sink-b"
    assert LagMonitorSettings().watched() == {
        f"{PREFIX}zapstream-worker": [PREFIX + INTENTS, PREFIX + BULK_INTENTS],
        f"{PREFIX}zapstream-state-sink": [PREFIX + STATE, PREFIX + INVALID],
    }


class _Gateway:
    name = "stub"
    url_setting = "ZAP_API_URL"

    async def send_text(self, message: TextMessage) -> SendAccepted:
        raise AssertionError("nothing is sent here")

    async def list_for_reconciliation(
        self, instance_id: str, *, references: Sequence[str] = (), **_: object
    ) -> list[ListedJob] | None:
        return []

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        return CancelOutcome.UNSUPPORTED

    async def probe_configuration(self, instance_id: str) -> str:
        return "fine"

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class _History:
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _faust_topic_names(app: Any, topics: Any) -> set[str]:
    """What the app declares: its topic objects, the agents' and tables' topics, the leader's."""
    names = {
        getattr(topics, f).get_topic_name() for f in topics.__dataclass_fields__ if f != "names"
    }
    names |= {t for agent in app.agents.values() for t in agent.channel.topics}
    names |= {table.changelog_topic.get_topic_name() for table in app.tables.values()}
    names.add(app._leader_assignor._leader_topic_name)
    return names


def test_the_worker_app_names_every_topic_and_group_with_the_prefix(tmp_path: Path) -> None:
    settings = WorkerSettings(
        kafka=KafkaSettings(topic_prefix=PREFIX, partitions=4),
        data_dir=str(tmp_path),
        start_probe=False,
    )
    app, dispatcher = build_worker_app(settings, _Gateway(), history=_History())  # type: ignore[arg-type]
    assert app.conf.id == f"{PREFIX}zapstream-worker"  # its consumer group
    topics = _faust_topic_names(app, dispatcher.topics)
    assert set(settings.kafka.names.all()) - {PREFIX + CONTROLS} <= topics
    assert f"{PREFIX}zapstream-worker-__assignor-__leader" in topics
    assert all(t.startswith(PREFIX) for t in topics), sorted(topics)
    assert dispatcher.topic == f"{PREFIX}zapstream.intents"
    readers: dict[type, Any] = {type(r): r for r in app.resources}
    assert readers[ControlsReader].topic == f"{PREFIX}zapstream.controls"
    progress = readers[SinkProgress]
    assert (progress.group_id, progress.topic) == (
        f"{PREFIX}zapstream-state-sink",
        f"{PREFIX}zapstream.state",
    )
    assert readers[LagMonitor].groups == {
        f"{PREFIX}zapstream-worker": [
            f"{PREFIX}zapstream.intents",
            f"{PREFIX}zapstream.intents.bulk",
        ]
    }
    processor = dispatcher.processor
    assert processor.store.topic == f"{PREFIX}zapstream.state"  # type: ignore[attr-defined]
    publisher = processor.publisher
    assert (publisher.results, publisher.dead) == (  # type: ignore[attr-defined]
        f"{PREFIX}zapstream.results",
        f"{PREFIX}zapstream.dead",
    )


def _row(priority: str) -> dict[str, str | None]:
    return {
        "id": "42",
        "instance_id": "shop-1",
        "payload": orjson.dumps({"type": "text", "to": "+55 11 98765-4321", "text": "hi"}).decode(),
        "idempotency_key": "order-1",
        "conversation_key": None,
        "priority": priority,
        "purpose": None,
        "expires_at": None,
        "max_attempts": "5",
        "created_at": "2026-11-29 15:50:00+00",
    }


class _Producer:
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def _never() -> Any:
    raise AssertionError("not connected in this test")


def test_the_relay_routes_every_record_to_its_prefixed_topic() -> None:
    settings = RelaySettings(kafka=KafkaSettings(topic_prefix=PREFIX), metrics_port=0)
    relay = OutboxRelay(settings, _Producer(), source_factory=_never, provision=_never)  # type: ignore[arg-type]
    operational = row_to_intent(_row("operational"), lsn="0/1", committed_at=None)
    bulk = row_to_intent(_row("bulk"), lsn="0/1", committed_at=None)
    command = CommandRequested(
        command_id=7,
        command="cancel",
        job_id=42,
        idempotency_key="order-1",
        instance_id="shop-1",
        conversation_key="c",
        reason="",
        actor="op",
    )
    control = ControlChanged(
        kind=ControlKind.INSTANCE,
        target="shop-1",
        action=ControlAction.PAUSE,
        reason="",
        actor="op",
        at=None,
        control_id=1,
    )
    rejected = IntentRejected(job_id=42, reason="bad", row={}, lsn="0/1", committed_at=None)
    assert isinstance(operational, CapturedIntent) and isinstance(bulk, CapturedIntent)
    records: list[tuple[str, Record | CapturedIntent]] = [
        ("operational", operational),
        ("operational record", operational.record()),
        ("bulk", bulk),
        ("command", command),
        ("control", control),
        ("rejected", rejected),
    ]
    routed = {name: relay._route(record)[0] for name, record in records}
    assert routed == {
        "operational": f"{PREFIX}zapstream.intents",
        "operational record": f"{PREFIX}zapstream.intents",
        "bulk": f"{PREFIX}zapstream.intents.bulk",
        "command": f"{PREFIX}zapstream.intents",
        "control": f"{PREFIX}zapstream.controls",
        "rejected": f"{PREFIX}zapstream.invalid",
    }
    assert relay._route(control)[1] == control_key(ControlKind.INSTANCE, "shop-1")
    asyncio.run(relay.stop())


def test_the_sink_and_the_webhook_take_their_topics_from_the_prefix() -> None:
    from connectors.sink.state_sink import StateSink
    from connectors.webhook.intake import WebhookIntake
    from connectors.webhook.settings import WebhookSettings

    kafka = KafkaSettings(topic_prefix=PREFIX)
    sink = StateSink(SinkSettings(kafka=kafka, metrics_port=0))
    assert (sink._names.state, sink._names.invalid, sink._names.dead) == (
        f"{PREFIX}zapstream.state",
        f"{PREFIX}zapstream.invalid",
        f"{PREFIX}zapstream.dead",
    )
    intake = WebhookIntake(WebhookSettings(kafka=kafka, secret=SecretStr("s" * 32)))
    assert (intake._names.intents, intake._names.dead) == (
        f"{PREFIX}zapstream.intents",
        f"{PREFIX}zapstream.dead",
    )


@pytest.mark.parametrize(
    ("prefix", "problem"),
    [
        ("staging/", "has characters a Kafka topic name cannot hold ('/')"),
        ("a b:", "has characters a Kafka topic name cannot hold (' ' ':')"),
        ("tenant-ü-", "has characters a Kafka topic name cannot hold ('ü')"),
        ("x" * (TOPIC_NAME_MAX - len(BULK_INTENTS) + 1), "is too long"),
    ],
)
def test_an_invalid_prefix_is_refused_in_one_line_naming_the_setting(
    prefix: str, problem: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        KafkaSettings(topic_prefix=prefix)
    [line] = render_validation_error(caught.value)
    assert line.startswith(f"ZAPSTREAM_KAFKA_TOPIC_PREFIX: {problem}"), line
    with pytest.raises(ValueError, match="topic prefix"):
        TopicNames(prefix)


def test_the_longest_prefix_kafka_allows_is_accepted() -> None:
    longest = "x" * (TOPIC_NAME_MAX - len(BULK_INTENTS))
    names = KafkaSettings(topic_prefix=longest).names
    assert max(len(n) for n in names.all()) == TOPIC_NAME_MAX
    assert TopicNames("a.B_9-").intents == "a.B_9-zapstream.intents"


def test_a_worker_app_id_whose_faust_topics_kafka_refuses_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        WorkerSettings(kafka=KafkaSettings(topic_prefix="x" * 220), app_id="zapstream-worker")
    [line] = render_validation_error(caught.value)
    assert "ZAPSTREAM_KAFKA_TOPIC_PREFIX + ZAPSTREAM_WORKER_APP_ID" in line
    assert "is too long" in line
    with pytest.raises(ValidationError, match="cannot hold"):
        WorkerSettings(app_id="zapstream worker")


def test_the_command_line_refuses_an_invalid_prefix_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from connectors.cli import main

    monkeypatch.setenv("ZAPSTREAM_KAFKA_TOPIC_PREFIX", "prod/")
    assert main(["topics", "ensure"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "zapstream: ZAPSTREAM_KAFKA_TOPIC_PREFIX: has characters a Kafka topic name cannot "
        "hold ('/'): use [a-zA-Z0-9._-] (got 'prod/')"
    ]
