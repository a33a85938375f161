"""The pure parts of `zapstream status`: lag-metrics parsing, the exit-code decision, rendering."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from connectors.ops.doctor import SlotState
from connectors.ops.status import (
    EXIT_ATTENTION,
    EXIT_HEALTHY,
    ConsumerLag,
    PartitionLag,
    Snapshot,
    attention,
    exit_code,
    parse_lag_metrics,
)
from connectors.ops.status_render import (
    human_bytes,
    pending_by_instance,
    status_json,
    status_text,
)
from connectors.outbox.controls import Control
from connectors.sink.pipeline_sql import STATUSES, PendingGroup

LAG_TEXT = """\
# HELP kafka_consumergroup_group_lag Group offset lag of a partition
# TYPE kafka_consumergroup_group_lag gauge
kafka_consumergroup_group_lag{group="zs-worker",topic="zapstream.intents",partition="1"} 7.0
kafka_consumergroup_group_lag{group="zs-worker",topic="zapstream.intents",partition="0"} 5.0
kafka_consumergroup_group_lag{group="zs-sink",topic="zapstream.state",partition="10"} 0.0
# HELP kafka_consumergroup_group_lag_seconds Group time lag of a partition
# TYPE kafka_consumergroup_group_lag_seconds gauge
kafka_consumergroup_group_lag_seconds{group="zs-worker",topic="zapstream.intents",partition="0"} 2.5
kafka_consumergroup_group_lag_seconds{group="zs-worker",topic="zapstream.intents",partition="1"} NaN
# HELP kafka_consumergroup_group_max_lag Max lag of a group
# TYPE kafka_consumergroup_group_max_lag gauge
kafka_consumergroup_group_max_lag{group="zs-worker"} 7.0
process_cpu_seconds_total 1.5
"""


def test_parse_lag_metrics_joins_messages_and_seconds_per_partition() -> None:
    assert parse_lag_metrics(LAG_TEXT) == [
        PartitionLag("zs-sink", "zapstream.state", "10", 0.0, None),
        PartitionLag("zs-worker", "zapstream.intents", "0", 5.0, 2.5),
        PartitionLag("zs-worker", "zapstream.intents", "1", 7.0, None),
    ]


def test_parse_lag_metrics_without_type_lines_and_extra_labels() -> None:
    text = (
        'kafka_consumergroup_group_lag{cluster_name="c",group="g",topic="t",partition="2",'
        'member_host="h"} 3\n'
        'kafka_consumergroup_group_lag_seconds{group="g",topic="t",partition="2"} 1.25\n'
        'kafka_consumergroup_group_lag{topic="t",partition="3"} 9\n'  # no group: ignored
    )
    assert parse_lag_metrics(text) == [PartitionLag("g", "t", "2", 3.0, 1.25)]


def test_parse_lag_metrics_of_other_metrics_is_empty_and_garbage_raises() -> None:
    assert parse_lag_metrics("process_cpu_seconds_total 1.5\n") == []
    with pytest.raises(ValueError):
        parse_lag_metrics("<html>not metrics</html>\n")


NOW = dt.datetime(2026, 12, 1, 16, 0, tzinfo=dt.UTC)
ACTIVE = SlotState("zapstream_outbox", "pgoutput", "logical", "app", True, 4242, 1_000, 5_000_000)


def _snapshot(**changes: object) -> Snapshot:
    base = Snapshot(
        at=NOW,
        slot_name="zapstream_outbox",
        slot=ACTIVE,
        jobs={s: 0 for s in STATUSES} | {"ACCEPTED": 40, "PENDING": 3},
        pending=[PendingGroup("shop-1", "", 2, 30.0), PendingGroup("shop-2", "promo", 1, 5.0)],
        paused=[],
        lag=ConsumerLag(url=None),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _reasons(snapshot: Snapshot) -> list[str]:
    return attention(snapshot, max_pending_age_s=600)


def test_healthy_is_exit_0() -> None:
    reasons = _reasons(_snapshot())
    assert reasons == []
    assert exit_code(reasons) == EXIT_HEALTHY


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"slot": None}, "replication slot zapstream_outbox does not exist"),
        (
            {"slot": dataclasses.replace(ACTIVE, active=False, active_pid=None)},
            "is inactive with 1000 bytes of lag",
        ),
        ({"pending": [PendingGroup("shop-9", "", 1, 601.0)]}, "PENDING jobs older than 10m00s"),
        ({"jobs": {"DEAD": 2}}, "2 DEAD job(s): zapstream jobs list --state DEAD"),
        ({"jobs": {"UNCERTAIN": 1}}, "1 UNCERTAIN job(s)"),
        ({"jobs": {"REVIEW": 1}}, "1 REVIEW job(s)"),
        ({"lag": ConsumerLag("http://x/metrics", error="cannot read")}, "consumer lag unknown"),
    ],
)
def test_each_problem_needs_attention(changes: dict[str, object], expected: str) -> None:
    reasons = _reasons(_snapshot(**changes))
    assert len(reasons) == 1 and expected in reasons[0], reasons
    assert exit_code(reasons) == EXIT_ATTENTION


def test_what_is_not_a_problem() -> None:
    # An inactive slot with nothing to stream, a PENDING job just under the limit, FAILED jobs
    # (a final answer, not a question), paused instances: all healthy.
    snapshot = _snapshot(
        slot=dataclasses.replace(ACTIVE, active=False, active_pid=None, lag_bytes=0),
        pending=[PendingGroup("shop-1", "", 1, 599.0)],
        jobs={"FAILED": 3, "EXPIRED": 1},
        paused=[Control("instance", "shop-1", "pause", "flagged", "alice", NOW, 1)],
    )
    assert _reasons(snapshot) == []


def test_pending_by_instance_sums_purposes_and_keeps_the_ten_oldest() -> None:
    groups = [PendingGroup(f"i{n:02d}", "", 1, float(n)) for n in range(12)]
    groups.append(PendingGroup("i11", "promo", 4, 3.0))
    top = pending_by_instance(groups)
    assert [p.instance_id for p in top] == [f"i{n:02d}" for n in range(11, 1, -1)]
    assert (top[0].pending, top[0].oldest_age_s) == (5, 11.0)


def test_human_bytes() -> None:
    assert [human_bytes(v) for v in (None, 0, 512, 1536, 5 * 1024**2, 3 * 1024**4)] == [
        "-",
        "0 B",
        "512 B",
        "1.5 KiB",
        "5.0 MiB",
        "3072.0 GiB",
    ]


def test_text_shows_every_section() -> None:
    snapshot = _snapshot(
        paused=[Control("campaign", "black-friday", "pause", "copy review", "carol", NOW, 7)],
        lag=ConsumerLag("http://lag:9000/metrics", tuple(parse_lag_metrics(LAG_TEXT))),
        jobs={s: 0 for s in STATUSES} | {"DEAD": 1},
    )
    reasons = _reasons(snapshot)
    text = status_text(snapshot, reasons)
    assert "zapstream_outbox: active (pid 4242), lag 1000 B, retained WAL 4.8 MiB" in text
    for state in STATUSES:
        assert f"{state} " in text
    assert "shop-1    2        30s" in text
    assert "campaign  black-friday  carol  copy review" in text
    assert "zs-worker  zapstream.intents  2           12              2s" in text
    assert "- 1 DEAD job(s)" in text
    assert text.endswith("result: NEEDS ATTENTION")
    assert status_text(_snapshot(), []).endswith("result: OK")
    assert "not configured (set ZAPSTREAM_STATUS_LAG_URL" in status_text(_snapshot(), [])


def test_json_has_every_section() -> None:
    snapshot = _snapshot(
        lag=ConsumerLag("http://lag:9000/metrics", (PartitionLag("g", "t", "0", 1.0, 0.5),))
    )
    payload = json.loads(status_json(snapshot, []))
    assert payload["ok"] is True and payload["postgres_reachable"] is True
    assert payload["slot"] == {
        "name": "zapstream_outbox",
        "exists": True,
        "active": True,
        "active_pid": 4242,
        "lag_bytes": 1000,
        "retained_bytes": 5_000_000,
    }
    assert payload["jobs"]["ACCEPTED"] == 40 and set(payload["jobs"]) == set(STATUSES)
    assert payload["oldest_pending"][0] == {
        "instance": "shop-1",
        "pending": 2,
        "oldest_age_s": 30.0,
    }
    assert payload["consumer_lag"]["partitions"] == [
        {"group": "g", "topic": "t", "partition": "0", "lag_messages": 1.0, "lag_seconds": 0.5}
    ]
    down = json.loads(status_json(None, ["PostgreSQL unreachable"], unreachable=True))
    assert down == {
        "ok": False,
        "postgres_reachable": False,
        "attention": ["PostgreSQL unreachable"],
    }
