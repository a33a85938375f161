"""The one "may this job already have been delivered?" rule, over a table of histories."""

from __future__ import annotations

import datetime as dt

import pytest

from connectors.ops.delivery_risk import DeliveryRisk, delivery_risk
from connectors.ops.jobs_sql import JobEvent

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
R = DeliveryRisk


def _history(*moves: str, reason: str | None = None) -> list[JobEvent]:
    """``"PENDING>ATTEMPTING"`` per event, versions from 1, the same reason on each."""
    events = []
    for version, move in enumerate(moves, start=1):
        from_status, to_status = move.split(">")
        events.append(JobEvent(version, version, from_status, to_status, "worker", reason, NOW))
    return events


@pytest.mark.parametrize(
    ("status", "moves", "expected"),
    [
        # Every attempt has a definitive outcome the recipient did not get.
        ("FAILED", ["PENDING>ATTEMPTING", "ATTEMPTING>FAILED"], None),
        (
            "DEAD",
            ["PENDING>ATTEMPTING", "ATTEMPTING>RETRY_WAIT", "RETRY_WAIT>ATTEMPTING"]
            + ["ATTEMPTING>DEAD"],
            None,
        ),
        ("DEAD", ["PENDING>DEAD"], None),  # never attempted
        ("FAILED", [], None),  # no history recorded, nothing attempted
        # Reconciling again (a note), then the authoritative listing said "not taken".
        (
            "DEAD",
            ["PENDING>ATTEMPTING", "ATTEMPTING>ATTEMPTING", "ATTEMPTING>DEAD"],
            None,
        ),
        # The gateway took it, then its own receipt said it failed.
        ("FAILED", ["PENDING>ATTEMPTING", "ATTEMPTING>ACCEPTED", "ACCEPTED>FAILED"], None),
        # An operator's answer is a note on the settled state.
        ("DEAD", ["PENDING>ATTEMPTING", "ATTEMPTING>DEAD", "DEAD>DEAD"], None),
        # The outcome is unknown now.
        ("UNCERTAIN", ["PENDING>ATTEMPTING", "ATTEMPTING>UNCERTAIN"], R.UNCERTAIN_NOW),
        ("UNCERTAIN", [], R.UNCERTAIN_NOW),
        # An earlier attempt's outcome was never known; a reprocess then failed.
        (
            "DEAD",
            ["PENDING>ATTEMPTING", "ATTEMPTING>UNCERTAIN", "UNCERTAIN>ATTEMPTING"]
            + ["ATTEMPTING>DEAD"],
            R.UNCERTAIN_BEFORE,
        ),
        (
            "FAILED",
            ["PENDING>ATTEMPTING", "ATTEMPTING>UNCERTAIN", "UNCERTAIN>ATTEMPTING"]
            + ["ATTEMPTING>FAILED"],
            R.UNCERTAIN_BEFORE,
        ),
        # A receipt said the recipient had it, whatever came after.
        (
            "FAILED",
            ["PENDING>ATTEMPTING", "ATTEMPTING>ACCEPTED", "ACCEPTED>DELIVERED"]
            + ["DELIVERED>FAILED"],
            R.RECEIPT_DELIVERED,
        ),
        # The gateway took it with a status label nobody configured.
        (
            "FAILED",
            ["PENDING>ATTEMPTING", "ATTEMPTING>REVIEW", "REVIEW>FAILED"],
            R.UNKNOWN_LABEL,
        ),
        # An attempt in progress, or one whose end is missing from the history.
        ("ATTEMPTING", ["PENDING>ATTEMPTING"], R.ATTEMPT_UNRECORDED),
        ("DEAD", ["PENDING>ATTEMPTING"], R.ATTEMPT_UNRECORDED),
        (
            "DEAD",
            ["PENDING>ATTEMPTING", "RETRY_WAIT>ATTEMPTING", "ATTEMPTING>DEAD"],
            R.ATTEMPT_UNRECORDED,
        ),
        ("FAILED", ["PENDING>ATTEMPTING", "RETRY_WAIT>FAILED"], R.ATTEMPT_UNRECORDED),
    ],
)
def test_the_rule_over_histories(
    status: str, moves: list[str], expected: DeliveryRisk | None
) -> None:
    assert delivery_risk(status, _history(*moves)) is expected


def test_reason_text_is_never_read() -> None:
    # The worker never writes "uncertain" into a reason; the rule must not depend on words.
    worded = _history(
        "PENDING>ATTEMPTING", "ATTEMPTING>FAILED", reason="gave up: outcome uncertain after reset"
    )
    assert delivery_risk("FAILED", worded) is None
    silent = _history(
        "PENDING>ATTEMPTING", "ATTEMPTING>UNCERTAIN", "UNCERTAIN>ATTEMPTING", "ATTEMPTING>DEAD"
    )
    assert delivery_risk("DEAD", silent) is DeliveryRisk.UNCERTAIN_BEFORE


def test_every_risk_is_explained() -> None:
    for risk in DeliveryRisk:
        assert risk.explanation and risk.explanation[0].islower()
