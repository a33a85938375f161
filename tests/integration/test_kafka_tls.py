"""Kafka over TLS on real processes: a throwaway CA, a TLS broker, zapstream's clients.

The broker is the integration tests' (:func:`devtools.stack.local_pipeline.default_broker`:
Apache Kafka, or Tansu with ``DEVSTACK_BROKER=tansu``). The broker's side of TLS is
:class:`devtools.stack.tls.TlsTerminator` in front of its plaintext listener (the ``tls`` of
:class:`devtools.stack.kafka_broker.KafkaBroker` and :class:`devtools.stack.devstack.TansuBroker`;
Tansu 0.6.0 ignores ``--cert``/``--key``); the clients' side is the real one: aiokafka
and Faust with the ``ssl.SSLContext`` built from the settings.

- ``zapstream topics ensure`` with ``ZAPSTREAM_KAFKA_SECURITY_PROTOCOL=SSL`` and the
  CA file creates the topics; without the CA file (or with another CA) it exits 2
  with one line naming ``ZAPSTREAM_KAFKA_SSL_CAFILE``, and so does every
  long-running deployable at start instead of waiting for a broker it will never
  trust.
- The relay's producer and the group-less reader round-trip a record over TLS.
- Mutual TLS: a client certificate from ``ZAPSTREAM_KAFKA_SSL_CERTFILE``/``_KEYFILE``.
- The whole pipeline (relay, Faust worker, sink) delivers a message over TLS.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from aiokafka import TopicPartition

from connectors.cdc.relay import build_producer
from connectors.cdc.settings import RelaySettings
from connectors.outbox.enqueue import enqueue
from devtools.stack.devstack import TansuBroker
from devtools.stack.kafka_broker import KafkaBroker
from devtools.stack.local_pipeline import (
    REFERENCE_KEY,
    WEBHOOK_SECRET,
    LocalPipeline,
    default_broker,
)
from devtools.stack.tls import Pki, ServerTls, make_pki
from streams.kafka_reader import group_less_consumer
from streams.kernel.contract import INTENTS
from streams.kernel.settings import KafkaSettings
from tests.integration.support import Arrivals, wait_for_status, wait_until, zapstream

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 2
BROKER = default_broker()


def tls_broker_of(tls: ServerTls) -> KafkaBroker | TansuBroker:
    """A broker of the integration tests' kind, TLS-only on its port."""
    return KafkaBroker(tls=tls) if BROKER == "kafka" else TansuBroker(tls=tls)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(pki: Pki) -> Iterator[KafkaBroker | TansuBroker]:
    with tls_broker_of(pki.server) as broker:
        yield broker


def kafka_env(bootstrap: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
    env.update(
        {
            "PYTHONPATH": str(REPO_ROOT),
            "ZAPSTREAM_KAFKA_BROKERS": bootstrap,
            "ZAPSTREAM_KAFKA_FLAVOR": BROKER,
            "ZAPSTREAM_KAFKA_PARTITIONS": str(PARTITIONS),
            "ZAPSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
            # What the worker and the webhook refuse to start without (checked before Kafka).
            "ZAPSTREAM_REFERENCE_KEY": REFERENCE_KEY,
            "ZAPSTREAM_WEBHOOK_SECRET": WEBHOOK_SECRET,
        }
    )
    env.update(extra)
    return env


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_topics_ensure_over_tls_with_the_ca(
    tls_broker: KafkaBroker | TansuBroker, pki: Pki
) -> None:
    env = kafka_env(tls_broker.bootstrap, ZAPSTREAM_KAFKA_SSL_CAFILE=str(pki.ca_file))
    code, out, err = zapstream(["topics", "ensure"], env)
    assert code == 0, err
    assert out.startswith("topics created: ") and INTENTS in out
    code, out, _ = zapstream(["topics", "ensure"], env)
    assert (code, out.strip()) == (0, "topics created: none (all exist)")


@pytest.mark.parametrize(
    "ca", ["system trust store", "another CA"], ids=["no-cafile", "wrong-cafile"]
)
def test_an_untrusted_broker_certificate_is_one_line_and_exit_2(
    tls_broker: KafkaBroker | TansuBroker, pki: Pki, ca: str
) -> None:
    extra = {"ZAPSTREAM_KAFKA_SSL_CAFILE": str(pki.other_ca_file)} if ca == "another CA" else {}
    code, out, err = zapstream(["topics", "ensure"], kafka_env(tls_broker.bootstrap, **extra))
    assert code == 2
    assert out == ""
    (line,) = stderr_lines(err)
    assert line.startswith("zapstream: Kafka's TLS certificate was not accepted (")
    assert "unable to get local issuer certificate" in line
    assert "ZAPSTREAM_KAFKA_SSL_CAFILE" in line


@pytest.mark.parametrize("deployable", ["relay", "worker", "sink", "webhook"])
def test_a_service_does_not_wait_for_a_broker_it_will_never_trust(
    tls_broker: KafkaBroker | TansuBroker, deployable: str
) -> None:
    # Without the CA file: refused at the start-up topic check, before PostgreSQL.
    code, _, err = zapstream([deployable], kafka_env(tls_broker.bootstrap), timeout_s=60)
    assert code == 2
    (line,) = stderr_lines(err)
    assert "certificate verify" in line or "local issuer certificate" in line
    assert "ZAPSTREAM_KAFKA_SSL_CAFILE" in line


def test_relay_producer_and_group_less_reader_round_trip_over_tls(
    tls_broker: KafkaBroker | TansuBroker, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = kafka_env(tls_broker.bootstrap, ZAPSTREAM_KAFKA_SSL_CAFILE=str(pki.ca_file))
    code, _, err = zapstream(["topics", "ensure"], env)
    assert code == 0, err
    for name, value in env.items():
        if name.startswith("ZAPSTREAM_"):
            monkeypatch.setenv(name, value)
    settings = RelaySettings()  # from the environment, as `zapstream relay` builds it
    assert settings.kafka.security_protocol == "SSL"
    value = f"over-tls-{uuid.uuid4().hex}".encode()

    async def round_trip() -> bytes | None:
        producer = build_producer(settings)
        await producer.start()
        try:
            sent = await producer.send_and_wait(INTENTS, value, key=b"k", partition=0)
        finally:
            await producer.stop()
        consumer = group_less_consumer(KafkaSettings(), "tls-test", auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = TopicPartition(INTENTS, 0)
            consumer.assign([tp])
            consumer.seek(tp, sent.offset)
            record = await asyncio.wait_for(consumer.getone(), 30)
            return record.value
        finally:
            await consumer.stop()

    assert asyncio.run(round_trip()) == value


def test_mutual_tls_needs_the_client_certificate(pki: Pki) -> None:
    with tls_broker_of(pki.server_mutual) as broker:
        env = kafka_env(broker.bootstrap, ZAPSTREAM_KAFKA_SSL_CAFILE=str(pki.ca_file))
        code, out, err = zapstream(
            ["topics", "ensure"],
            {
                **env,
                "ZAPSTREAM_KAFKA_SSL_CERTFILE": str(pki.client_cert),
                "ZAPSTREAM_KAFKA_SSL_KEYFILE": str(pki.client_key),
            },
        )
        assert code == 0, err
        assert INTENTS in out
        # Without it: TLS 1.3 refuses a missing client certificate after the handshake,
        # so the client only sees the connection closed, like a broker going away.
        code, _, err = zapstream(["topics", "ensure"], env)
        assert code == 2
        (line,) = stderr_lines(err)
        assert line.startswith("zapstream: cannot reach Kafka (ZAPSTREAM_KAFKA_BROKERS)")


def test_the_pipeline_delivers_over_tls(pki: Pki) -> None:
    with LocalPipeline(partitions=PARTITIONS, tls=pki) as pipeline:
        assert pipeline.env()["ZAPSTREAM_KAFKA_SECURITY_PROTOCOL"] == "SSL"
        pipeline.start_relay()
        pipeline.start_worker()
        key = f"tls-{uuid.uuid4().hex}"
        text = f"sent over TLS [{key}:0]"
        with psycopg.connect(pipeline.dsn) as conn:
            enqueue(
                conn, instance_id="shop-tls", to="5511912345678", text=text, idempotency_key=key
            )
            conn.commit()
        arrivals = Arrivals(pipeline)
        wait_until(
            lambda: any(m["text"] == text for m in arrivals.refresh()),
            90,
            "the message at the gateway, relayed and sent over TLS",
        )
        wait_for_status(pipeline.dsn, [key], "ACCEPTED", 60)
