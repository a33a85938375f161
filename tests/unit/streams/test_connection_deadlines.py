"""Connection deadlines: what the PostgreSQL DSN, the Kafka clients and the Faust app are given.

A peer that stops answering without closing must be noticed within a stated bound;
these tests pin the options that bound it (the behaviour on real sockets is in
tests/integration/test_hung_peers.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr, ValidationError

from connectors.sink.failures import classify
from streams.kernel.postgres import PostgresSilent, postgres_deadline
from streams.kernel.settings import KafkaSettings, PostgresSettings
from streams.worker_settings import WorkerSettings


def _params(dsn: str) -> dict[str, object]:
    return dict(conninfo_to_dict(dsn))


def test_the_dsn_gets_keepalives_tcp_user_timeout_and_connect_timeout() -> None:
    settings = PostgresSettings(url=SecretStr("postgresql://app:secret@db.example:5433/zap"))
    params = _params(settings.dsn)
    assert params["host"] == "db.example" and params["port"] == "5433"
    assert params["dbname"] == "zap" and params["password"] == "secret"
    assert params["connect_timeout"] == "10"
    assert params["keepalives"] == "1"
    assert params["keepalives_idle"] == "15"
    assert params["keepalives_interval"] == "5"
    assert params["keepalives_count"] == "3"
    assert params["tcp_user_timeout"] == "30000"  # libpq wants milliseconds
    assert "options" not in params, "statement_timeout belongs to service_dsn only"


def test_what_the_user_wrote_in_the_url_wins() -> None:
    url = "postgresql://u@h/db?keepalives_idle=120&tcp_user_timeout=0&connect_timeout=3"
    settings = PostgresSettings(url=SecretStr(url), keepalives_idle_s=7)
    params = _params(settings.dsn)
    assert params["keepalives_idle"] == "120"
    assert params["tcp_user_timeout"] == "0"
    assert params["connect_timeout"] == "3"
    assert params["keepalives_count"] == "3"  # not in the URL: ours


def test_a_key_value_dsn_is_merged_too_and_settings_change_the_values() -> None:
    settings = PostgresSettings(
        url=SecretStr("host=/run/postgresql dbname=zap"),
        connect_timeout_s=4,
        tcp_user_timeout_s=2.5,
        keepalives_count=9,
    )
    params = _params(settings.dsn)
    assert params["host"] == "/run/postgresql"
    assert params["connect_timeout"] == "4"
    assert params["tcp_user_timeout"] == "2500"
    assert params["keepalives_count"] == "9"


def test_tcp_user_timeout_zero_leaves_the_kernel_default() -> None:
    settings = PostgresSettings(tcp_user_timeout_s=0)
    assert "tcp_user_timeout" not in _params(settings.dsn)


def test_service_dsn_adds_statement_and_lock_timeouts_without_replacing_options() -> None:
    settings = PostgresSettings(
        url=SecretStr("postgresql://u@h/db?options=-c%20search_path%3Dzap"),
        statement_timeout_s=12,
        lock_timeout_s=0.5,
    )
    options = str(_params(settings.service_dsn)["options"])
    assert options == "-c search_path=zap -c statement_timeout=12000 -c lock_timeout=500"
    assert _params(settings.service_dsn)["tcp_user_timeout"] == "30000"


def test_service_dsn_keeps_a_statement_timeout_the_user_set_and_zero_sends_nothing() -> None:
    mine = PostgresSettings(url=SecretStr("postgresql://u@h/db?options=-c%20statement_timeout%3D0"))
    assert str(_params(mine.service_dsn)["options"]).count("statement_timeout") == 1
    assert "lock_timeout=10000" in str(_params(mine.service_dsn)["options"])
    off = PostgresSettings(statement_timeout_s=0, lock_timeout_s=0)
    assert "options" not in _params(off.service_dsn)


def test_kafka_clients_get_request_timeout_metadata_age_and_idle_bound() -> None:
    kafka = KafkaSettings(request_timeout_s=35, metadata_max_age_s=20, connections_max_idle_s=90)
    assert kafka.deadline_options() == {
        "request_timeout_ms": 35_000,
        "metadata_max_age_ms": 20_000,
        "connections_max_idle_ms": 90_000,
    }


def test_kafka_request_timeout_must_cover_the_session_timeout_and_the_fetch_wait() -> None:
    with pytest.raises(ValidationError, match="ZAPSTREAM_KAFKA_REQUEST_TIMEOUT_S=10"):
        KafkaSettings(request_timeout_s=10, session_timeout_s=30)
    with pytest.raises(ValidationError, match="FETCH_MAX_WAIT_MS"):
        KafkaSettings(request_timeout_s=1, session_timeout_s=1, fetch_max_wait_ms=1000)


def test_the_faust_app_gets_the_same_bounds(tmp_path: Path) -> None:
    from streams.app import build_app

    kafka = KafkaSettings(
        session_timeout_s=6, request_timeout_s=8, metadata_max_age_s=30, connections_max_idle_s=60
    )
    app = build_app(WorkerSettings(kafka=kafka, data_dir=str(tmp_path), app_id="deadlines"))
    conf = app.conf
    assert conf.broker_request_timeout == 8
    assert conf.consumer_metadata_max_age_ms == 30_000
    assert conf.producer_metadata_max_age_ms == 30_000
    assert conf.consumer_connections_max_idle_ms == 60_000
    assert conf.producer_connections_max_idle_ms == 60_000
    # Not lowered: aiokafka also expires unsent batches after it.
    assert conf.producer_request_timeout == 1200


async def test_postgres_deadline_turns_silence_into_a_transient_postgres_failure() -> None:
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(PostgresSilent, match=r"no answer to the write within 0\.05s") as caught:
        async with postgres_deadline(0.05, "the write"):
            await never
    failure = classify(caught.value)
    assert failure is not None
    assert failure.retriable and failure.dependency == "postgres"


async def test_postgres_deadline_lets_a_prompt_answer_through() -> None:
    async with postgres_deadline(5.0, "the read"):
        value = await asyncio.sleep(0, result=42)
    assert value == 42
