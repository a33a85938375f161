"""Gateway label -> JobStatus mapping: case-insensitive, unknown never counts as success."""

from __future__ import annotations

import pytest

from connectors.gateways.labels import map_label
from streams.kernel.contract import JobStatus
from streams.kernel.settings import GatewaySettings

SETTINGS = GatewaySettings()


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("queued", JobStatus.ACCEPTED),
        ("QUEUED", JobStatus.ACCEPTED),
        (" Sent ", JobStatus.ACCEPTED),
        ("delivered", JobStatus.DELIVERED),
        ("read", JobStatus.READ),
        ("failed", JobStatus.FAILED),
        ("Canceled", JobStatus.CANCELLED),
        ("cancelled", JobStatus.CANCELLED),
        ("weird", JobStatus.REVIEW),
        ("", JobStatus.REVIEW),
        (None, JobStatus.REVIEW),
    ],
)
def test_stackzap_defaults(label: str | None, expected: JobStatus) -> None:
    assert map_label(label, SETTINGS.stackzap_labels) is expected


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("server_ack", JobStatus.ACCEPTED),
        ("DELIVERY_ACK", JobStatus.DELIVERED),
        ("played", JobStatus.READ),
        ("error", JobStatus.FAILED),
        ("cancelled", JobStatus.REVIEW),  # not in the ZAP API vocabulary
    ],
)
def test_zapapi_defaults(label: str, expected: JobStatus) -> None:
    assert map_label(label, SETTINGS.zapapi_labels) is expected


def test_hand_built_mapping_with_mixed_case_keys() -> None:
    labels = {"Enqueued": "ACCEPTED", "DONE": "delivered"}
    assert map_label("enqueued", labels) is JobStatus.ACCEPTED
    assert map_label("done", labels) is JobStatus.DELIVERED


def test_mapping_to_unknown_status_is_review() -> None:
    assert map_label("queued", {"queued": "SUCCESS"}) is JobStatus.REVIEW


def test_settings_labels_override() -> None:
    settings = GatewaySettings(stackzap_labels={"Enfileirado": "ACCEPTED"})
    assert map_label("ENFILEIRADO", settings.stackzap_labels) is JobStatus.ACCEPTED
    assert map_label("queued", settings.stackzap_labels) is JobStatus.REVIEW
