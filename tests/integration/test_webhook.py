"""The webhook intake on real PostgreSQL and Kafka, fed by hand and by the gateway simulator.

On Apache Kafka (the default) the module's topics live under a prefix of their own on the
process's shared broker (:mod:`devtools.stack.shared_broker`); the test that kills its broker
starts one of its own. ``DEVSTACK_BROKER=tansu`` runs it on Tansu.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer
from pydantic import SecretStr

from connectors.gateways.zapapi import ZapApiClient
from connectors.ops.topics import ensure_topics
from connectors.outbox.enqueue import enqueue
from connectors.webhook.intake import WebhookIntake, receipt_event_id
from connectors.webhook.settings import WebhookSettings
from connectors.webhook.signature import sign
from devtools.simulator.gateway_sim import CALLBACK_STATUS_HEADER, GatewaySimulator
from devtools.stack import shared_broker
from devtools.stack.devstack import TansuBroker
from devtools.stack.kafka_broker import KafkaBroker
from devtools.stack.local_pipeline import default_broker
from streams.kernel.attempt_reference import ReferenceKey
from streams.kernel.contract import (
    HEADER_JOB_ID,
    HEADER_SCHEMA,
    JobDead,
    JobStatus,
    ReceiptReceived,
    TopicNames,
    conversation_partition_key,
)
from streams.kernel.ports import TextMessage
from streams.kernel.settings import (
    BrokerFlavor,
    GatewayKind,
    GatewaySettings,
    KafkaSettings,
    PostgresSettings,
)

pytestmark = pytest.mark.integration

SECRET = "webhook-secret-0123456789-0123456789"
REFERENCE_KEY = "reference-key-0123456789-0123456789"
DEADLINE_S = 20.0
BROKER = default_broker()


@dataclasses.dataclass(frozen=True)
class Broker:
    """Where the module's topics live: a broker and the names in its namespace."""

    bootstrap: str
    topics: TopicNames


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """Every zapstream topic created up front: on Apache Kafka under a prefix of the
    module's own on the shared broker (deleted afterwards), on Tansu on a broker of its own."""
    if BROKER == "tansu":
        with TansuBroker() as tansu:
            here = Broker(tansu.bootstrap, TopicNames())
            asyncio.run(ensure_topics(kafka_settings(here)))
            yield here
        return
    here = Broker(shared_broker.shared_broker().bootstrap, TopicNames(shared_broker.next_prefix()))
    try:
        asyncio.run(ensure_topics(kafka_settings(here)))
        yield here
    finally:
        shared_broker.delete_namespace(here.bootstrap, here.topics.prefix)


def kafka_settings(broker: Broker) -> KafkaSettings:
    return KafkaSettings(
        brokers=broker.bootstrap,
        flavor=BrokerFlavor(BROKER),
        partitions=4,
        topic_prefix=broker.topics.prefix,
    )


def webhook_settings(
    dsn: str, broker: Broker, *, secret: str = SECRET, kind: GatewayKind = GatewayKind.STACKZAP
) -> WebhookSettings:
    return WebhookSettings(
        host="127.0.0.1",
        port=0,
        secret=SecretStr(secret),
        kafka=kafka_settings(broker),
        postgres=PostgresSettings(url=SecretStr(dsn)),
        gateway=GatewaySettings(kind=kind, reference_key=SecretStr(REFERENCE_KEY)),
    )


@pytest.fixture
async def intake(outbox_db: str, broker: Broker) -> AsyncIterator[WebhookIntake]:
    service = WebhookIntake(webhook_settings(outbox_db, broker))
    await service.start()
    assert service.port > 0
    try:
        yield service
    finally:
        await service.stop()
        await service.stop()  # idempotent


class Job:
    """A job enqueued through the application API, as the intake should find it."""

    def __init__(self, dsn: str, instance_id: str = "shop-1") -> None:
        self.idempotency_key = f"wh-{uuid.uuid4().hex}"
        self.instance_id = instance_id
        self.to = f"55119{uuid.uuid4().int % 10**8:08d}"
        with psycopg.connect(dsn) as conn:
            self.id = enqueue(
                conn,
                instance_id=instance_id,
                to=self.to,
                text="your order shipped",
                idempotency_key=self.idempotency_key,
            )
            row = conn.execute(
                "SELECT conversation_key FROM outbox_jobs WHERE id = %s", (self.id,)
            ).fetchone()
        assert row is not None and row[0]
        self.conversation_key: str = row[0]

    @property
    def reference(self) -> str:
        return f"{self.id}-1"

    @property
    def partition_key(self) -> bytes:
        return conversation_partition_key(self.instance_id, self.conversation_key)


def callback(gateway_job_id: str, status: str, **extra: Any) -> bytes:
    body: dict[str, Any] = {"event_id": uuid.uuid4().hex, "id": gateway_job_id, "status": status}
    body.update(extra)
    return orjson.dumps(body)


async def post(
    intake: WebhookIntake,
    raw: bytes,
    *,
    gateway: str = "zapapi",
    signature: str | None = "sign",
) -> httpx.Response:
    """POST ``raw``; ``signature="sign"`` signs it with the right secret, None sends none."""
    headers = {"Content-Type": "application/json"}
    if signature == "sign":
        headers["X-Zap-Signature"] = sign(SECRET, raw, gateway=gateway)
    elif signature is not None:
        headers["X-Zap-Signature"] = signature
    async with httpx.AsyncClient(base_url=intake.url) as http:
        return await http.post(f"/v1/webhooks/{gateway}", content=raw, headers=headers)


Consumed = list[tuple[bytes | None, dict[str, Any], dict[str, bytes]]]


async def read_topic(
    broker: Broker, topic: str, done: Callable[[Consumed], bool], timeout_s: float = DEADLINE_S
) -> Consumed:
    """Every record of ``topic`` from the start, polled until ``done(records)`` or the deadline."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: Consumed = []
    try:
        deadline = time.monotonic() + timeout_s
        while not done(records):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s}s reading {topic}; got {len(records)} records"
                )
            batches = await consumer.getmany(timeout_ms=200)
            for batch in batches.values():
                for r in batch:
                    records.append((r.key, orjson.loads(r.value), dict(r.headers)))
    finally:
        await consumer.stop()
    return records


def has_event(event_id: str) -> Callable[[Consumed], bool]:
    return lambda records: any(v.get("event_id") == event_id for _, v, _ in records)


async def test_signed_callback_with_reference_is_published_as_a_receipt(
    intake: WebhookIntake, outbox_db: str, broker: Broker
) -> None:
    job = Job(outbox_db)
    event_id = uuid.uuid4().hex
    raw = orjson.dumps(
        {
            "event_id": event_id,
            "id": "zap-g-1",
            "status": "delivery_ack",
            "reference": job.reference,
            "timestamp": 1767225600,
        }
    )
    response = await post(intake, raw)
    assert response.status_code == 202
    assert response.json() == {"accepted": True}

    records = await read_topic(broker, broker.topics.intents, has_event(event_id))
    [(key, value, headers)] = [r for r in records if r[1].get("event_id") == event_id]
    receipt = ReceiptReceived.from_dict(value)
    assert receipt.job_id == job.id
    assert receipt.idempotency_key == job.idempotency_key
    assert receipt.instance_id == job.instance_id
    assert receipt.conversation_key == job.conversation_key
    assert (receipt.gateway, receipt.gateway_job_id) == ("zapapi", "zap-g-1")
    assert (receipt.label, receipt.status) == ("delivery_ack", JobStatus.DELIVERED)
    assert receipt.received_at
    assert key == receipt.partition_key == job.partition_key
    assert headers[HEADER_SCHEMA] == ReceiptReceived.SCHEMA.encode()
    assert headers[HEADER_JOB_ID] == str(job.id).encode()
    assert intake.stats["accepted"] == 1


async def test_without_reference_the_job_is_found_by_gateway_job_id(
    intake: WebhookIntake, outbox_db: str, broker: Broker
) -> None:
    job = Job(outbox_db, instance_id="shop-2")
    gateway_job_id = f"sz-{uuid.uuid4().hex}"
    with psycopg.connect(outbox_db) as conn:
        conn.execute(
            "UPDATE outbox_jobs SET gateway_job_id = %s WHERE id = %s", (gateway_job_id, job.id)
        )
    # No event id: the intake derives the dedup key; an unknown label becomes REVIEW.
    delivered = orjson.dumps({"id": gateway_job_id, "status": "Delivered"})
    weird = orjson.dumps({"id": gateway_job_id, "status": "exploded", "reference": "not-ours"})
    for raw in (delivered, weird):
        assert (await post(intake, raw, gateway="stackzap")).status_code == 202

    digest = receipt_event_id("stackzap", gateway_job_id, "exploded")
    records = await read_topic(broker, broker.topics.intents, has_event(digest))
    mine = [ReceiptReceived.from_dict(v) for _, v, _ in records if v.get("job_id") == job.id]
    assert [(r.label, r.status) for r in mine] == [
        ("Delivered", JobStatus.DELIVERED),
        ("exploded", JobStatus.REVIEW),
    ]
    assert mine[0].event_id == receipt_event_id("stackzap", gateway_job_id, "delivered")
    assert all(r.gateway == "stackzap" and r.gateway_job_id == gateway_job_id for r in mine)
    # Retrying the same callback gives the same dedup key: the worker drops the copy.
    assert (await post(intake, delivered, gateway="stackzap")).status_code == 202
    assert (await post(intake, delivered, gateway="zapapi")).status_code == 202
    marker = receipt_event_id("zapapi", gateway_job_id, "delivered")
    records = await read_topic(broker, broker.topics.intents, has_event(marker))
    ids = [v["event_id"] for _, v, _ in records if v.get("job_id") == job.id]
    assert ids.count(mine[0].event_id) == 2


async def test_unauthenticated_callbacks_get_401_and_publish_nothing(
    intake: WebhookIntake, outbox_db: str, broker: Broker
) -> None:
    job = Job(outbox_db)
    rejected_ids = []
    for signature in (None, sign("wrong-secret", b"x", gateway="zapapi"), "deadbeef", ""):
        for reference in (job.reference, None):
            event_id = uuid.uuid4().hex
            rejected_ids.append(event_id)
            gateway_job_id = "g-known" if reference else f"g-unknown-{event_id}"
            raw = callback(gateway_job_id, "read", event_id=event_id, reference=reference)
            response = await post(intake, raw, signature=signature)
            assert response.status_code == 401, (signature, reference)
    # A body signed correctly and then changed in transit.
    tampered_id = uuid.uuid4().hex
    rejected_ids.append(tampered_id)
    original = callback("g-known", "sent", event_id=tampered_id, reference=job.reference)
    tampered = original.replace(b'"sent"', b'"read"')
    response = await post(intake, tampered, signature=sign(SECRET, original, gateway="zapapi"))
    assert response.status_code == 401
    assert intake.stats["unauthorized"] == 9

    # Markers published after the rejections: on the intents topic with the same key (so the
    # same partition, behind anything published before), on the dead letters (one partition).
    intents_marker = callback("g-known", "read", reference=job.reference)
    dead_marker = callback(f"g-unknown-{uuid.uuid4().hex}", "read")
    assert (await post(intake, intents_marker)).status_code == 202
    assert (await post(intake, dead_marker)).status_code == 202
    intents_event = orjson.loads(intents_marker)["event_id"]
    intents = await read_topic(broker, broker.topics.intents, has_event(intents_event))
    dead = await read_topic(
        broker,
        broker.topics.dead,
        lambda records: any(
            (v.get("record") or {}).get("event_id") == orjson.loads(dead_marker)["event_id"]
            for _, v, _ in records
        ),
    )
    published = {v.get("event_id") for _, v, _ in intents}
    published |= {(v.get("record") or {}).get("event_id") for _, v, _ in dead}
    assert published.isdisjoint(rejected_ids)
    assert [v["label"] for _, v, _ in intents if v.get("job_id") == job.id] == ["read"]


async def test_callbacks_signed_outside_the_replay_window_get_401_and_publish_nothing(
    intake: WebhookIntake, outbox_db: str, broker: Broker
) -> None:
    job = Job(outbox_db)
    now = int(time.time())
    rejected = []
    for signed_at in (now - 301, now - 86_400, now + 120):
        raw = callback("g-known", "read", reference=job.reference)
        rejected.append(orjson.loads(raw)["event_id"])
        response = await post(
            intake, raw, signature=sign(SECRET, raw, gateway="zapapi", timestamp=signed_at)
        )
        assert response.status_code == 401, signed_at
    legacy = callback("g-known", "read", reference=job.reference)
    rejected.append(orjson.loads(legacy)["event_id"])
    digest = hmac.new(SECRET.encode(), legacy, hashlib.sha256).hexdigest()
    assert (await post(intake, legacy, signature=f"sha256={digest}")).status_code == 401
    assert intake.stats["unauthorized"] == 4 and intake.stats["stale"] == 3
    # Signed a moment ago (inside the window): accepted, and the only one published.
    fresh = callback("g-known", "read", reference=job.reference)
    assert (
        await post(
            intake, fresh, signature=sign(SECRET, fresh, gateway="zapapi", timestamp=now - 5)
        )
    ).status_code == 202
    fresh_event = orjson.loads(fresh)["event_id"]
    records = await read_topic(broker, broker.topics.intents, has_event(fresh_event))
    published = {v.get("event_id") for _, v, _ in records}
    assert published.isdisjoint(rejected)
    [receipt] = [ReceiptReceived.from_dict(v) for _, v, _ in records if v.get("job_id") == job.id]
    assert receipt.reference == job.reference


async def test_an_empty_configured_secret_rejects_everything(
    outbox_db: str, broker: Broker
) -> None:
    """Only a Meta deployment may leave the X-Zap secret empty (Meta signs with its app
    secret); its StackZap and ZAP API paths then refuse everything."""
    job = Job(outbox_db)
    settings = webhook_settings(outbox_db, broker, secret="", kind=GatewayKind.META)
    async with WebhookIntake(settings) as intake:
        raw = callback("g-1", "read", reference=job.reference)
        async with httpx.AsyncClient(base_url=intake.url) as http:
            for signature in (sign("", raw, gateway="zapapi"), sign(SECRET, raw, gateway="zapapi")):
                response = await http.post(
                    "/v1/webhooks/zapapi", content=raw, headers={"X-Zap-Signature": signature}
                )
                assert response.status_code == 401
            assert (await http.get("/v1/webhooks/health")).status_code == 200
            assert (await http.get("/healthz")).status_code == 200
            ready = await http.get("/readyz")
            assert ready.status_code == 200 and ready.text == "ready\n"
            # The runtime's /metrics, mounted on the intake's own server.
            scraped = await http.get("/metrics")
            assert scraped.status_code == 200 and "python_info" in scraped.text
        assert intake.stats["unauthorized"] == 2
        assert intake.stats["accepted"] == 0


async def test_callback_for_an_unknown_job_goes_to_dead_letters(
    intake: WebhookIntake, outbox_db: str, broker: Broker
) -> None:
    gateway_job_id = f"ghost-{uuid.uuid4().hex}"
    event_id = uuid.uuid4().hex
    # A reference that parses but names no job, and a gateway id nobody recorded.
    raw = callback(
        gateway_job_id,
        "failed",
        event_id=event_id,
        reference="999999999-1",
        to="+5511987654321",
    )
    response = await post(intake, raw)
    assert response.status_code == 202
    assert response.json() == {"accepted": True}

    def found(records: Consumed) -> bool:
        return any((v.get("record") or {}).get("event_id") == event_id for _, v, _ in records)

    records = await read_topic(broker, broker.topics.dead, found)
    [(key, value, headers)] = [
        r for r in records if (r[1].get("record") or {}).get("event_id") == event_id
    ]
    dead = JobDead.from_dict(value)
    assert dead.job_id is None and dead.idempotency_key is None
    assert dead.reason.startswith("receipt for unknown job")
    assert gateway_job_id in dead.reason
    assert dead.record is not None
    assert dead.record["id"] == gateway_job_id and dead.record["status"] == "failed"
    assert dead.record["gateway"] == "zapapi"
    assert "to" not in dead.record  # allow-listed scalars only (issue 18, finding 8)
    assert b"5511987654321" not in orjson.dumps(value)
    assert key == gateway_job_id.encode()
    assert headers[HEADER_SCHEMA] == JobDead.SCHEMA.encode()
    # Nothing about it on the intents topic.
    assert intake.stats["unknown_job"] == 1 and intake.stats["accepted"] == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2, 3]",
        b'"just a string"',
        orjson.dumps({"status": "read"}),
        orjson.dumps({"id": "g-1"}),
        orjson.dumps({"id": "", "status": "read"}),
        orjson.dumps({"id": "g-1", "status": ""}),
        orjson.dumps({"id": "g-1", "status": 3}),
        orjson.dumps({"id": "g-1", "status": "read", "reference": 42}),
    ],
)
async def test_malformed_signed_callbacks_get_400(intake: WebhookIntake, raw: bytes) -> None:
    response = await post(intake, raw)
    assert response.status_code == 400
    assert intake.stats["malformed"] == 1


async def test_a_deeply_nested_callback_for_an_unknown_job_gets_400_not_500(
    intake: WebhookIntake,
) -> None:
    """Issue 18, finding 8: 254+ levels failed orjson's encoding of the dead-letter copy,
    so the gateway got 500 and retried for ever."""
    raw = b'{"id":"ghost-deep","status":"read","x":' + b"[" * 300 + b"]" * 300 + b"}"
    response = await post(intake, raw)
    assert response.status_code == 400
    assert "nested deeper than" in response.json()["error"]
    assert intake.stats["malformed"] == 1 and intake.stats["unknown_job"] == 0


async def test_a_reference_made_for_another_gateway_or_instance_is_dead_lettered(
    intake: WebhookIntake, outbox_db: str, broker: Broker
) -> None:
    """Issue 18, finding 2: the intake verifies a tagged reference for the webhook path's
    gateway and the job's instance; one that does not verify is never published."""
    job = Job(outbox_db)
    key = ReferenceKey(REFERENCE_KEY)
    forged = {
        "reference (stackzap)": key.reference("stackzap", job.instance_id, job.id, 1),
        "reference (instance)": key.reference("zapapi", "shop-other", job.id, 1),
        "reference (deployment)": ReferenceKey("x" * 32).reference(
            "zapapi", job.instance_id, job.id, 1
        ),
    }
    events = {}
    for what, reference in forged.items():
        raw = callback("g-bound", "read", reference=reference)
        events[orjson.loads(raw)["event_id"]] = what
        assert (await post(intake, raw, gateway="zapapi")).status_code == 202, what
    genuine = callback(
        "g-bound", "read", reference=key.reference("zapapi", job.instance_id, job.id, 1)
    )
    assert (await post(intake, genuine, gateway="zapapi")).status_code == 202
    assert intake.stats["unbound"] == 3 and intake.stats["accepted"] == 1

    def all_dead(records: Consumed) -> bool:
        seen = {(v.get("record") or {}).get("event_id") for _, v, _ in records}
        return set(events) <= seen

    dead = await read_topic(broker, broker.topics.dead, all_dead)
    mine = [
        JobDead.from_dict(v)
        for _, v, _ in dead
        if (v.get("record") or {}).get("event_id") in events
    ]
    assert len(mine) == 3
    assert all(d.job_id == job.id and "does not bind" in d.reason for d in mine)
    assert all("bad_reference" in d.reason for d in mine)
    genuine_event = orjson.loads(genuine)["event_id"]
    intents = await read_topic(broker, broker.topics.intents, has_event(genuine_event))
    published = {v.get("event_id") for _, v, _ in intents}
    assert published.isdisjoint(events)


async def test_unknown_gateway_path_is_404(intake: WebhookIntake) -> None:
    raw = callback("g-1", "read")
    assert (await post(intake, raw, gateway="other")).status_code == 404


async def test_kafka_down_answers_503(outbox_db: str) -> None:
    job = Job(outbox_db)
    # A broker of its own: the test kills it.
    with KafkaBroker() if BROKER == "kafka" else TansuBroker() as node:
        own = Broker(node.bootstrap, TopicNames())
        await ensure_topics(kafka_settings(own))
        intake = WebhookIntake(webhook_settings(outbox_db, own), publish_timeout_s=2)
        await intake.start()
        try:
            ok = await post(intake, callback("g-1", "sent", reference=job.reference))
            assert ok.status_code == 202
            if isinstance(node, KafkaBroker):
                await asyncio.to_thread(node.kill)  # SIGKILL, waits until the JVM is gone
            else:
                node.process.kill()
                await asyncio.to_thread(node.process.wait, 10)
            started = time.monotonic()
            response = await post(intake, callback("g-1", "read", reference=job.reference))
            assert response.status_code == 503
            assert time.monotonic() - started < 10
            assert intake.stats == {
                "accepted": 1,
                "unknown_job": 0,
                "unauthorized": 0,
                "stale": 0,
                "malformed": 0,
                "unbound": 0,
                "replayed": 0,
                "unavailable": 1,
                "ignored": 0,
            }
        finally:
            await intake.stop()


# --- the simulator calling the intake back ------------------------------------------------


@pytest.fixture
async def sim(intake: WebhookIntake) -> AsyncIterator[GatewaySimulator]:
    simulator = GatewaySimulator(seed=3)
    await simulator.start()
    simulator.configure(
        callback_url=f"{intake.url}/v1/webhooks/zapapi",
        callback_secret=SECRET,
        callback_delay_ms=20,
    )
    try:
        yield simulator
    finally:
        await simulator.stop()


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_simulator_callbacks_arrive_as_three_receipts_in_order(
    sim: GatewaySimulator, intake: WebhookIntake, outbox_db: str, broker: Broker
) -> None:
    job = Job(outbox_db, instance_id="shop-sim")
    settings = GatewaySettings(zap_api_url=sim.url, read_timeout_s=5.0)
    async with ZapApiClient(settings) as client:
        accepted = await client.send_text(
            TextMessage(instance_id=job.instance_id, to=job.to, text="hi", reference=job.reference)
        )
    assert accepted.gateway_job_id == sim.messages[0].id
    await wait_for(lambda: sim.stats()["callbacks_sent"] == 3, "three callbacks")
    assert sim.stats()["callbacks_failed"] == 0
    assert sim.messages[0].status == "read"

    def three(records: Consumed) -> bool:
        return sum(1 for _, v, _ in records if v.get("job_id") == job.id) >= 3

    records = await read_topic(broker, broker.topics.intents, three)
    mine = [(k, ReceiptReceived.from_dict(v)) for k, v, _ in records if v.get("job_id") == job.id]
    assert [(r.label, r.status) for _, r in mine] == [
        ("sent", JobStatus.ACCEPTED),
        ("delivered", JobStatus.DELIVERED),
        ("read", JobStatus.READ),
    ]
    assert all(r.gateway_job_id == accepted.gateway_job_id for _, r in mine)
    assert all(k == job.partition_key for k, _ in mine)
    assert len({r.event_id for _, r in mine}) == 3

    # Replays through the control endpoint: unsigned is refused by the intake, a signed
    # duplicate with a chosen event id goes through (the worker dedups it by event id).
    async with httpx.AsyncClient(base_url=sim.url) as http:
        unsigned = await http.post(
            "/_sim/callbacks/emit",
            json={"id": accepted.gateway_job_id, "status": "delivered", "signed": False},
        )
        assert unsigned.status_code == 200
        assert unsigned.headers[CALLBACK_STATUS_HEADER] == "401"
        sent = unsigned.json()
        assert sent["id"] == accepted.gateway_job_id and sent["status"] == "delivered"
        assert sent["reference"] == job.reference

        replay_id = mine[1][1].event_id
        replay = await http.post(
            "/_sim/callbacks/emit",
            json={"id": accepted.gateway_job_id, "status": "delivered", "event_id": replay_id},
        )
        assert replay.headers[CALLBACK_STATUS_HEADER] == "202"
        assert replay.json()["event_id"] == replay_id
        unknown = await http.post("/_sim/callbacks/emit", json={"id": "nope", "status": "read"})
        assert unknown.status_code == 404
    assert intake.stats["unauthorized"] == 1
    assert sim.stats()["callbacks_failed"] == 1
    assert sim.stats()["callbacks_sent"] == 4

    def four(records: Consumed) -> bool:
        return sum(1 for _, v, _ in records if v.get("job_id") == job.id) >= 4

    records = await read_topic(broker, broker.topics.intents, four)
    labels = [v["label"] for _, v, _ in records if v.get("job_id") == job.id]
    assert labels == ["sent", "delivered", "read", "delivered"]
    assert unsigned.json()["event_id"] not in {v.get("event_id") for _, v, _ in records}
