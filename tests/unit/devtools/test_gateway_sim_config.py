"""The simulator's ``/_sim/config`` validation: what it accepts, what it refuses, and why."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from devtools.simulator.gateway_sim import SimConfig, SimConfigError
from devtools.simulator.gateway_sim import _updated_config as updated_config

LISTING = {"items": "jobs", "id": "ref"}

ACCEPTED: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"error_rate": 1}, {"error_rate": 1.0}),
    ({"rate_limit_rate": 0.25}, {"rate_limit_rate": 0.25}),
    ({"drop_response_rate": 0}, {"drop_response_rate": 0.0}),
    ({"accept_then_502_rate": 0.5}, {"accept_then_502_rate": 0.5}),
    ({"latency_ms": 150}, {"latency_ms": 150.0}),
    ({"latency_jitter_ms": 2.5}, {"latency_jitter_ms": 2.5}),
    ({"retry_after_s": 0}, {"retry_after_s": 0.0}),
    ({"outage_s": 0}, {"outage_until": None}),
    ({"outage_until": 12.5}, {"outage_until": 12.5}),
    ({"outage_until": None}, {"outage_until": None}),
    ({"seed": 7}, {"seed": 7}),
    ({"seed": None}, {"seed": None}),
    ({"hide_references": True}, {"hide_references": True}),
    ({"initial_status": "sent"}, {"initial_status": "sent"}),
    ({"reject_instances": ["a", "b"]}, {"reject_instances": ["a", "b"]}),
    ({"reject_keys_for_instances": []}, {"reject_keys_for_instances": []}),
    ({"invalid_recipients": ["551190"]}, {"invalid_recipients": ["551190"]}),
    ({"id_field": "messageId"}, {"id_field": "messageId"}),
    ({"fault_scope": "all"}, {"fault_scope": "all"}),
    ({"meta_rate_limit_http_status": 429}, {"meta_rate_limit_http_status": 429}),
    ({"callback_url": "http://h:1/x"}, {"callback_url": "http://h:1/x"}),
    ({"meta_callback_url": "https://h/x"}, {"meta_callback_url": "https://h/x"}),
    ({"callback_url": None}, {"callback_url": None}),
    ({"callback_secret": ""}, {"callback_secret": ""}),
    ({"meta_app_secret": "s3"}, {"meta_app_secret": "s3"}),
    ({"callback_statuses": ["sent"]}, {"callback_statuses": ["sent"]}),
    ({"callback_statuses": []}, {"callback_statuses": []}),
    ({"callback_delay_ms": 0}, {"callback_delay_ms": 0.0}),
    ({"fail_recipients": {"55": 2}}, {"fail_recipients": {"55": 2}}),
    ({"pair_limited_recipients": {"55": 0}}, {"pair_limited_recipients": {"55": 0}}),
    ({"listing_fields": LISTING}, {"listing_fields": LISTING}),
    ({"listing_shape": "seed"}, {"listing_shape": "seed"}),
    ({}, {}),
]

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"error_rate": 2}, "error_rate"),
    ({"error_rate": -0.1}, "error_rate"),
    ({"error_rate": "high"}, "error_rate"),
    ({"error_rate": True}, "error_rate"),
    ({"error_rate": math.nan}, "error_rate"),
    ({"latency_ms": -1}, "latency_ms"),
    ({"latency_ms": math.inf}, "latency_ms"),
    ({"latency_ms": "5"}, "latency_ms"),
    ({"retry_after_s": None}, "retry_after_s"),
    ({"outage_s": -1}, "outage_s"),
    ({"outage_s": "1"}, "outage_s"),
    ({"outage_until": -5}, "outage_until"),
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"hide_references": 1}, "hide_references"),
    ({"initial_status": ""}, "initial_status"),
    ({"initial_status": 3}, "initial_status"),
    ({"reject_instances": "a"}, "reject_instances"),
    ({"reject_instances": [1]}, "reject_instances"),
    ({"invalid_recipients": [None]}, "invalid_recipients"),
    ({"rate_limited_instances": ["a"]}, "rate_limited_instances"),
    ({"rate_limited_instances": {"a": -1}}, "rate_limited_instances"),
    ({"disconnected_instances": {"a": "x"}}, "disconnected_instances"),
    ({"id_field": "uuid"}, "id_field"),
    ({"fault_scope": "x"}, "fault_scope"),
    ({"meta_rate_limit_http_status": 500}, "meta_rate_limit_http_status"),
    ({"callback_url": "ftp://h"}, "callback_url"),
    ({"meta_callback_url": 5}, "meta_callback_url"),
    ({"callback_secret": None}, "callback_secret"),
    ({"callback_statuses": [""]}, "callback_statuses"),
    ({"callback_statuses": "sent"}, "callback_statuses"),
    ({"callback_delay_ms": -1}, "callback_delay_ms"),
    ({"fail_recipients": {"55": -1}}, "fail_recipients"),
    ({"fail_recipients": {"55": True}}, "fail_recipients"),
    ({"pair_limited_recipients": {"55": 1.5}}, "pair_limited_recipients"),
    ({"pair_limited_recipients": ["55"]}, "pair_limited_recipients"),
    ({"listing_fields": {"bogus": "x"}}, "listing_fields"),
    ({"listing_fields": {"items": ""}}, "listing_fields"),
    ({"listing_shape": "table"}, "listing_shape"),
    ({"bogus": 1}, "unknown config key 'bogus'"),
]


@pytest.mark.parametrize(("changes", "expected"), ACCEPTED)
def test_accepted_changes_are_applied(changes: dict[str, Any], expected: dict[str, Any]) -> None:
    current = SimConfig()
    cfg = updated_config(current, changes)
    for key, value in expected.items():
        assert getattr(cfg, key) == value
        assert type(getattr(cfg, key)) is type(value)


@pytest.mark.parametrize(("changes", "named"), REFUSED)
def test_refused_changes_name_the_key_and_change_nothing(
    changes: dict[str, Any], named: str
) -> None:
    current = SimConfig(error_rate=0.5, fail_recipients={"55": 1})
    before = repr(current)
    with pytest.raises(SimConfigError, match=named):
        updated_config(current, {"latency_ms": 10, **changes})
    assert repr(current) == before


def test_an_update_is_all_or_nothing_and_never_shares_state() -> None:
    current = SimConfig(fail_recipients={"55": 1}, reject_instances=["a"])
    cfg = updated_config(current, {"error_rate": 0.5})
    cfg.fail_recipients["55"] = 0
    cfg.reject_instances.append("b")
    assert current.fail_recipients == {"55": 1} and current.reject_instances == ["a"]
    with pytest.raises(SimConfigError):
        updated_config(current, {"error_rate": 0.5, "fault_scope": "x"})
    assert current.error_rate == 0.0


def test_outage_s_sets_outage_until_from_now() -> None:
    started = time.time()
    cfg = updated_config(SimConfig(), {"outage_s": 30})
    assert cfg.outage_until is not None
    assert started + 30 <= cfg.outage_until <= time.time() + 30


def test_instance_windows_are_seconds_from_now_merged_and_zero_ends_one() -> None:
    started = time.time()
    cfg = updated_config(SimConfig(), {"rate_limited_instances": {"a": 10, "b": 20}})
    assert started + 10 <= cfg.rate_limited_instances["a"] <= time.time() + 10
    cfg = updated_config(cfg, {"rate_limited_instances": {"b": 0, "c": 5}})
    assert set(cfg.rate_limited_instances) == {"a", "c"}
    cfg = updated_config(cfg, {"disconnected_instances": {"a": 1.5}})
    assert set(cfg.disconnected_instances) == {"a"}
    assert set(cfg.rate_limited_instances) == {"a", "c"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"error_rate": 2}, "error_rate must be"),
        ({"fault_scope": "x"}, "fault_scope must be 'send' or 'all'"),
        ({"bogus": 1}, "unknown config key 'bogus'"),
    ],
)
def test_messages_read_as_one_sentence(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SimConfigError) as caught:
        updated_config(SimConfig(), changes)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
