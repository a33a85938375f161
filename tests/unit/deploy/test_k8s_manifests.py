"""The Kubernetes manifests render and validate offline, and a broken copy of each kind fails.

``devtools/deploy/manifest_check.py`` runs in the deployment tools' venv (``.venv-deploy-tools``:
kubectl's kustomize, kubernetes-validate, jsonschema); what it checks the manifests against
in zapstream itself (topics, subcommands, setting names) is computed here, in the project
venv, by :mod:`devtools.deploy.k8s_facts`. Every broken copy is one edit of a copy of ``k8s/``
under ``tmp_path`` (a few edits share a copy); one checker run renders every copy, and each
test looks for its own line.
No cluster is needed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from devtools.deploy import k8s_facts, k8s_rules
from tests.unit.deploy.deployables import deploy_tool_path

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "k8s"
OVERLAYS = [K8S / "overlays" / o for o in ("dev", "prod", "staging")]
CHECKER = ROOT / "devtools" / "deploy" / "manifest_check.py"


def _check(
    facts: Path, *overlays: Path, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            deploy_tool_path("python"),
            str(CHECKER),
            *map(str, overlays),
            "--facts",
            str(facts),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("facts") / "facts.json"
    path.write_text(json.dumps(k8s_facts.facts()))
    return path


def test_both_overlays_render_and_every_object_validates(facts: Path) -> None:
    done = _check(facts, *OVERLAYS, extra=("--check-schemas",))
    assert done.returncode == 0, done.stdout + done.stderr
    for overlay in OVERLAYS:
        assert f"{overlay}: " in done.stdout and "objects valid" in done.stdout


def test_the_prometheus_rule_is_generated_from_the_alert_rules_file() -> None:
    committed = k8s_rules.TARGET.read_text()
    assert committed == k8s_rules.render(k8s_rules.RULES.read_text()), (
        "k8s/base/prometheusrule.yaml is stale: run `.venv/bin/python -m devtools.deploy.k8s_rules`"
    )
    rules = yaml.safe_load(k8s_rules.RULES.read_text())
    assert yaml.safe_load(committed)["spec"]["groups"] == rules["groups"]


# --- broken copies ---------------------------------------------------------------------------


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} is not in {path}: update this test's edit"
    path.write_text(text.replace(old, new, 1))


def _add_resource(k8s: Path, name: str, text: str) -> None:
    (k8s / "base" / name).write_text(text)
    _edit(k8s / "base" / "kustomization.yaml", "resources:\n", f"resources:\n  - {name}\n")


def _prefix_without_its_component(k8s: Path, prefix: str) -> None:
    """A prefix in the ConfigMap, but the overlay no longer lists the topic-prefix component."""
    _edit(
        k8s / "base" / "zapstream.env",
        "ZAPSTREAM_KAFKA_TOPIC_PREFIX=\n",
        f"ZAPSTREAM_KAFKA_TOPIC_PREFIX={prefix}\n",
    )
    overlay = k8s / "overlays" / "prod" / "kustomization.yaml"
    _edit(overlay, "  - ../../components/topic-prefix\n", "")


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    # name: (the edit of a copy of k8s/, a line the checker must print for that copy)
    "deployment field typo": (
        lambda k: _edit(
            k / "base" / "relay.yaml",
            "terminationGracePeriodSeconds: 45",
            "terminationGracePeriod: 45",
        ),
        "Deployment/zapstream-relay: spec.template.spec: Additional properties are not allowed "
        "('terminationGracePeriod' was unexpected)",
    ),
    "unknown kind": (
        lambda k: _add_resource(
            k,
            "user.yaml",
            "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaConnector\nmetadata:\n"
            "  name: zapstream\nspec: {}\n",
        ),
        "KafkaConnector/zapstream: unknown kind KafkaConnector (kafka.strimzi.io/v1beta2)",
    ),
    "kafka user operation typo": (
        lambda k: _edit(k / "overlays" / "prod" / "kafka-users.yaml", "- Describe", "- Descibe"),
        "KafkaUser/zapstream-relay: spec.authorization.acls.0.operations.1: 'Descibe' is not "
        "one of",
    ),
    "unknown built-in kind": (
        lambda k: _add_resource(
            k,
            "hpa.yaml",
            "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler2\nmetadata:\n"
            "  name: zapstream\n",
        ),
        "HorizontalPodAutoscaler2/zapstream: unknown kind HorizontalPodAutoscaler2",
    ),
    "scaled object field typo": (
        lambda k: _edit(k / "base" / "worker.yaml", "cooldownPeriod: 300", "coolDownPeriod: 300"),
        "ScaledObject/zapstream-worker: spec: Additional properties are not allowed "
        "('coolDownPeriod' was unexpected)",
    ),
    "service monitor field typo": (
        lambda k: _edit(
            k / "base" / "servicemonitors.yaml", "honorLabels: true", "honourLabels: true"
        ),
        "ServiceMonitor/zapstream-relay: spec.endpoints.0: Additional properties are not allowed "
        "('honourLabels' was unexpected)",
    ),
    "missing secret": (
        lambda k: _edit(
            k / "base" / "webhook.yaml", "name: zapstream-secrets", "name: webhook-secrets"
        ),
        "Deployment/zapstream-webhook: volume secrets: secret webhook-secrets is neither rendered "
        "nor the external zapstream-secrets",
    ),
    "another workload's database login": (
        lambda k: _edit(
            k / "base" / "webhook.yaml",
            "name: zapstream-webhook-database",
            "name: zapstream-relay-database",
        ),
        "Deployment/zapstream-webhook: mounts zapstream-relay-database: each workload mounts its "
        "own, zapstream-webhook-database",
    ),
    "the database login in the shared secret": (
        lambda k: _edit(
            k / "base" / "sink.yaml",
            "name: zapstream-sink-database",
            "name: zapstream-secrets",
        ),
        "Deployment/zapstream-sink: ZAPSTREAM_DATABASE_URL comes from zapstream-sink-database, "
        "not from zapstream-secrets",
    ),
    "secret key that is no setting": (
        lambda k: _edit(
            k / "base" / "relay.yaml",
            "- key: ZAPSTREAM_DATABASE_URL\n                      path: ZAPSTREAM_DATABASE_URL",
            "- key: DATABASE_URL\n                      path: DATABASE_URL",
        ),
        "key DATABASE_URL: no setting reads it",
    ),
    "topic partitions": (
        lambda k: _edit(k / "base" / "topics.yaml", "partitions: 12", "partitions: 6"),
        "KafkaTopic/zapstream.intents (topic zapstream.intents): 6 partitions, "
        "`topics ensure` creates 12",
    ),
    "topic config": (
        lambda k: _edit(
            k / "base" / "topics.yaml", 'retention.ms: "604800000"', 'retention.ms: "1"'
        ),
        "config retention.ms='1', expected '604800000'",
    ),
    "missing topic": (
        lambda k: _edit(
            k / "base" / "topics.yaml",
            "  topicName: zapstream.dead\n",
            "  topicName: zapstream.dead2\n",
        ),
        "topic zapstream.dead: no KafkaTopic (`topics ensure` creates it)",
    ),
    "more workers than partitions": (
        lambda k: _edit(k / "base" / "worker.yaml", "maxReplicaCount: 12", "maxReplicaCount: 16"),
        "ScaledObject/zapstream-worker: maxReplicaCount 16 > ZAPSTREAM_KAFKA_PARTITIONS 12",
    ),
    "kafka trigger key typo": (
        lambda k: _edit(k / "base" / "worker.yaml", 'lagThreshold: "500"', 'lagTreshold: "500"'),
        "unknown kafka trigger metadata key 'lagTreshold'",
    ),
    "variable no setting reads": (
        lambda k: _edit(
            k / "base" / "zapstream.env",
            "ZAPSTREAM_KAFKA_PARTITIONS=12\n",
            "ZAPSTREAM_KAFKA_PARTITIONS=12\nZAPSTREAM_KAFKA_PARTITION=12\n",
        ),
        "sets ZAPSTREAM_KAFKA_PARTITION, which no setting reads",
    ),
    "service links": (
        lambda k: _edit(k / "base" / "webhook.yaml", "      enableServiceLinks: false\n", ""),
        "Deployment/zapstream-webhook: set enableServiceLinks: false",
    ),
    "probe on an undeclared port": (
        lambda k: _edit(
            k / "base" / "sink.yaml",
            "path: /readyz\n              port: metrics",
            "path: /readyz\n              port: health",
        ),  # fmt: skip
        "Deployment/zapstream-sink container sink: readinessProbe port 'health' is not a declared "
        "containerPort",
    ),
    "no such subcommand": (
        lambda k: _edit(
            k / "base" / "migrate-job.yaml", 'args: ["db", "migrate"]', 'args: ["migrate"]'
        ),
        "Job/zapstream-migrate container migrate: `zapstream migrate` is no subcommand",
    ),
    "server bound to localhost": (
        lambda k: _edit(
            k / "base" / "zapstream.env",
            "ZAPSTREAM_RELAY_METRICS_BIND_LOCAL=false\n",
            "ZAPSTREAM_RELAY_METRICS_BIND_LOCAL=true\n",
        ),
        "set ZAPSTREAM_RELAY_METRICS_BIND_LOCAL=false",
    ),
    "trigger on another group": (
        lambda k: _edit(
            k / "base" / "worker.yaml",
            "consumerGroup: zapstream-worker\n        topic: zapstream.intents\n",
            "consumerGroup: zapstream-workers\n        topic: zapstream.intents\n",
        ),
        "consumerGroup 'zapstream-workers' is not the worker's group 'zapstream-worker'",
    ),
    # (Its copy has no other edit whose line names a topic: the prefix renames them all.)
    "topic prefix not carried into the KafkaTopics": (
        lambda k: _prefix_without_its_component(k, "x-"),
        "KafkaTopic/zapstream.intents (topic zapstream.intents): not a topic zapstream uses "
        "under ZAPSTREAM_KAFKA_TOPIC_PREFIX='x-'",
    ),
}


COPIES = 4
"""The edits share this many copies (round robin; none touches another's text): each copy is
one kustomize render, the slow part. Every edit still has its own line to find."""


def _copy_of(name: str) -> str:
    return f"copy {list(BROKEN).index(name) % COPIES}"


@pytest.fixture(scope="module")
def broken_output(facts: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each copy's lines from one checker run over all of them (and an unedited control)."""
    base = tmp_path_factory.mktemp("broken")
    overlays: dict[str, Path] = {}
    for copy in ["unedited", *(f"copy {n}" for n in range(COPIES))]:
        k8s = base / copy.replace(" ", "-") / "k8s"
        shutil.copytree(K8S, k8s)
        for name, (edit, _) in BROKEN.items():
            if _copy_of(name) == copy:
                edit(k8s)
        overlays[copy] = k8s / "overlays" / "prod"
    done = _check(facts, *overlays.values())
    assert done.returncode == 1, done.stdout + done.stderr
    return {
        copy: [
            line.removeprefix(f"{overlay}: ")
            for line in done.stdout.splitlines()
            if line.startswith(f"{overlay}: ")
        ]
        for copy, overlay in overlays.items()
    }


def test_an_unedited_copy_passes(broken_output: dict[str, list[str]]) -> None:
    lines = broken_output["unedited"]
    assert len(lines) == 1 and lines[0].endswith("objects valid"), lines


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_copy_fails(name: str, broken_output: dict[str, list[str]]) -> None:
    expected = BROKEN[name][1]
    lines = broken_output[_copy_of(name)]
    assert not any(line.endswith("objects valid") for line in lines), lines
    assert any(expected in line for line in lines), "\n".join(lines)
