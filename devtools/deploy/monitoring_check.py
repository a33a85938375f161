"""Checks of the files SREs import: the Prometheus alert rules and the Grafana dashboard.

``k8s/monitoring/zapstream-alerts.yml`` (rules), ``zapstream-alerts.test.yml`` (their
promtool unit tests) and ``zapstream-dashboard.json``. The tests check the PromQL with
``promtool`` (Debian's ``prometheus`` package, installed by ``make setup``) and compare
the metric names the files use with what a running pipeline exports.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

MONITORING = Path(__file__).resolve().parents[2] / "k8s" / "monitoring"
RULES = MONITORING / "zapstream-alerts.yml"
RULE_TESTS = MONITORING / "zapstream-alerts.test.yml"
DASHBOARD = MONITORING / "zapstream-dashboard.json"

# Words of PromQL that look like metric names: operators, modifiers and aggregation clauses.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
     "bool", "offset", "atan2", "inf", "nan"}
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


class PromtoolMissing(RuntimeError):
    """promtool is not on PATH: ``make setup`` installs Debian's ``prometheus`` package."""


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise PromtoolMissing(
            "promtool not found: run `make setup` (it installs Debian's prometheus package)"
        )
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", name):  # a duration after `offset`
            continue
        names.add(name)
    return names


def rules() -> list[dict[str, Any]]:
    """Every rule of the alert rules file."""
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of the dashboard."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", ()):
            out.append((str(panel["title"]), str(target["expr"])))
    return out


def referenced_metrics() -> dict[str, set[str]]:
    """Metric name -> where it is used (alert names and dashboard panel titles)."""
    used: dict[str, set[str]] = {}
    for rule in rules():
        for name in metric_names(str(rule["expr"])):
            used.setdefault(name, set()).add(f"alert {rule.get('alert') or rule.get('record')}")
    for title, expr in dashboard_expressions():
        for name in metric_names(expr):
            used.setdefault(name, set()).add(f"panel {title!r}")
    return used


def exported_names(metrics_text: str) -> set[str]:
    """Names a ``/metrics`` page exports: families and their samples (``_total``, ``_bucket``)."""
    names = set()
    for family in text_string_to_metric_families(metrics_text):
        names.add(family.name)
        for sample in family.samples:
            names.add(sample.name)
    return names


def dashboard_as_rules() -> str:
    """The dashboard's queries as recording rules, so ``promtool check rules`` parses them."""
    recording = [
        {"record": f"zapstream:dashboard_query_{i}", "expr": expr}
        for i, (_, expr) in enumerate(dashboard_expressions())
    ]
    return str(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recording}]}))
