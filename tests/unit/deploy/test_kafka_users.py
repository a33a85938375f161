"""The prod overlay's Kafka users agree with the code's table of Kafka access.

``kubectl kustomize k8s/overlays/prod`` renders one Strimzi ``KafkaUser`` per Kafka client
(relay, worker, sink, webhook, lag monitor), SCRAM-SHA-512, whose ACLs are exactly
:func:`streams.kernel.kafka_access.access_table`'s for the overlay's topic prefix, worker app
id, sink group and exactly-once switch (no ``admin``: Strimzi's KafkaTopics create the topics);
and every Kafka-client workload logs in over SASL_SSL as its own user, with that user's
password (the Secret Strimzi writes for it) and the cluster CA, and no other workload logs in.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.deploy import kafka_users
from streams.kernel.contract import TopicNames
from streams.kernel.kafka_access import (
    ComponentAccess,
    Operation,
    ResourceType,
    access_table,
    strimzi_acls,
)

ROOT = Path(__file__).resolve().parents[3]
PROD = ROOT / "k8s" / "overlays" / "prod"
KAFKA_CLIENTS = ("relay", "worker", "sink", "webhook", "lag-monitor")
"""The ``zapstream`` commands that are Kafka clients (and their components' names)."""
SECRETS_DIR = "ZAPSTREAM_SECRETS_DIR"
DESCRIBE = Operation.DESCRIBE


@pytest.fixture(scope="module")
def objects(deploy_tool: Callable[[str], str]) -> list[dict[str, Any]]:
    out = subprocess.run(
        [deploy_tool("kubectl"), "kustomize", str(PROD)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def _config(objects: list[dict[str, Any]]) -> dict[str, str]:
    [config] = [
        o["data"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("zapstream-config")
    ]
    return dict(config)


def _table(objects: list[dict[str, Any]]) -> dict[str, ComponentAccess]:
    """The table for the overlay's settings (as its deployables read them)."""
    config = _config(objects)
    return access_table(
        TopicNames(config.get("ZAPSTREAM_KAFKA_TOPIC_PREFIX", "")),
        create_topics=False,
        relay_exactly_once=config.get("ZAPSTREAM_RELAY_EXACTLY_ONCE", "false").lower() == "true",
        worker_app_id=config.get("ZAPSTREAM_WORKER_APP_ID", "zapstream-worker"),
        sink_group=config.get("ZAPSTREAM_SINK_GROUP_ID", "zapstream-state-sink"),
        autoscaler=True,
    )


def _containers(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(zapstream command, pod spec, container) of every zapstream container."""
    found = []
    for obj in objects:
        if obj["kind"] not in ("Deployment", "Job", "CronJob"):
            continue
        spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
        pod = spec["template"]["spec"]
        for container in pod["containers"]:
            if container.get("command") == ["zapstream"]:
                found.append((" ".join(container["args"]), pod, container))
    return found


def _files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """``<mountPath>/<path>`` -> (Secret name, key) of every Secret item the container mounts."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        sources = [s["secret"] for s in volume.get("projected", {}).get("sources", [])
                   if "secret" in s]  # fmt: skip
        if "secret" in volume:
            sources.append({**volume["secret"], "name": volume["secret"]["secretName"]})
        for secret in sources:
            for item in secret.get("items", []):
                files[f"{mount['mountPath']}/{item['path']}"] = (secret["name"], item["key"])
    return files


def test_one_kafka_user_per_kafka_client_with_exactly_the_acls_of_the_table(
    objects: list[dict[str, Any]],
) -> None:
    table = _table(objects)
    # No admin: Strimzi creates the topics; KEDA reads the worker group's lag.
    assert set(table) == {*KAFKA_CLIENTS, "keda"}
    users = {o["metadata"]["name"]: o for o in objects if o["kind"] == "KafkaUser"}
    assert set(users) == {access.user for access in table.values()}
    clusters = {
        o["metadata"]["labels"]["strimzi.io/cluster"]
        for o in objects
        if o["kind"] in ("KafkaTopic", "KafkaUser")
    }
    assert clusters == {kafka_users.CLUSTER}
    for access in table.values():
        spec = users[access.user]["spec"]
        assert spec["authentication"] == {"type": "scram-sha-512"}, access.user
        assert spec["authorization"]["type"] == "simple", access.user
        assert spec["authorization"]["acls"] == strimzi_acls(access), access.user
        # No create rights in prod: Strimzi's KafkaTopics create the contract's topics.
        for acl in spec["authorization"]["acls"]:
            if acl["resource"]["patternType"] == "literal":
                assert "Create" not in acl["operations"], (access.user, acl)


def test_every_kafka_client_logs_in_as_its_own_user_and_nothing_else_logs_in(
    objects: list[dict[str, Any]],
) -> None:
    table = _table(objects)
    seen: dict[str, str] = {}
    for command, pod, container in _containers(objects):
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        for source in container.get("envFrom", []):
            [config] = [
                o["data"]
                for o in objects
                if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == source["configMapRef"]["name"]
            ]
            env = {**config, **env}
        files = _files(pod, container)
        password = files.get(f"{env[SECRETS_DIR]}/ZAPSTREAM_KAFKA_SASL_PASSWORD")
        if command not in KAFKA_CLIENTS:
            assert "ZAPSTREAM_KAFKA_SASL_USERNAME" not in env, command
            assert password is None or password[0] == "zapstream-secrets", command
            continue
        user = table[command].user
        assert env["ZAPSTREAM_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", command
        assert env["ZAPSTREAM_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", command
        assert env["ZAPSTREAM_KAFKA_SASL_USERNAME"] == user, command
        # Strimzi's User Operator writes the user's password into a Secret of its name.
        assert password == (user, "password"), command
        assert files[env["ZAPSTREAM_KAFKA_SSL_CAFILE"]] == (
            f"{kafka_users.CLUSTER}-cluster-ca-cert",
            "ca.crt",
        ), command
        assert user not in seen, f"{command} and {seen.get(user)} share the Kafka user {user}"
        seen[user] = command
    assert sorted(seen.values()) == sorted(KAFKA_CLIENTS)


def test_the_kafka_users_file_is_generated_from_the_table() -> None:
    assert kafka_users.TARGET.read_text() == kafka_users.render(), (
        "k8s/overlays/prod/kafka-users.yaml is stale: run "
        "`.venv/bin/python -m devtools.deploy.kafka_users`"
    )


def test_keda_reads_the_worker_groups_lag_as_its_own_user(
    objects: list[dict[str, Any]],
) -> None:
    keda = _table(objects)["keda"]
    [auth] = [o for o in objects if o["kind"] == "TriggerAuthentication"]
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    login = refs.pop("username")
    assert refs == {
        "password": (keda.user, "password"),
        "ca": (f"{kafka_users.CLUSTER}-cluster-ca-cert", "ca.crt"),
    }
    [secret] = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == login[0]]
    assert base64.b64decode(secret["data"][login[1]]).decode() == keda.user
    [scaled] = [o for o in objects if o["kind"] == "ScaledObject"]
    kafka_triggers = [t for t in scaled["spec"]["triggers"] if t["type"] == "kafka"]
    assert kafka_triggers
    for trigger in kafka_triggers:
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}, trigger
        assert (trigger["metadata"]["sasl"], trigger["metadata"]["tls"]) == (
            "scram_sha512",
            "enable",
        )
        assert keda.allows(ResourceType.GROUP, trigger["metadata"]["consumerGroup"], DESCRIBE)
        assert keda.allows(ResourceType.TOPIC, trigger["metadata"]["topic"], DESCRIBE)
