"""The NetworkPolicies of the prod and staging overlays allow each pod exactly what it needs.

``k8s/components/network-policies`` is rendered into both overlays and validated with the
other objects (strict Kubernetes schemas, ``devtools/deploy/manifest_check.py``). Then the
rendered policies are evaluated the way a CNI does (a pod may do what any policy selecting it
allows; a named port is the selected pod's port) and compared with what each workload needs,
computed from the rendered manifests and the code, never from the policies:

- every workload's pods are selected by a default-deny policy (ingress and egress);
- egress: DNS for every pod; Kafka iff the deployable's settings class has a Kafka block
  (nothing else gives a deployable the brokers), to the namespace, Strimzi cluster and port
  of ``ZAPSTREAM_KAFKA_BROKERS``; PostgreSQL iff the pod mounts ``ZAPSTREAM_DATABASE_URL`` (and
  its settings class has a PostgreSQL block), to the component's ``POSTGRES_CIDR``; the
  gateways iff the pod mounts a credential the gateway clients (``connectors/gateways``)
  authenticate with, on the port of the configured gateway's URL, to public addresses only;
  the lag monitor's port iff the pod reads a lag URL (the console's, and ``zapstream status``
  in the pod the deployment guide runs it in);
- ingress, per declared container port: the ports a ServiceMonitor scrapes from Prometheus
  only; the ports of a Service no ServiceMonitor scrapes (published through the ingress) from
  the ingress controller's namespace only; the lag monitor's port also from its readers;
  every other port from nobody.

Each comparison is an equality, so a policy removed (a need not met) and a policy widened (a
pod, a peer, a port or an address more) both fail; the mutations below show each.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.unit.deploy.deployables import deploy_tool_path

ROOT = Path(__file__).resolve().parents[3]
COMPONENT = ROOT / "k8s" / "components" / "network-policies"
OVERLAYS = ("prod", "staging")
CHECKER = ROOT / "devtools" / "deploy" / "manifest_check.py"
GUIDE = ROOT / "docs" / "guides" / "deployment.md"

DATABASE = "ZAPSTREAM_DATABASE_URL"
COMPONENT_LABEL = "app.kubernetes.io/component"
NAMESPACE_NAME = "kubernetes.io/metadata.name"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")

Obj = dict[str, Any]
Peer = tuple[Any, ...]
Port = tuple[str, Any]

# --- what the cluster gives, what the component is told ----------------------------------------

DNS_PEER: Peer = ("namespace", ((NAMESPACE_NAME, "kube-system"),), (("k8s-app", "kube-dns"),))
"""kube-dns: its pods in kube-system (every distribution labels them ``k8s-app=kube-dns``)."""

PROMETHEUS_POD = (("app.kubernetes.io/name", "prometheus"),)
"""The label the Prometheus Operator puts on every Prometheus pod it runs."""

PUBLIC_V4: Peer = (
    "ip",
    "0.0.0.0/0",
    ("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"),
)
PUBLIC_V6: Peer = ("ip", "::/0", ("fc00::/7", "fe80::/10"))
"""The internet, and not the private, shared (CGNAT) or link-local ranges: a gateway is a
public HTTPS API; the cluster, the VPC and a cloud's metadata endpoint are not gateways."""


def component_settings() -> dict[str, str]:
    """The literals of the component's local settings (``POSTGRES_CIDR``, namespaces, ...)."""
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    [generator] = [
        g
        for g in kustomization["configMapGenerator"]
        if g["name"] == "zapstream-network-policy-settings"
    ]
    return dict(literal.split("=", 1) for literal in generator["literals"])


# --- rendering --------------------------------------------------------------------------------


def render(overlay: Path) -> list[Obj]:
    out = subprocess.run(
        [deploy_tool_path("kubectl"), "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [obj for obj in yaml.safe_load_all(out) if obj]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {o: render(ROOT / "k8s" / "overlays" / o) for o in OVERLAYS}


# --- the pods ---------------------------------------------------------------------------------


class Pod:
    """One workload's pod template: labels, container ports, mounted secret keys, command."""

    def __init__(self, workload: Obj) -> None:
        spec = workload["spec"]
        if workload["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        template = spec["template"]
        self.workload = f"{workload['kind']}/{workload['metadata']['name']}"
        self.name = workload["metadata"]["name"]
        self.labels: dict[str, str] = template["metadata"].get("labels", {})
        self.component = self.labels.get(COMPONENT_LABEL, "?")
        pod = template["spec"]
        self.containers: list[Obj] = pod.get("containers", [])
        self.ports: dict[str, int] = {}
        self.port_numbers: set[int] = set()
        for container in self.containers:
            for port in container.get("ports", []):
                self.port_numbers.add(port["containerPort"])
                if "name" in port:
                    self.ports[port["name"]] = port["containerPort"]
        self.secret_keys: set[str] = set()
        for volume in pod.get("volumes", []):
            sources = volume.get("projected", {}).get("sources", [])
            if "secret" in volume:
                sources = [{"secret": volume["secret"]}]
            for source in sources:
                self.secret_keys |= {i["key"] for i in source.get("secret", {}).get("items", [])}
        argv = [str(a) for a in self.containers[0].get("args", [])]
        self.command = " ".join(argv[:2]) if argv[:1] in (["db"], ["outbox"]) else argv[0]

    def __repr__(self) -> str:
        return self.workload


def pods(objects: list[Obj]) -> list[Pod]:
    return [Pod(o) for o in objects if o["kind"] in WORKLOAD_KINDS]


def config(objects: list[Obj]) -> dict[str, str]:
    [data] = [
        o.get("data", {})
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("zapstream-config")
    ]
    return dict(data)


# --- NetworkPolicy semantics ------------------------------------------------------------------


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A LabelSelector's verdict on ``labels`` (``{}`` selects everything)."""
    selector = selector or {}
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _canonical(selector: Obj | None) -> tuple[Any, ...]:
    selector = selector or {}
    labels = tuple(sorted(selector.get("matchLabels", {}).items()))
    exprs = tuple(
        sorted(
            (e["key"], e["operator"], tuple(sorted(e.get("values", []))))
            for e in selector.get("matchExpressions", [])
        )
    )
    return labels + exprs


def peers(entries: list[Obj] | None, all_pods: list[Pod]) -> set[Peer]:
    """The peers of a rule's ``to``/``from``: an address block, pods of other namespaces (by
    selector), or each component of this namespace it selects. None: anyone."""
    if not entries:
        return {("anywhere",)}
    found: set[Peer] = set()
    for entry in entries:
        if "ipBlock" in entry:
            block = entry["ipBlock"]
            found.add(("ip", block["cidr"], tuple(sorted(block.get("except", [])))))
        elif "namespaceSelector" in entry:
            found.add(
                (
                    "namespace",
                    _canonical(entry["namespaceSelector"]),
                    _canonical(entry.get("podSelector")),
                )
            )
        else:
            chosen = {p.component for p in all_pods if selects(entry["podSelector"], p.labels)}
            found |= {("pod", component) for component in chosen}
    return found


def policy_types(policy: Obj) -> set[str]:
    spec = policy["spec"]
    declared = spec.get("policyTypes")
    if declared is not None:
        return set(declared)
    return {"Ingress"} | ({"Egress"} if "egress" in spec else set())


def policies_of(pod: Pod, objects: list[Obj], direction: str) -> Iterator[Obj]:
    for obj in objects:
        if obj["kind"] != "NetworkPolicy":
            continue
        if direction in policy_types(obj) and selects(obj["spec"].get("podSelector"), pod.labels):
            yield obj


def egress(pod: Pod, objects: list[Obj], all_pods: list[Pod]) -> set[tuple[Peer, Port]]:
    """Every (peer, port) the pod may open a connection to; ("any", "*") for every port."""
    allowed: set[tuple[Peer, Port]] = set()
    for policy in policies_of(pod, objects, "Egress"):
        for rule in policy["spec"].get("egress", []):
            ports: set[Port] = {("any", "*")}
            if rule.get("ports"):
                ports = {
                    (p.get("protocol", "TCP"), (p.get("port", "*"), p.get("endPort")))
                    if "endPort" in p
                    else (p.get("protocol", "TCP"), p.get("port", "*"))
                    for p in rule["ports"]
                }
            allowed |= {(peer, port) for peer in peers(rule.get("to"), all_pods) for port in ports}
    return allowed


def ingress(pod: Pod, objects: list[Obj], all_pods: list[Pod]) -> dict[Any, set[Peer]]:
    """For each port of the pod that some rule opens (its number, "*" for all), who may
    connect. A named port the pod does not declare opens nothing."""
    opened: dict[Any, set[Peer]] = {}
    for policy in policies_of(pod, objects, "Ingress"):
        for rule in policy["spec"].get("ingress", []):
            numbers: set[Any] = {"*"}
            if rule.get("ports"):
                numbers = set()
                for p in rule["ports"]:
                    port = p.get("port", "*")
                    if isinstance(port, str) and port != "*":
                        if port not in pod.ports:
                            continue
                        port = pod.ports[port]
                    if "endPort" in p:
                        port = (port, p["endPort"])
                    numbers.add((p.get("protocol", "TCP"), port))
            for number in numbers:
                opened.setdefault(number, set()).update(peers(rule.get("from"), all_pods))
    return opened


# --- what each pod needs, from the manifests and the code -------------------------------------


def settings_class(command: str) -> type[Any]:
    """The settings class the deployable's ``main()`` builds (``db migrate`` reads
    RelaySettings only for the slot's and the publication's names: connectors/cli.py)."""
    from connectors.cdc.settings import RelaySettings
    from connectors.console.settings import ConsoleSettings
    from connectors.sink.settings import SinkSettings
    from connectors.webhook.settings import WebhookSettings
    from streams.kernel.settings import LagMonitorSettings, PostgresSettings
    from streams.worker_settings import WorkerSettings

    classes: dict[str, type[Any]] = {
        "relay": RelaySettings,
        "worker": WorkerSettings,
        "sink": SinkSettings,
        "webhook": WebhookSettings,
        "lag-monitor": LagMonitorSettings,
        "console": ConsoleSettings,
        "db migrate": PostgresSettings,
        "outbox prune": PostgresSettings,
    }
    assert command in classes, f"`zapstream {command}` is deployed: say what it connects to"
    return classes[command]


def blocks(cls: type[Any]) -> set[type[Any]]:
    """The class and the settings blocks it nests (KafkaSettings, PostgresSettings, ...)."""
    return {cls} | {
        f.annotation for f in cls.model_fields.values() if isinstance(f.annotation, type)
    }


def gateway_credentials() -> set[str]:
    """The variables of the credentials the gateway clients authenticate with: the secret
    fields of GatewaySettings that ``connectors/gateways`` reads."""
    from pydantic import SecretStr

    from connectors.startup import env_names
    from streams.kernel.settings import GatewaySettings

    code = "\n".join(p.read_text() for p in (ROOT / "connectors" / "gateways").glob("*.py"))
    read = set(re.findall(r"\.([a-z_]+)\b", code))
    fields = [
        name
        for name, field in GatewaySettings.model_fields.items()
        if field.annotation is SecretStr and name in read
    ]
    assert fields, "no gateway credential found in connectors/gateways"
    return {env for name in fields for env in env_names(GatewaySettings, name)}


def gateway_ports(cfg: dict[str, str]) -> set[int]:
    """The port of the configured gateway's URL (the ConfigMap's, else the default)."""
    from connectors.startup import env_names
    from streams.kernel.settings import GatewayKind, GatewaySettings

    url_field = {
        GatewayKind.STACKZAP: "stackzap_api_url",
        GatewayKind.ZAPAPI: "zap_api_url",
        GatewayKind.META: "meta_graph_url",
    }
    kind = GatewayKind(cfg.get("ZAPSTREAM_GATEWAY", GatewaySettings.model_fields["kind"].default))
    name = url_field[kind]
    url = cfg.get(env_names(GatewaySettings, name)[0], GatewaySettings.model_fields[name].default)
    parts = urlsplit(url)
    return {parts.port or {"https": 443, "http": 80}[parts.scheme]}


def kafka_peers(cfg: dict[str, str]) -> set[tuple[Peer, Port]]:
    """The brokers of the Strimzi cluster ``ZAPSTREAM_KAFKA_BROKERS`` names
    (``<cluster>-kafka-bootstrap.<namespace>.svc:<port>``), on that port."""
    found: set[tuple[Peer, Port]] = set()
    for broker in cfg["ZAPSTREAM_KAFKA_BROKERS"].split(","):
        host, port = broker.strip().rsplit(":", 1)
        service, namespace = host.split(".")[:2]
        assert service.endswith("-kafka-bootstrap"), f"{broker}: not a Strimzi bootstrap Service"
        cluster = service.removesuffix("-kafka-bootstrap")
        brokers = (("strimzi.io/cluster", cluster), ("strimzi.io/kind", "Kafka"))
        peer: Peer = ("namespace", ((NAMESPACE_NAME, namespace),), brokers)
        found.add((peer, ("TCP", int(port))))
    return found


def status_pod() -> str:
    """The Deployment the deployment guide runs ``zapstream status`` in."""
    found = set(re.findall(r"exec deploy/([a-z-]+) -- zapstream status", GUIDE.read_text()))
    assert len(found) == 1, found
    return str(found.pop())


def service_targets(objects: list[Obj], all_pods: list[Pod], service: str, port: int) -> set[Any]:
    """(component, container port) the Service ``service`` sends its ``port`` to."""
    [svc] = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == service]
    [spec] = [p for p in svc["spec"]["ports"] if p["port"] == port]
    target = spec.get("targetPort", port)
    found = set()
    for pod in all_pods:
        if selects({"matchLabels": svc["spec"]["selector"]}, pod.labels):
            number = pod.ports.get(target) if isinstance(target, str) else target
            if number is not None:
                found.add((pod.component, number))
    return found


def lag_reads(objects: list[Obj], all_pods: list[Pod]) -> dict[str, set[Any]]:
    """Reader component -> (component, port) of the lag URL it reads."""
    cfg = config(objects)
    readers: dict[str, str] = {}
    if cfg.get("ZAPSTREAM_CONSOLE_LAG_URL"):
        readers["console"] = cfg["ZAPSTREAM_CONSOLE_LAG_URL"]
    if cfg.get("ZAPSTREAM_STATUS_LAG_URL"):
        deployment = status_pod()
        [pod] = [p for p in all_pods if p.name == deployment]
        readers[pod.component] = cfg["ZAPSTREAM_STATUS_LAG_URL"]
    found: dict[str, set[Any]] = {}
    for reader, url in readers.items():
        parts = urlsplit(url)
        assert parts.hostname and parts.port, url
        found[reader] = service_targets(objects, all_pods, parts.hostname, parts.port)
    return found


def needed_egress(pod: Pod, objects: list[Obj], all_pods: list[Pod]) -> set[tuple[Peer, Port]]:
    cfg = config(objects)
    net = component_settings()
    need: set[tuple[Peer, Port]] = {(DNS_PEER, ("UDP", 53)), (DNS_PEER, ("TCP", 53))}
    nested = blocks(settings_class(pod.command))
    from streams.kernel.settings import KafkaSettings, PostgresSettings

    if KafkaSettings in nested:
        need |= kafka_peers(cfg)
    if DATABASE in pod.secret_keys:
        need.add((("ip", net["POSTGRES_CIDR"], ()), ("TCP", int(net["POSTGRES_PORT"]))))
    if pod.secret_keys & gateway_credentials():
        need |= {
            (peer, ("TCP", port)) for peer in (PUBLIC_V4, PUBLIC_V6) for port in gateway_ports(cfg)
        }
    for component, port in lag_reads(objects, all_pods).get(pod.component, set()):
        need.add((("pod", component), ("TCP", port)))
    assert (DATABASE in pod.secret_keys) == (PostgresSettings in nested), (
        f"{pod}: mounts {DATABASE} but its settings have no PostgreSQL block, or the reverse"
    )
    return need


def needed_ingress(pod: Pod, objects: list[Obj], all_pods: list[Pod]) -> dict[Any, set[Peer]]:
    net = component_settings()
    prometheus: Peer = (
        "namespace",
        ((NAMESPACE_NAME, net["MONITORING_NAMESPACE"]),),
        PROMETHEUS_POD,
    )
    controller: Peer = ("namespace", ((NAMESPACE_NAME, net["INGRESS_NAMESPACE"]),), ())
    services = [o for o in objects if o["kind"] == "Service"]
    scraped: set[tuple[str, str]] = set()
    for monitor in (o for o in objects if o["kind"] == "ServiceMonitor"):
        for svc in services:
            if selects(monitor["spec"]["selector"], svc["metadata"].get("labels", {})):
                scraped |= {
                    (svc["metadata"]["name"], e["port"]) for e in monitor["spec"]["endpoints"]
                }
    need: dict[Any, set[Peer]] = {}
    for svc in services:
        for port in svc["spec"]["ports"]:
            name = svc["metadata"]["name"]
            peer = prometheus if (name, port.get("name")) in scraped else controller
            for component, number in service_targets(objects, all_pods, name, port["port"]):
                if component == pod.component:
                    need.setdefault(("TCP", number), set()).add(peer)
    for reader, targets in lag_reads(objects, all_pods).items():
        for component, number in targets:
            if component == pod.component:
                need.setdefault(("TCP", number), set()).add(("pod", reader))
    return need


# --- the checks (each returns one line per problem) -------------------------------------------


def default_deny_problems(objects: list[Obj]) -> list[str]:
    problems = []
    for pod in pods(objects):
        deny = [
            p["metadata"]["name"]
            for p in objects
            if p["kind"] == "NetworkPolicy"
            and policy_types(p) >= {"Ingress", "Egress"}
            and not p["spec"].get("ingress")
            and not p["spec"].get("egress")
            and selects(p["spec"].get("podSelector"), pod.labels)
        ]
        if not deny:
            problems.append(f"{pod}: no default-deny policy (Ingress and Egress) selects its pods")
    return problems


def egress_problems(objects: list[Obj]) -> list[str]:
    problems = []
    all_pods = pods(objects)
    for pod in all_pods:
        allowed = egress(pod, objects, all_pods)
        needed = needed_egress(pod, objects, all_pods)
        for peer, port in sorted(allowed - needed, key=repr):
            problems.append(f"{pod}: egress to {peer} port {port} is allowed, not needed")
        for peer, port in sorted(needed - allowed, key=repr):
            problems.append(f"{pod}: egress to {peer} port {port} is needed, not allowed")
    return problems


def ingress_problems(objects: list[Obj]) -> list[str]:
    problems = []
    all_pods = pods(objects)
    for pod in all_pods:
        opened = ingress(pod, objects, all_pods)
        needed = needed_ingress(pod, objects, all_pods)
        for port in sorted(set(opened) | set(needed), key=repr):
            extra = opened.get(port, set()) - needed.get(port, set())
            missing = needed.get(port, set()) - opened.get(port, set())
            for peer in sorted(extra, key=repr):
                problems.append(f"{pod}: port {port} is reachable from {peer}, which needs not")
            for peer in sorted(missing, key=repr):
                problems.append(f"{pod}: port {port} must be reachable from {peer}")
        undeclared = {p for p in opened if p == "*" or p[1] not in pod.port_numbers}
        for port in sorted(undeclared, key=repr):
            problems.append(f"{pod}: ingress opens {port}, no declared container port")
    return problems


def all_problems(objects: list[Obj]) -> list[str]:
    return default_deny_problems(objects) + egress_problems(objects) + ingress_problems(objects)


# --- the shipped overlays ---------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlay_renders_the_network_policies(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    namespace = {o["metadata"]["name"] for o in rendered[overlay] if o["kind"] == "Namespace"}
    policies = [o for o in rendered[overlay] if o["kind"] == "NetworkPolicy"]
    assert len(policies) >= 2 and {p["metadata"]["namespace"] for p in policies} == namespace
    assert not [o for o in rendered[overlay] if "network-policy-settings" in o["metadata"]["name"]]


def test_the_policies_validate_against_the_kubernetes_schema(tmp_path: Path) -> None:
    """The existing validation path (strict Kubernetes 1.37 schemas), and a NetworkPolicy with
    a typo fails it (a broken copy of k8s/)."""
    from devtools.deploy import k8s_facts

    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(k8s_facts.facts()))
    broken = tmp_path / "k8s"
    shutil.copytree(ROOT / "k8s", broken)
    policies = broken / "components" / "network-policies" / "network-policies.yaml"
    text = policies.read_text()
    assert "        - protocol: UDP\n" in text
    policies.write_text(text.replace("        - protocol: UDP\n", "        - protocl: UDP\n", 1))
    overlays = [ROOT / "k8s" / "overlays" / o for o in OVERLAYS] + [broken / "overlays" / "prod"]
    done = subprocess.run(
        [deploy_tool_path("python"), str(CHECKER), *map(str, overlays), "--facts", str(facts)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.splitlines()
    for overlay in OVERLAYS:
        assert any(
            line.startswith(f"{ROOT / 'k8s' / 'overlays' / overlay}: ")
            and line.endswith("objects valid")
            for line in lines
        ), done.stdout + done.stderr
    assert done.returncode == 1
    assert any(
        "NetworkPolicy/zapstream-allow-dns: spec.egress.0.ports.0" in line
        and "'protocl' was unexpected" in line
        for line in lines
    ), done.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_is_selected_by_a_default_deny_policy(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objects = rendered[overlay]
    assert {p.command for p in pods(objects)} >= {"relay", "worker", "console", "db migrate"}
    assert default_deny_problems(objects) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_workloads_egress_is_exactly_what_it_needs(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    assert egress_problems(rendered[overlay]) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_port_is_reachable_only_from_who_needs_it(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    assert ingress_problems(rendered[overlay]) == []


def test_the_needs_are_the_expected_ones(rendered: dict[str, list[Obj]]) -> None:
    """What the code and the manifests say, spelled out (a reader's check of the derivation)."""
    objects = rendered["prod"]
    all_pods = pods(objects)
    kinds: dict[str, set[str]] = {}
    for pod in all_pods:
        need = needed_egress(pod, objects, all_pods)
        kinds[pod.component] = {
            "kafka" if peer[0] == "namespace" and port == ("TCP", 9092) else
            "postgres" if peer[0] == "ip" and port[1] == 5432 else
            "gateways" if peer in (PUBLIC_V4, PUBLIC_V6) else
            "lag-monitor" if peer[0] == "pod" else "dns"
            for peer, port in need
        }  # fmt: skip
    assert kinds == {
        "relay": {"dns", "kafka", "postgres", "lag-monitor"},
        "worker": {"dns", "kafka", "postgres", "gateways"},
        "sink": {"dns", "kafka", "postgres"},
        "webhook": {"dns", "kafka", "postgres"},
        "lag-monitor": {"dns", "kafka"},
        "console": {"dns", "postgres", "lag-monitor"},
        "migrate": {"dns", "postgres"},
        "prune": {"dns", "postgres"},
    }
    [worker] = [p for p in all_pods if p.component == "worker"]
    assert needed_ingress(worker, objects, all_pods) == {
        ("TCP", 6066): {
            ("namespace", ((NAMESPACE_NAME, "monitoring"),), PROMETHEUS_POD),
        }
    }


def test_the_postgres_address_is_one_network_not_the_internet() -> None:
    network = ipaddress.ip_network(component_settings()["POSTGRES_CIDR"])
    assert network.prefixlen >= (16 if network.version == 4 else 48), network


# --- a policy removed or widened fails --------------------------------------------------------


def _policy(objects: list[Obj], name: str) -> Obj:
    [found] = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == name]
    return found


def _remove(name: str) -> Callable[[list[Obj]], None]:
    def edit(objects: list[Obj]) -> None:
        objects.remove(_policy(objects, name))

    return edit


def _spec(name: str, change: Callable[[Obj], None]) -> Callable[[list[Obj]], None]:
    def edit(objects: list[Obj]) -> None:
        change(_policy(objects, name)["spec"])

    return edit


def _also_select(component: str) -> Callable[[Obj], None]:
    def change(spec: Obj) -> None:
        selector = spec["podSelector"]
        if COMPONENT_LABEL in selector.get("matchLabels", {}):
            only = selector["matchLabels"].pop(COMPONENT_LABEL)
            selector["matchExpressions"] = [
                {"key": COMPONENT_LABEL, "operator": "In", "values": [only]}
            ]
        selector["matchExpressions"][0]["values"].append(component)

    return change


def _allow_all_ingress_to_worker(objects: list[Obj]) -> None:
    objects.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "debug", "namespace": "zapstream"},
            "spec": {
                "podSelector": {"matchLabels": {COMPONENT_LABEL: "worker"}},
                "policyTypes": ["Ingress"],
                "ingress": [{}],
            },
        }
    )


MUTATIONS: dict[str, tuple[Callable[[list[Obj]], None], str]] = {
    # name: (an edit of the rendered prod objects, a line the checks must print)
    "default deny removed": (
        _remove("zapstream-default-deny"),
        "Deployment/zapstream-relay: no default-deny policy",
    ),
    "default deny narrowed to the relay": (
        _spec(
            "zapstream-default-deny",
            lambda s: s["podSelector"]["matchLabels"].update({COMPONENT_LABEL: "relay"}),
        ),
        "CronJob/zapstream-prune: no default-deny policy",
    ),
    "DNS removed": (
        _remove("zapstream-allow-dns"),
        "Job/zapstream-migrate: egress to ('namespace', (('kubernetes.io/metadata.name', "
        "'kube-system'),), (('k8s-app', 'kube-dns'),)) port ('UDP', 53) is needed, not allowed",
    ),
    "DNS to every namespace": (
        _spec(
            "zapstream-allow-dns", lambda s: s["egress"][0]["to"][0].update(namespaceSelector={})
        ),
        "Job/zapstream-migrate: egress to ('namespace', (), (('k8s-app', 'kube-dns'),)) port "
        "('UDP', 53) is allowed, not needed",
    ),
    "Kafka removed": (
        _remove("zapstream-allow-kafka"),
        "Deployment/zapstream-relay: egress to ('namespace', (('kubernetes.io/metadata.name', "
        "'kafka'),), (('strimzi.io/cluster', 'kafka'), ('strimzi.io/kind', 'Kafka'))) port "
        "('TCP', 9092) is needed, not allowed",
    ),
    "Kafka for the console": (
        _spec("zapstream-allow-kafka", _also_select("console")),
        "Deployment/zapstream-console: egress to ('namespace', (('kubernetes.io/metadata.name', "
        "'kafka'),)",
    ),
    "Kafka on another port": (
        _spec(
            "zapstream-allow-kafka",
            lambda s: s["egress"][0]["ports"].append({"protocol": "TCP", "port": 9093}),
        ),
        "Deployment/zapstream-sink: egress to ('namespace', (('kubernetes.io/metadata.name', "
        "'kafka'),), (('strimzi.io/cluster', 'kafka'), ('strimzi.io/kind', 'Kafka'))) port "
        "('TCP', 9093) is allowed, not needed",
    ),
    "Kafka to any pod of its namespace": (
        _spec("zapstream-allow-kafka", lambda s: s["egress"][0]["to"][0].pop("podSelector")),
        "Deployment/zapstream-webhook: egress to ('namespace', (('kubernetes.io/metadata.name', "
        "'kafka'),), ()) port ('TCP', 9092) is allowed, not needed",
    ),
    "Kafka to anywhere": (
        _spec("zapstream-allow-kafka", lambda s: s["egress"][0].pop("to")),
        "Deployment/zapstream-lag-monitor: egress to ('anywhere',) port ('TCP', 9092) is allowed",
    ),
    "PostgreSQL removed": (
        _remove("zapstream-allow-postgres"),
        "CronJob/zapstream-prune: egress to ('ip', '192.0.2.10/32', ()) port ('TCP', 5432) is "
        "needed, not allowed",
    ),
    "PostgreSQL anywhere": (
        _spec(
            "zapstream-allow-postgres",
            lambda s: s["egress"][0]["to"][0]["ipBlock"].update(cidr="0.0.0.0/0"),
        ),
        "Deployment/zapstream-relay: egress to ('ip', '0.0.0.0/0', ()) port ('TCP', 5432) is "
        "allowed, not needed",
    ),
    "PostgreSQL for the lag monitor": (
        _spec("zapstream-allow-postgres", _also_select("lag-monitor")),
        "Deployment/zapstream-lag-monitor: egress to ('ip', '192.0.2.10/32', ()) port "
        "('TCP', 5432) is allowed, not needed",
    ),
    "gateways removed": (
        _remove("zapstream-allow-gateways"),
        "Deployment/zapstream-worker: egress to ('ip', '0.0.0.0/0', ('10.0.0.0/8', ",
    ),
    "gateways for the webhook": (
        _spec("zapstream-allow-gateways", _also_select("webhook")),
        "Deployment/zapstream-webhook: egress to ('ip', '0.0.0.0/0', ('10.0.0.0/8', ",
    ),
    "gateways into the private ranges": (
        _spec(
            "zapstream-allow-gateways",
            lambda s: s["egress"][0]["to"][0]["ipBlock"]["except"].remove("10.0.0.0/8"),
        ),
        "Deployment/zapstream-worker: egress to ('ip', '0.0.0.0/0', ('100.64.0.0/10', ",
    ),
    "gateways on every port": (
        _spec("zapstream-allow-gateways", lambda s: s["egress"][0].pop("ports")),
        "port ('any', '*') is allowed, not needed",
    ),
    "lag reads removed": (
        _remove("zapstream-allow-lag-reads"),
        "Deployment/zapstream-console: egress to ('pod', 'lag-monitor') port ('TCP', 6068) is "
        "needed, not allowed",
    ),
    "lag monitor unreachable for its readers": (
        _remove("zapstream-lag-monitor-from-readers"),
        "Deployment/zapstream-lag-monitor: port ('TCP', 6068) must be reachable from ('pod', "
        "'console')",
    ),
    "metrics from nobody": (
        _remove("zapstream-metrics-from-prometheus"),
        "Deployment/zapstream-worker: port ('TCP', 6066) must be reachable from ('namespace', "
        "(('kubernetes.io/metadata.name', 'monitoring'),), (('app.kubernetes.io/name', "
        "'prometheus'),))",
    ),
    "metrics from every namespace": (
        _spec(
            "zapstream-metrics-from-prometheus",
            lambda s: s["ingress"][0]["from"][0].update(namespaceSelector={}),
        ),
        "Deployment/zapstream-sink: port ('TCP', 6067) is reachable from ('namespace', (), "
        "(('app.kubernetes.io/name', 'prometheus'),)), which needs not",
    ),
    "metrics from any pod of the monitoring namespace": (
        _spec(
            "zapstream-metrics-from-prometheus",
            lambda s: s["ingress"][0]["from"][0].pop("podSelector"),
        ),
        "Deployment/zapstream-relay: port ('TCP', 6069) is reachable from ('namespace', "
        "(('kubernetes.io/metadata.name', 'monitoring'),), ()), which needs not",
    ),
    "ingress removed": (
        _remove("zapstream-http-from-ingress"),
        "Deployment/zapstream-webhook: port ('TCP', 8090) must be reachable from ('namespace', "
        "(('kubernetes.io/metadata.name', 'ingress-nginx'),), ())",
    ),
    "webhook and console from anyone": (
        _spec("zapstream-http-from-ingress", lambda s: s["ingress"][0].pop("from")),
        "Deployment/zapstream-console: port ('TCP', 6070) is reachable from ('anywhere',)",
    ),
    "webhook and console on every port": (
        _spec("zapstream-http-from-ingress", lambda s: s["ingress"][0].pop("ports")),
        "Deployment/zapstream-webhook: ingress opens *, no declared container port",
    ),
    "the worker open to all": (
        _allow_all_ingress_to_worker,
        "Deployment/zapstream-worker: port * is reachable from ('anywhere',), which needs not",
    ),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_a_policy_removed_or_widened_fails(rendered: dict[str, list[Obj]], name: str) -> None:
    edit, expected = MUTATIONS[name]
    objects = copy.deepcopy(rendered["prod"])
    assert all_problems(objects) == []
    edit(objects)
    problems = all_problems(objects)
    assert any(expected in line for line in problems), "\n".join(problems)
