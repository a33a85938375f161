"""The alert rules and the dashboard in k8s/monitoring/ parse, and the rules do what they say.

promtool (Debian's ``prometheus`` package, installed by ``make setup``) checks the rules and
runs their unit tests (``zapstream-alerts.test.yml``: input series, expected alerts); the
dashboard's queries are checked by promtool as recording rules. That each metric they
name is exported by a running pipeline is ``tests/integration/test_monitoring_metrics.py``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devtools.deploy import monitoring_check as mc


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [mc.promtool(), *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_promtool_accepts_the_alert_rules() -> None:
    result = _promtool("check", "rules", str(mc.RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alert_rules_pass_their_unit_tests() -> None:
    result = _promtool("test", "rules", mc.RULE_TESTS.name, cwd=mc.MONITORING)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_broken_rule_is_refused(tmp_path: Path) -> None:
    """The check above can fail: promtool refuses a bad expression."""
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n- name: x\n  rules:\n  - alert: X\n    expr: sum(rate(a[5m])\n")
    assert _promtool("check", "rules", str(bad)).returncode != 0


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    queries = mc.dashboard_expressions()
    assert len(queries) >= 15
    as_rules = tmp_path / "dashboard.yml"
    as_rules.write_text(mc.dashboard_as_rules())
    result = _promtool("check", "rules", str(as_rules))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_names_severity_summary_and_what_to_do() -> None:
    alerts = [rule for rule in mc.rules() if "alert" in rule]
    names = {rule["alert"] for rule in alerts}
    # What issue 10 asks the rules to cover.
    for wanted in (
        "ZapstreamConsumerLagHigh",
        "ZapstreamOldestPendingHigh",
        "ZapstreamDeadJobs",
        "ZapstreamNeedsOperator",
        "ZapstreamSlotLagHigh",
        "ZapstreamRelayDown",
        "ZapstreamRelayNoHeartbeat",
        "ZapstreamInstancePaused",
    ):
        assert wanted in names
    for rule in alerts:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_dashboard_is_importable_grafana_json() -> None:
    dash = mc.dashboard()
    assert dash["uid"] == "zapstream" and dash["title"]
    ids = [panel["id"] for panel in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
    assert any(v["type"] == "datasource" for v in dash["templating"]["list"])


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("max by (group, topic) (kafka_consumergroup_group_lag{topic=~\"a.*\"}) > 1000",
         {"kafka_consumergroup_group_lag"}),
        ("time() - max(zapstream_relay_heartbeat_last_seconds) > 300",
         {"zapstream_relay_heartbeat_last_seconds"}),
        ("histogram_quantile(0.99, sum by (le, instance) (rate(x_bucket[5m])))", {"x_bucket"}),
        ("max(a) < 1 or absent(b)", {"a", "b"}),
        ("sum(increase(a_total{status=\"DEAD\"}[10m])) + sum(b offset 5m) > 1e9", {"a_total", "b"}),
        ("topk(10, max by (instance, purpose) (c)) unless on (instance) d", {"c", "d"}),
    ],
)  # fmt: skip
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert mc.metric_names(expr) == names


def test_exported_names_include_sample_suffixes() -> None:
    text = (
        "# HELP a_total things\n# TYPE a_total counter\na_total 1.0\n"
        "# HELP h seconds\n# TYPE h histogram\n"
        'h_bucket{le="1.0"} 1.0\nh_bucket{le="+Inf"} 1.0\nh_count 1.0\nh_sum 0.5\n'
    )
    assert {"a", "a_total", "h", "h_bucket", "h_count", "h_sum"} <= mc.exported_names(text)
