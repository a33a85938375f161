"""Kafka TLS and SASL settings: what every client is given, and the errors that name a variable."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import certifi
import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from pydantic import ValidationError

from connectors.startup import render_validation_error
from streams.app import broker_credentials
from streams.kernel.failures import classify_kafka_security
from streams.kernel.settings import KafkaSettings

CA = certifi.where()
"""Any PEM file of CA certificates will do: the context only loads it."""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("ZAPSTREAM_"):
            monkeypatch.delenv(name)


def kafka_from_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> KafkaSettings:
    for name, value in env.items():
        monkeypatch.setenv(f"ZAPSTREAM_KAFKA_{name}", value)
    return KafkaSettings()


def error_lines(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    with pytest.raises(ValidationError) as info:
        kafka_from_env(monkeypatch, **env)
    return render_validation_error(info.value)


# --- settings -> aiokafka options ----------------------------------------------------------


def test_plaintext_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = kafka_from_env(monkeypatch, BROKERS="a:9092, b:9092")
    assert kafka.client_options() == {
        "bootstrap_servers": ["a:9092", "b:9092"],
        "security_protocol": "PLAINTEXT",
    }
    assert broker_credentials(kafka) is None


def test_ssl_with_a_ca_file(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = kafka_from_env(monkeypatch, SECURITY_PROTOCOL="SSL", SSL_CAFILE=CA)
    options = kafka.client_options()
    assert set(options) == {"bootstrap_servers", "security_protocol", "ssl_context"}
    assert options["security_protocol"] == "SSL"
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True
    assert context.cert_store_stats()["x509_ca"] > 0


def test_hostname_check_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = kafka_from_env(monkeypatch, SECURITY_PROTOCOL="SSL", SSL_CHECK_HOSTNAME="false")
    context = kafka.client_options()["ssl_context"]
    assert context.check_hostname is False
    assert context.verify_mode == ssl.CERT_REQUIRED  # the chain is still verified


def test_sasl_ssl_scram(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = kafka_from_env(
        monkeypatch,
        SECURITY_PROTOCOL="SASL_SSL",
        SASL_MECHANISM="SCRAM-SHA-512",
        SASL_USERNAME="zapstream",
        SASL_PASSWORD="s3cret",
    )
    options = kafka.client_options()
    assert isinstance(options.pop("ssl_context"), ssl.SSLContext)
    assert options == {
        "bootstrap_servers": ["127.0.0.1:9092"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "zapstream",
        "sasl_plain_password": "s3cret",
    }


def test_sasl_plaintext_defaults_to_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = kafka_from_env(
        monkeypatch, SECURITY_PROTOCOL="SASL_PLAINTEXT", SASL_USERNAME="u", SASL_PASSWORD="p"
    )
    options = kafka.security_options()
    assert "ssl_context" not in options
    assert options["sasl_mechanism"] == "PLAIN"


@pytest.mark.parametrize(
    "env",
    [
        {"SECURITY_PROTOCOL": "SSL", "SSL_CAFILE": CA},
        {"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_USERNAME": "u", "SASL_PASSWORD": "p"},
        {
            "SECURITY_PROTOCOL": "SASL_SSL",
            "SASL_MECHANISM": "SCRAM-SHA-256",
            "SASL_USERNAME": "u",
            "SASL_PASSWORD": "p",
        },
    ],
    ids=["ssl", "sasl-plaintext", "sasl-ssl"],
)
def test_faust_gets_the_same_options_as_our_clients(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    kafka = kafka_from_env(monkeypatch, **env)
    faust_options = dict(credentials_to_aiokafka_auth(broker_credentials(kafka)))
    ours = kafka.security_options()
    # Each call builds its own SSLContext: compare what they are, not which.
    for options in (faust_options, ours):
        context = options.pop("ssl_context", None)
        options["tls"] = context is not None and context.verify_mode == ssl.CERT_REQUIRED
    assert faust_options == ours


def test_password_from_the_secrets_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "ZAPSTREAM_KAFKA_SASL_PASSWORD").write_text("from-a-file")
    monkeypatch.setenv("ZAPSTREAM_SECRETS_DIR", str(tmp_path))
    kafka = kafka_from_env(monkeypatch, SECURITY_PROTOCOL="SASL_SSL", SASL_USERNAME="u")
    assert kafka.security_options()["sasl_plain_password"] == "from-a-file"
    assert "from-a-file" not in repr(kafka)
    assert "from-a-file" not in str(kafka.model_dump())


# --- configuration errors ------------------------------------------------------------------


def test_sasl_without_credentials_names_both_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert error_lines(monkeypatch, SECURITY_PROTOCOL="SASL_SSL") == [
        "ZAPSTREAM_KAFKA_SASL_USERNAME and ZAPSTREAM_KAFKA_SASL_PASSWORD must be set with "
        "ZAPSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL"
    ]


def test_sasl_without_password_never_shows_the_other_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = error_lines(
        monkeypatch, SECURITY_PROTOCOL="SASL_PLAINTEXT", SASL_USERNAME="user-visible-nowhere"
    )
    assert lines == [
        "ZAPSTREAM_KAFKA_SASL_PASSWORD must be set with "
        "ZAPSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT"
    ]


def test_mechanism_without_a_sasl_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = error_lines(monkeypatch, SASL_MECHANISM="SCRAM-SHA-512", SASL_PASSWORD="hidden")
    assert len(lines) == 1
    assert lines[0].startswith(
        "ZAPSTREAM_KAFKA_SASL_MECHANISM, ZAPSTREAM_KAFKA_SASL_PASSWORD set, but "
        "ZAPSTREAM_KAFKA_SECURITY_PROTOCOL=PLAINTEXT does not use SASL"
    )
    assert "hidden" not in lines[0]


def test_ca_file_without_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = error_lines(monkeypatch, SECURITY_PROTOCOL="SASL_PLAINTEXT", SSL_CAFILE=CA)
    # SASL_PLAINTEXT also lacks its credentials; the first error found is reported.
    assert len(lines) == 1 and "ZAPSTREAM_KAFKA_SASL_USERNAME" in lines[0]
    lines = error_lines(monkeypatch, SECURITY_PROTOCOL="PLAINTEXT", SSL_CAFILE=CA)
    assert lines == [
        "ZAPSTREAM_KAFKA_SSL_CAFILE set, but ZAPSTREAM_KAFKA_SECURITY_PROTOCOL=PLAINTEXT does "
        "not use TLS: set ZAPSTREAM_KAFKA_SECURITY_PROTOCOL=SSL (or SASL_SSL)"
    ]


def test_key_without_its_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    assert error_lines(monkeypatch, SECURITY_PROTOCOL="SSL", SSL_KEYFILE=CA) == [
        "ZAPSTREAM_KAFKA_SSL_KEYFILE needs ZAPSTREAM_KAFKA_SSL_CERTFILE (its certificate)"
    ]


def test_missing_ca_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-ca.pem"
    lines = error_lines(monkeypatch, SECURITY_PROTOCOL="SSL", SSL_CAFILE=str(missing))
    assert len(lines) == 1
    assert lines[0].startswith("ZAPSTREAM_KAFKA_SSL_CAFILE: Path does not point to a file")


@pytest.mark.parametrize(
    ("value", "env"),
    [("TLS", "ZAPSTREAM_KAFKA_SECURITY_PROTOCOL"), ("GSSAPI", "ZAPSTREAM_KAFKA_SASL_MECHANISM")],
)
def test_unknown_protocol_or_mechanism(
    monkeypatch: pytest.MonkeyPatch, value: str, env: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError) as info:
        KafkaSettings()
    (line,) = render_validation_error(info.value)
    assert line.startswith(f"{env}: must be ")


# --- classification ------------------------------------------------------------------------


def _verify_failed() -> ssl.SSLCertVerificationError:
    exc = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify")
    exc.verify_message = "unable to get local issuer certificate"
    return exc


@pytest.mark.parametrize(
    ("exc", "names"),
    [
        (_verify_failed(), "ZAPSTREAM_KAFKA_SSL_CAFILE"),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "SECURITY_PROTOCOL"),
        (SaslAuthenticationFailed("Authentication failed"), "ZAPSTREAM_KAFKA_SASL_PASSWORD"),
        (UnsupportedSaslMechanismError("PLAIN"), "ZAPSTREAM_KAFKA_SASL_MECHANISM"),
    ],
    ids=["certificate", "handshake", "sasl-login", "sasl-mechanism"],
)
def test_tls_and_sasl_refusals_are_permanent(exc: BaseException, names: str) -> None:
    line = classify_kafka_security(exc)
    assert line is not None
    assert names in line
    assert "\n" not in line


@pytest.mark.parametrize(
    "exc",
    [
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
        ConnectionResetError(104, "Connection reset by peer"),
        KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9092)]"),
        TimeoutError(),
    ],
    ids=["eof", "reset", "bootstrap", "timeout"],
)
def test_a_broker_going_away_is_not_a_security_refusal(exc: BaseException) -> None:
    assert classify_kafka_security(exc) is None


def test_certificate_line_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    line = classify_kafka_security(_verify_failed())
    assert line is not None
    assert line.startswith(
        "Kafka's TLS certificate was not accepted (unable to get local issuer certificate)"
    )
