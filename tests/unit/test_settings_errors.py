"""Settings errors name environment variables; unknown ``ZAPSTREAM_*`` variables are caught."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from connectors.cdc.settings import RelaySettings
from connectors.sink.settings import SinkSettings
from connectors.startup import (
    NOT_SETTINGS,
    describe_connection_failure,
    env_names,
    known_env_names,
    mask_secrets,
    render_settings_error,
    render_validation_error,
    settings_classes,
    unknown_env_lines,
)
from connectors.webhook.settings import WebhookSettings
from streams.kernel.settings import GatewaySettings, KafkaSettings, PostgresSettings
from streams.worker_settings import WorkerSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith(("ZAPSTREAM_", "STACKZAP_", "ZAP_")):
            monkeypatch.delenv(name)


def validation_error(cls: type, monkeypatch: pytest.MonkeyPatch, **env: str) -> ValidationError:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as info:
        cls()
    return info.value


def test_every_deployable_settings_class_is_found() -> None:
    found = set(settings_classes())
    expected = {KafkaSettings, PostgresSettings, GatewaySettings, WorkerSettings}
    assert expected | {RelaySettings, SinkSettings, WebhookSettings} <= found


@pytest.mark.parametrize(
    ("cls", "field", "env"),
    [
        (KafkaSettings, "partitions", "ZAPSTREAM_KAFKA_PARTITIONS"),
        (PostgresSettings, "url", "ZAPSTREAM_DATABASE_URL"),
        (GatewaySettings, "kind", "ZAPSTREAM_GATEWAY"),
        (GatewaySettings, "stackzap_api_key", "STACKZAP_API_KEY"),
        (GatewaySettings, "connect_timeout_s", "ZAPSTREAM_GATEWAY_CONNECT_TIMEOUT_S"),
        (WorkerSettings, "max_in_flight", "ZAPSTREAM_WORKER_MAX_IN_FLIGHT"),
        (RelaySettings, "slot", "ZAPSTREAM_RELAY_SLOT"),
        (SinkSettings, "within_s", "ZAPSTREAM_SINK_WITHIN_S"),
        (WebhookSettings, "secret", "ZAPSTREAM_WEBHOOK_SECRET"),
    ],
)
def test_field_maps_to_its_environment_variable(cls: type, field: str, env: str) -> None:
    assert env_names(cls, field)[0] == env


def test_known_names_cover_every_field_and_the_allow_list() -> None:
    known = known_env_names()
    assert "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH" in known
    assert "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S" in known
    assert "ZAPSTREAM_STACKZAP_LABELS" in known
    assert NOT_SETTINGS <= known
    assert not any(name.startswith(("STACKZAP_", "ZAP_")) for name in known)


def test_a_bound_violation_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    exc = validation_error(WorkerSettings, monkeypatch, ZAPSTREAM_KAFKA_PARTITIONS="0")
    assert render_validation_error(exc) == ["ZAPSTREAM_KAFKA_PARTITIONS: must be >= 1 (got '0')"]


def test_an_own_field_of_a_deployable_names_its_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    exc = validation_error(RelaySettings, monkeypatch, ZAPSTREAM_RELAY_STATUS_INTERVAL_S="0")
    assert render_validation_error(exc) == [
        "ZAPSTREAM_RELAY_STATUS_INTERVAL_S: must be > 0 (got '0')"
    ]


def test_an_aliased_field_names_its_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    exc = validation_error(GatewaySettings, monkeypatch, ZAPSTREAM_GATEWAY="whatsapp")
    assert render_validation_error(exc) == [
        "ZAPSTREAM_GATEWAY: must be 'stackzap', 'zapapi' or 'meta' (got 'whatsapp')"
    ]


def test_a_list_element_names_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    exc = validation_error(
        WorkerSettings, monkeypatch, ZAPSTREAM_WORKER_RETRY_SCHEDULE_S='[1, "soon"]'
    )
    (line,) = render_validation_error(exc)
    assert line.startswith("ZAPSTREAM_WORKER_RETRY_SCHEDULE_S[1]: must be a valid number")
    assert line.endswith("(got 'soon')")


def test_a_custom_validator_message_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    exc = validation_error(GatewaySettings, monkeypatch, ZAPSTREAM_STACKZAP_LABELS='{"x": "NOPE"}')
    (line,) = render_validation_error(exc)
    assert line.startswith("ZAPSTREAM_STACKZAP_LABELS: label 'x' maps to unknown status 'NOPE'")


def test_a_secret_value_is_never_shown() -> None:
    class Fake(Exception):
        title = "WebhookSettings"

        def errors(self) -> list[dict[str, object]]:
            return [{"type": "x", "loc": ("secret",), "msg": "bad", "input": "hunter2"}]

    assert render_validation_error(Fake()) == ["ZAPSTREAM_WEBHOOK_SECRET: bad"]


def test_a_validation_error_of_another_model_is_not_rendered() -> None:
    from pydantic import BaseModel

    class Other(BaseModel):
        n: int

    with pytest.raises(ValidationError) as info:
        Other(n="x")  # type: ignore[arg-type]
    assert render_validation_error(info.value) == []


def test_invalid_json_names_the_variable_that_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZAPSTREAM_RELAY_MAX_IN_FLIGHT", "5")
    environ = {"ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[1,"}
    monkeypatch.setenv("ZAPSTREAM_WORKER_RETRY_SCHEDULE_S", "[1,")
    with pytest.raises(SettingsError) as info:
        WorkerSettings()
    line = render_settings_error(info.value, environ)
    assert line.startswith("ZAPSTREAM_WORKER_RETRY_SCHEDULE_S: not valid JSON")


def test_a_misspelt_variable_gets_a_suggestion() -> None:
    environ = {
        "ZAPSTREAM_WORKER_MAX_INFLIGHT": "3",
        "ZAPSTREAM_KAFKA_PARTITIONS": "8",
        "ZAPSTREAM_SECRETS_DIR": "/run/secrets",
        "STACKZAP_API_KEY": "k",
        "PATH": "/bin",
    }
    assert unknown_env_lines(environ) == [
        "ZAPSTREAM_WORKER_MAX_INFLIGHT: unknown variable, no zapstream setting reads it "
        "(did you mean ZAPSTREAM_WORKER_MAX_IN_FLIGHT?)"
    ]


def test_names_are_matched_case_insensitively_like_pydantic_settings() -> None:
    assert unknown_env_lines({"zapstream_kafka_partitions": "8"}) == []


def test_an_unrelated_unknown_variable_gets_no_suggestion() -> None:
    (line,) = unknown_env_lines({"ZAPSTREAM_QQQQQQQQQ": "1"})
    assert line == "ZAPSTREAM_QQQQQQQQQ: unknown variable, no zapstream setting reads it"


def test_passwords_are_masked() -> None:
    assert mask_secrets("postgresql://app:pw@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert mask_secrets("host=db password=pw user=app") == "host=db password=*** user=app"


def test_connection_failures_name_the_setting() -> None:
    import psycopg
    from aiokafka.errors import KafkaConnectionError

    pg = describe_connection_failure(
        psycopg.OperationalError("connection to postgresql://a:secret@h/x failed\n\tretry")
    )
    assert (
        pg
        == "PostgreSQL (ZAPSTREAM_DATABASE_URL): connection to postgresql://a:***@h/x failed; retry"
    )
    kafka = describe_connection_failure(
        KafkaConnectionError(
            "Unable to bootstrap from [('10.0.0.1', 9092, <AddressFamily.AF_INET: 2>)]"
        )
    )
    assert (
        kafka
        == "cannot reach Kafka (ZAPSTREAM_KAFKA_BROKERS): unable to bootstrap from 10.0.0.1:9092"
    )
    assert describe_connection_failure(ValueError("x")) is None
