"""docker-compose.yml, both Kubernetes overlays and the code agree.

- Every setting the code reads is set or defaulted for each deployable, and the ones whose
  defaults only make sense on a laptop (127.0.0.1 DSN and brokers, loopback-only ports) are
  set in every deployment: each deployable's settings are built from exactly what the
  container gets (its environment, the ConfigMap, the secret files it mounts).
- Topics: ``topics ensure`` (what compose runs), the Strimzi KafkaTopics and the
  partition count every deployable checks at start are one definition.
- Names: with the overlay's ``ZAPSTREAM_KAFKA_TOPIC_PREFIX`` (``staging-`` in the staging
  overlay), every topic and group the KafkaTopics, the KEDA triggers, the alert rules and the
  dashboard name is the prefix + the contract's name.
- The ports the probes, scrapes and Services use are the ports the settings open.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.deploy import compose_check as cc
from streams.kernel.contract import TopicNames, topic_specs
from tests.unit.deploy.deployables import isolate_environment, settings_of, write_secret_files

ROOT = cc.ROOT
OVERLAYS = ("dev", "prod", "staging")

DATABASE = "ZAPSTREAM_DATABASE_URL"
BROKERS = "ZAPSTREAM_KAFKA_BROKERS"
MUST_SET: dict[str, set[str]] = {
    "db migrate": {DATABASE},
    "topics ensure": {BROKERS, "ZAPSTREAM_KAFKA_PARTITIONS", "ZAPSTREAM_KAFKA_REPLICATION_FACTOR"},
    "relay": {DATABASE, BROKERS, "ZAPSTREAM_RELAY_METRICS_PORT"},
    "worker": {
        DATABASE,
        BROKERS,
        "ZAPSTREAM_GATEWAY",
        "STACKZAP_API_URL",
        "STACKZAP_API_KEY",
        "ZAPSTREAM_REFERENCE_KEY",
    },
    "sink": {DATABASE, BROKERS},
    "webhook": {DATABASE, BROKERS, "ZAPSTREAM_WEBHOOK_SECRET", "ZAPSTREAM_REFERENCE_KEY"},
    "lag-monitor": {BROKERS},
    "console": {DATABASE, "ZAPSTREAM_CONSOLE_TOKENS"},
    "outbox prune --older-than 90d": {DATABASE},
}
"""Variables whose default is wrong in any deployment (a laptop's address, no secret)."""

LISTENS: dict[str, tuple[str, str | None]] = {
    "relay": ("ZAPSTREAM_RELAY_METRICS_PORT", "ZAPSTREAM_RELAY_METRICS_BIND_LOCAL"),
    "worker": ("ZAPSTREAM_WORKER_WEB_PORT", "ZAPSTREAM_WORKER_WEB_BIND_LOCAL"),
    "sink": ("ZAPSTREAM_SINK_METRICS_PORT", "ZAPSTREAM_SINK_METRICS_BIND_LOCAL"),
    "lag-monitor": ("ZAPSTREAM_LAG_METRICS_PORT", "ZAPSTREAM_LAG_METRICS_BIND_LOCAL"),
    "console": ("ZAPSTREAM_CONSOLE_PORT", "ZAPSTREAM_CONSOLE_BIND_LOCAL"),
    "webhook": ("ZAPSTREAM_WEBHOOK_PORT", None),
}
"""Each server's port variable and its loopback-only switch (the webhook has a host)."""


class Deployable:
    """One container of a deployment: its command, environment and secret file names
    (``optional``: files of an optional Secret source, present only if the key exists)."""

    def __init__(
        self,
        where: str,
        argv: list[str],
        env: dict[str, str],
        secrets: set[str],
        optional: frozenset[str] = frozenset(),
        files: frozenset[str] = frozenset(),
    ) -> None:
        self.where = where
        self.argv = argv
        self.env = env
        self.secrets = secrets
        self.optional = optional
        self.files = files
        """Paths of the Secret and ConfigMap files the container mounts (e.g. a CA file)."""

    @property
    def command(self) -> str:
        return " ".join(self.argv)


def _compose() -> list[Deployable]:
    compose = cc.load()
    return [
        Deployable(
            f"docker-compose.yml service {name}",
            cc.command(svc),
            cc.environment(svc),
            {filename for _, filename in cc.mounts(svc, "secrets")},
        )
        for name, svc in cc.services(compose).items()
        if cc.is_zapstream(svc)
    ]


def _render(overlay: str, kubectl: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [obj for obj in yaml.safe_load_all(out) if obj]


def _secret_files(
    pod: dict[str, Any], container: dict[str, Any], directory: str
) -> tuple[set[str], frozenset[str]]:
    """(required, optional) file names of the Secret sources mounted at ``directory``."""
    mounted = {m["name"] for m in container.get("volumeMounts", []) if m["mountPath"] == directory}
    required: set[str] = set()
    optional: set[str] = set()
    for volume in pod.get("volumes", []):
        if volume["name"] not in mounted:
            continue
        sources = volume.get("projected", {}).get("sources", [])
        if "secret" in volume:
            sources = [{"secret": volume["secret"]}]
        for source in sources:
            secret = source.get("secret", {})
            names = {item["path"] for item in secret.get("items", [])}
            (optional if secret.get("optional") else required).update(names)
    return required, frozenset(optional)


def mounted_files(pod: dict[str, Any], container: dict[str, Any]) -> frozenset[str]:
    """``<mountPath>/<path>`` of every item of a Secret or ConfigMap the container mounts."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = set()
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        sources = [s for s in volume.get("projected", {}).get("sources", [])]
        sources += [{k: volume[k]} for k in ("secret", "configMap") if k in volume]
        for source in sources:
            for kind in ("secret", "configMap"):
                for item in source.get(kind, {}).get("items", []):
                    files.add(f"{mount['mountPath']}/{item['path']}")
    return frozenset(files)


def _k8s(objects: list[dict[str, Any]], overlay: str) -> list[Deployable]:
    maps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    found = []
    for obj in objects:
        if obj["kind"] not in ("Deployment", "Job", "CronJob"):
            continue
        spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
        pod = spec["template"]["spec"]
        for container in pod["containers"]:
            if container.get("command") != ["zapstream"]:
                continue
            env: dict[str, str] = {}
            for source in container.get("envFrom", []):
                env.update(maps[source["configMapRef"]["name"]])
            env.update(
                {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
            )
            directory = env.get("ZAPSTREAM_SECRETS_DIR", "")
            secrets, optional = _secret_files(pod, container, directory)
            where = f"k8s/overlays/{overlay} {obj['kind']} {obj['metadata']['name']}"
            files = mounted_files(pod, container)
            found.append(Deployable(where, container["args"], env, secrets, optional, files))
    return found


@pytest.fixture(scope="module")
def rendered(deploy_tool: Callable[[str], str]) -> dict[str, list[dict[str, Any]]]:
    return {overlay: _render(overlay, deploy_tool("kubectl")) for overlay in OVERLAYS}


@pytest.fixture(scope="module")
def deployments(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, list[Deployable]]:
    found = {"compose": _compose()}
    found.update({overlay: _k8s(objects, overlay) for overlay, objects in rendered.items()})
    return found


@pytest.mark.parametrize("deployment", ["compose", *OVERLAYS])
def test_every_deployable_is_deployed(
    deployments: dict[str, list[Deployable]], deployment: str
) -> None:
    commands = {d.command for d in deployments[deployment]}
    # Compose creates the topics (`topics ensure`); on Kubernetes Strimzi does, and a CronJob
    # prunes old jobs (the compose demo keeps everything).
    elsewhere = "outbox prune --older-than 90d" if deployment == "compose" else "topics ensure"
    expected = set(MUST_SET) - {elsewhere}
    assert expected <= commands, f"{deployment} lacks {sorted(expected - commands)}"


@pytest.mark.parametrize("deployment", ["compose", *OVERLAYS])
def test_settings_with_laptop_defaults_are_set_everywhere(
    deployments: dict[str, list[Deployable]], deployment: str
) -> None:
    problems = []
    for d in deployments[deployment]:
        given = set(d.env) | d.secrets | d.optional
        for name in sorted(MUST_SET[d.command] - given):
            problems.append(f"{d.where}: {name} is not set (its default only fits a laptop)")
        port, local = LISTENS.get(d.command, (None, None))
        if local is not None and d.env.get(local) != "false":
            problems.append(f"{d.where}: {local} is not false: {port} would refuse other hosts")
        if d.command == "webhook" and d.env.get("ZAPSTREAM_WEBHOOK_HOST") != "0.0.0.0":
            problems.append(f"{d.where}: ZAPSTREAM_WEBHOOK_HOST is not 0.0.0.0")
    assert problems == []


@pytest.mark.parametrize("deployment", ["compose", *OVERLAYS])
def test_every_deployable_builds_its_settings_from_what_its_container_gets(
    deployments: dict[str, list[Deployable]],
    deployment: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The settings classes accept the environment plus the secret files (no unknown
    variable, no invalid value), and every required field (none today) is given."""
    from connectors.startup import env_names, settings_classes, unknown_env_lines

    required = {
        env_names(cls, field)[0]
        for cls in settings_classes()
        for field, info in cls.model_fields.items()
        if info.is_required()
    }
    for i, d in enumerate(deployments[deployment]):
        secrets_dir = tmp_path / str(i)
        secrets_dir.mkdir()
        written = write_secret_files(secrets_dir, sorted(d.secrets))
        env = {**d.env, "ZAPSTREAM_SECRETS_DIR": str(secrets_dir)}
        for name, value in d.env.items():
            if value in d.files:  # a file the container mounts (ZAPSTREAM_KAFKA_SSL_CAFILE)
                mounted = tmp_path / f"{i}-{name}"
                mounted.write_text("mounted\n")
                env[name] = str(mounted)
        assert unknown_env_lines(env) == [], d.where
        assert required <= set(env) | d.secrets, (d.where, sorted(required - set(env)))
        isolate_environment(monkeypatch, env)
        built = settings_of(d.argv)
        for block in [built] if not isinstance(built, tuple) else list(built):
            for name in ("postgres", "kafka"):
                nested = getattr(block, name, None)
                if name == "postgres" and nested is not None:
                    assert nested.url.get_secret_value() == written[DATABASE], d.where
                if name == "kafka" and nested is not None:
                    assert nested.brokers == d.env[BROKERS], d.where


def _shared(d: Deployable) -> dict[str, str]:
    names = ("ZAPSTREAM_KAFKA_PARTITIONS", "ZAPSTREAM_KAFKA_FLAVOR", "ZAPSTREAM_WORKER_APP_ID")
    return {n: d.env[n] for n in names if n in d.env}


def test_compose_and_kubernetes_agree_on_ports_partitions_and_groups(
    deployments: dict[str, list[Deployable]],
) -> None:
    """One port per server, one partition count, one worker group, in every deployment."""
    seen: dict[str, set[str]] = {}
    for ds in deployments.values():
        for d in ds:
            port, _ = LISTENS.get(d.command, (None, None))
            if port is not None:
                seen.setdefault(port, set()).add(d.env[port])
            for name, value in _shared(d).items():
                seen.setdefault(name, set()).add(value)
    disagree = {name: values for name, values in seen.items() if len(values) != 1}
    assert disagree == {}
    assert seen["ZAPSTREAM_KAFKA_FLAVOR"] == {"kafka"}


def test_topic_definitions_agree_between_topics_ensure_strimzi_and_compose(
    deployments: dict[str, list[Deployable]], rendered: dict[str, list[dict[str, Any]]]
) -> None:
    [topics_job] = [d for d in deployments["compose"] if d.command == "topics ensure"]
    partitions = int(topics_job.env["ZAPSTREAM_KAFKA_PARTITIONS"])
    for overlay, objects in rendered.items():
        names = TopicNames(_config(objects).get(PREFIX, ""))
        specs = topic_specs(partitions, names=names)
        expected = {s.name: (s.partitions, dict(s.configs)) for s in specs}
        strimzi = {
            o["spec"].get("topicName", o["metadata"]["name"]): (
                o["spec"]["partitions"],
                {k: str(v) for k, v in o["spec"]["config"].items() if k != "min.insync.replicas"},
            )
            for o in objects
            if o["kind"] == "KafkaTopic"
        }
        assert strimzi == expected, overlay
        replication = {d.env["ZAPSTREAM_KAFKA_REPLICATION_FACTOR"] for d in deployments[overlay]}
        replicas = {str(o["spec"]["replicas"]) for o in objects if o["kind"] == "KafkaTopic"}
        assert replicas == replication, overlay


# --- names under the topic prefix ------------------------------------------------------------

PREFIX = "ZAPSTREAM_KAFKA_TOPIC_PREFIX"
DASHBOARD = ROOT / "k8s" / "monitoring" / "zapstream-dashboard.json"
_MATCHER = re.compile(r'\b(topic|group|consumergroup)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def _config(objects: list[dict[str, Any]]) -> dict[str, str]:
    [config] = [
        o["data"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("zapstream-config")
    ]
    return dict(config)


def _exprs(node: Any) -> Iterator[str]:
    """Every PromQL expression in a PrometheusRule's spec or a Grafana dashboard."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def selector_problems(exprs: list[str], topics: set[str], groups: set[str]) -> list[str]:
    """Label matchers on ``topic``/``group`` that select none of ``topics``/``groups``.

    Prometheus anchors a regex matcher at both ends (fullmatch); a literal one must be one of
    the names. A negative matcher (``!=``, ``!~``) narrows, it names nothing: not checked.
    """
    problems = []
    for expr in exprs:
        for label, op, quoted in _MATCHER.findall(expr):
            value = re.sub(r"\\(.)", r"\1", quoted)  # PromQL string escapes
            names = topics if label == "topic" else groups
            if op == "=" and value not in names:
                problems.append(f"{label}={value!r} is none of {sorted(names)}: {expr}")
            if op == "=~" and not any(re.fullmatch(value, n) for n in names):
                problems.append(f"{label}=~{value!r} matches none of {sorted(names)}: {expr}")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_topic_and_group_named_is_the_prefix_plus_the_contracts_name(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    objects = rendered[overlay]
    config = _config(objects)
    names = TopicNames(config.get(PREFIX, ""))
    worker_group = names.group(config.get("ZAPSTREAM_WORKER_APP_ID", "zapstream-worker"))
    sink_group = names.group(config.get("ZAPSTREAM_SINK_GROUP_ID", "zapstream-state-sink"))
    topics = set(names.all())

    strimzi = {o["spec"]["topicName"] for o in objects if o["kind"] == "KafkaTopic"}
    assert strimzi == topics, overlay

    triggers = [
        t["metadata"]
        for o in objects
        if o["kind"] == "ScaledObject"
        for t in o["spec"]["triggers"]
        if t["type"] == "kafka"
    ]
    assert {t["consumerGroup"] for t in triggers} == {worker_group}, overlay
    assert {t["topic"] for t in triggers} == {names.intents, names.bulk_intents}, overlay

    rules = [o["spec"] for o in objects if o["kind"] == "PrometheusRule"]
    exprs = [*_exprs(rules), *_exprs(json.loads(DASHBOARD.read_text()))]
    assert any(_MATCHER.search(e) for e in exprs), "no expression selects a topic or group"
    assert selector_problems(exprs, topics, {worker_group, sink_group}) == [], overlay


def test_an_overlay_sets_a_prefix_and_the_selectors_would_catch_a_stale_one(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The check above can fail: the staging overlay has a prefix, and the selector the alert
    rules had before prefixes (``zapstream\\.intents.*``) selects none of its topics."""
    prefixes = {overlay: _config(objects).get(PREFIX, "") for overlay, objects in rendered.items()}
    assert prefixes["staging"] == "staging-" and prefixes["prod"] == ""
    names = TopicNames("staging-")
    stale = 'max by (topic) (kafka_consumergroup_group_lag{topic=~"zapstream\\\\.intents.*"})'
    assert selector_problems([stale], set(names.all()), set()) != []
    assert selector_problems([stale], set(TopicNames().all()), set()) == []
