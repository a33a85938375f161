"""The table of every Kafka client's access (streams/kernel/kafka_access.py) and what it gives."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    NotLeaderForPartitionError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from pydantic import SecretStr

from connectors.cdc.settings import RelaySettings
from connectors.cdc.transactions import transactional_id
from connectors.sink.settings import SinkSettings
from streams.kernel.contract import TopicNames
from streams.kernel.failures import classify_kafka, is_transient
from streams.kernel.kafka_access import (
    COMPONENTS,
    AclBinding,
    Operation,
    PatternType,
    Resource,
    ResourceType,
    access_table,
    acl_bindings,
    strimzi_acls,
)
from streams.kernel.settings import (
    KafkaSecurityProtocol,
    KafkaSettings,
    LagMonitorSettings,
    SaslMechanism,
)
from streams.kernel.topics_check import acl_hidden_message, deployable_topic_specs
from streams.worker_settings import FAUST_TOPIC_SUFFIX, WorkerSettings

R, W, C, D = Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE
PREFIX = "staging-"


def topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name)


def grants(
    component: str, prefix: str = "", *, relay_exactly_once: bool = True
) -> dict[Resource, set[Operation]]:
    access = access_table(TopicNames(prefix), relay_exactly_once=relay_exactly_once)[component]
    return {resource: set(ops) for resource, ops in access.grants().items()}


def test_every_component_has_a_user_of_its_own() -> None:
    table = access_table(TopicNames())
    assert tuple(table) == COMPONENTS
    users = [access.user for access in table.values()]
    assert users == [f"zapstream-{c}" for c in COMPONENTS]
    assert "admin" not in access_table(TopicNames(), create_topics=False)


def test_the_relay_writes_what_it_produces_and_its_exactly_once_position() -> None:
    t = TopicNames(PREFIX)
    relay = RelaySettings(kafka=KafkaSettings(topic_prefix=PREFIX))
    txn = transactional_id(relay)  # the code's own name: zapstream-relay.<slot>, prefixed
    assert txn == f"{PREFIX}zapstream-relay.zapstream_outbox"
    assert grants("relay", PREFIX) == {
        topic(t.intents): {W, D},
        topic(t.bulk_intents): {W, D},
        topic(t.invalid): {W, D},
        # An offset committed in a transaction (the position) needs Read on its topic.
        topic(t.controls): {R, W, D},
        Resource(ResourceType.GROUP, f"{PREFIX}zapstream-relay.", PatternType.PREFIX): {R, D},
        Resource(ResourceType.TRANSACTIONAL_ID, f"{PREFIX}zapstream-relay.", PatternType.PREFIX): {
            W,
            D,
        },
    }
    access = access_table(t)["relay"]
    assert access.allows(ResourceType.TRANSACTIONAL_ID, txn, W)
    assert access.allows(ResourceType.GROUP, txn, R)
    assert not access.allows(ResourceType.TRANSACTIONAL_ID, "zapstream-relay.other", W)
    at_least_once = grants("relay", PREFIX, relay_exactly_once=False)
    assert at_least_once == {
        topic(t.intents): {W, D},
        topic(t.bulk_intents): {W, D},
        topic(t.invalid): {W, D},
        topic(t.controls): {W, D},
    }


def test_the_worker_reads_intents_and_controls_owns_its_changelogs_and_faust_topics() -> None:
    t = TopicNames(PREFIX)
    worker = WorkerSettings(kafka=KafkaSettings(topic_prefix=PREFIX))
    assert grants("worker", PREFIX) == {
        topic(t.intents): {R, D},
        topic(t.bulk_intents): {R, D},
        topic(t.controls): {R, D},
        topic(t.state): {R, W, D},
        topic(t.parked): {R, W, D},
        topic(t.results): {W, D},
        topic(t.dead): {W, D},
        Resource(ResourceType.GROUP, worker.group_id): {R, D},
        Resource(ResourceType.GROUP, worker.sink_group_id): {D},
        Resource(ResourceType.TOPIC, worker.group_id + "-", PatternType.PREFIX): {R, W, C, D},
    }
    access = access_table(t)["worker"]
    leader = worker.group_id + FAUST_TOPIC_SUFFIX  # Faust's leader topic
    assert access.allows(ResourceType.TOPIC, leader, C)
    assert not access.allows(ResourceType.TOPIC, t.invalid, D)
    assert not access.allows(ResourceType.TOPIC, t.intents, W)
    # No Create on the contract's topics: `topics ensure` (or Strimzi) creates them.
    assert not any(access.allows(ResourceType.TOPIC, name, C) for name in t.all())


def test_sink_webhook_lag_monitor_and_admin() -> None:
    t = TopicNames(PREFIX)
    sink = SinkSettings(kafka=KafkaSettings(topic_prefix=PREFIX))
    assert grants("sink", PREFIX) == {
        topic(t.state): {R, D},
        topic(t.invalid): {R, D},
        topic(t.dead): {W, D},
        Resource(ResourceType.GROUP, sink.consumer_group): {R, D},
    }
    assert grants("webhook", PREFIX) == {topic(t.intents): {W, D}, topic(t.dead): {W, D}}
    watched = LagMonitorSettings(kafka=KafkaSettings(topic_prefix=PREFIX)).watched()
    lag = grants("lag-monitor", PREFIX)
    assert lag == {
        **{topic(name): {R, D} for topics in watched.values() for name in topics},
        **{Resource(ResourceType.GROUP, group): {D} for group in watched},
    }
    assert grants("admin", PREFIX) == {topic(name): {C, D} for name in t.all()}


@pytest.mark.parametrize("deployable", ["relay", "worker", "sink", "webhook"])
def test_the_start_up_check_asks_for_the_topics_of_the_table(deployable: str) -> None:
    kafka = KafkaSettings(topic_prefix=PREFIX)
    access = access_table(kafka.names)[deployable]
    checked = {s.name for s in deployable_topic_specs(deployable, kafka)}
    assert checked == set(access.topics())
    for name in checked:
        assert access.allows(ResourceType.TOPIC, name, D)


def test_acl_bindings_are_one_per_operation_and_user() -> None:
    table = access_table(TopicNames(PREFIX))
    bindings = acl_bindings(table)
    assert bindings == sorted(bindings)
    assert len(bindings) == len(set(bindings))
    assert AclBinding("User:zapstream-webhook", topic(f"{PREFIX}zapstream.dead"), W) in bindings
    assert {b.principal for b in bindings} == {f"User:{a.user}" for a in table.values()}
    assert len(bindings) == sum(len(ops) for a in table.values() for ops in a.grants().values())


def test_strimzi_acls_name_resources_and_operations_as_the_crd_does() -> None:
    access = access_table(TopicNames(PREFIX))["sink"]

    def entry(kind: str, name: str, *operations: str) -> dict[str, object]:
        resource = {"type": kind, "name": PREFIX + name, "patternType": "literal"}
        return {"resource": resource, "operations": list(operations), "host": "*"}

    assert strimzi_acls(access) == [
        entry("group", "zapstream-state-sink", "Read", "Describe"),
        entry("topic", "zapstream.dead", "Write", "Describe"),
        entry("topic", "zapstream.invalid", "Read", "Describe"),
        entry("topic", "zapstream.state", "Read", "Describe"),
    ]
    worker = strimzi_acls(access_table(TopicNames(PREFIX))["worker"])
    faust = [e for e in worker if e["resource"]["patternType"] == "prefix"]
    faust_topics = {"type": "topic", "name": f"{PREFIX}zapstream-worker-", "patternType": "prefix"}
    operations = ["Read", "Write", "Create", "Describe"]
    assert faust == [{"resource": faust_topics, "operations": operations, "host": "*"}]


def test_keda_only_describes_the_worker_group_and_the_intent_topics() -> None:
    t = TopicNames(PREFIX)
    keda = access_table(t, autoscaler=True)["keda"]
    assert keda.user == "zapstream-keda"
    assert {r: set(ops) for r, ops in keda.grants().items()} == {
        topic(t.intents): {D},
        topic(t.bulk_intents): {D},
        Resource(ResourceType.GROUP, t.group("zapstream-worker")): {D},
    }
    assert "keda" not in access_table(t)


def test_users_can_be_named() -> None:
    table = access_table(TopicNames(), users={"relay": "cdc"})
    assert table["relay"].user == "cdc"
    assert table["worker"].user == "zapstream-worker"


@pytest.mark.parametrize(
    ("exc", "what"),
    [
        (TopicAuthorizationFailedError("zapstream.intents"), "a topic"),
        (GroupAuthorizationFailedError("zapstream-worker"), "a consumer group"),
        (ClusterAuthorizationFailedError(), "a cluster operation"),
        (TransactionalIdAuthorizationFailed(), "a transactional id"),
    ],
)
def test_an_acl_refusal_is_permanent_and_names_the_user_setting(
    exc: BaseException, what: str
) -> None:
    # aiokafka's errors are KafkaErrors, which were all transient: retried for ever.
    assert not is_transient(exc)
    failure = classify_kafka(exc)
    assert not failure.retriable
    assert failure.problem.startswith(f"Kafka's ACLs refuse {what} to this user (")
    assert "ZAPSTREAM_KAFKA_SASL_USERNAME" in failure.problem


def test_a_refused_login_is_permanent_and_a_broker_away_transient() -> None:
    assert not is_transient(SaslAuthenticationFailed("bad password"))
    assert not classify_kafka(SaslAuthenticationFailed("bad password")).retriable
    assert classify_kafka(KafkaConnectionError("gone")).retriable
    assert classify_kafka(NotLeaderForPartitionError()).retriable


def test_a_topic_the_user_cannot_see_names_the_user_and_what_is_needed() -> None:
    kafka = KafkaSettings(
        topic_prefix=PREFIX,
        security_protocol=KafkaSecurityProtocol.SASL_SSL,
        sasl_mechanism=SaslMechanism.SCRAM_SHA_512,
        sasl_username="zapstream-sink",
        sasl_password=SecretStr("never-shown"),
    )
    line = acl_hidden_message(
        kafka, [f"{PREFIX}zapstream.intents", f"{PREFIX}zapstream.dead"], "worker"
    )
    assert line.startswith(
        f"Kafka user zapstream-sink cannot see topic {PREFIX}zapstream.intents (and 1 more): "
    )
    assert "ZAPSTREAM_KAFKA_SASL_USERNAME" in line and "never-shown" not in line
    assert line.endswith(f"the worker needs Read on topic {PREFIX}zapstream.intents")
    state = acl_hidden_message(kafka, [f"{PREFIX}zapstream.state"], "worker")
    assert state.endswith(f"the worker needs Read and Write on topic {PREFIX}zapstream.state")
