"""What each Kafka client of zapstream may do on the cluster: the one table of its ACLs.

Every deployable that talks to Kafka runs as a Kafka user of its own (SASL, e.g. a Strimzi
``KafkaUser`` with ``scram-sha-512``), and that user is allowed exactly what the code does,
nothing more. This module is that table, read from the code:

================  ==========================================================================
component         what it does on Kafka
================  ==========================================================================
``relay``         writes intents, bulk intents, invalid rows and controls; with
                  ``ZAPSTREAM_RELAY_EXACTLY_ONCE`` also its transactional id
                  ``zapstream-relay.<slot>`` and the group of the same name, where its
                  position is committed as an offset on ``zapstream.controls``
                  (:mod:`connectors.cdc.transactions`), which needs Read on that topic
``worker``        the Faust app: reads intents, bulk intents and controls (group-less), reads
                  and writes its tables' changelogs (state, parked), writes results and dead
                  letters, joins its group (``ZAPSTREAM_WORKER_APP_ID``); creates and uses
                  Faust's own topics, named after the app id (the leader topic
                  ``<app id>-__assignor-__leader``); describes the state sink's group (the
                  dedup horizon, :mod:`streams.sink_progress`)
``sink``          reads state and invalid rows in its group, writes dead letters
``webhook``       writes receipts and commands (intents) and dead letters
``lag-monitor``   describes the watched groups, reads the oldest unconsumed record of their
                  topics (group-less)
``admin``         ``zapstream topics ensure`` and ``zapstream doctor``: creates and describes
                  the contract's topics. Not needed where topics are created otherwise
                  (Strimzi ``KafkaTopic``: :func:`access_table` with ``create_topics=False``)
``keda``          not zapstream's: KEDA's kafka scaler, which scales the workers on their
                  group's lag (``k8s/base/worker.yaml``): describes the worker's group and the
                  intent topics (``autoscaler=True``)
================  ==========================================================================

The console, ``zapstream db``, ``outbox`` and ``jobs`` commands use PostgreSQL only (the
console's commands reach Kafka through the outbox and the relay).

Every name comes from :class:`~streams.kernel.contract.TopicNames`, so a topic prefix
(``ZAPSTREAM_KAFKA_TOPIC_PREFIX``) is on every topic, group and transactional id. The table
gives (a) Kafka ACL bindings (:func:`acl_bindings`, for a broker's ``CreateAcls``: the test
broker, ``kafka-acls.sh``) and (b) Strimzi ``KafkaUser`` ``spec.authorization.acls`` entries
(:func:`strimzi_acls`). The idempotent producer needs no cluster ACL: since Kafka 3.0
(KIP-679) Write on a topic allows it.

Pure: no Kafka client, no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from streams.kernel.contract import TopicNames

DOCS = "docs/guides/security.md"
"""Where the table is explained to operators."""


class Operation(enum.StrEnum):
    """Kafka ACL operations (the names ``kafka-acls.sh`` and Strimzi use)."""

    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DESCRIBE = "Describe"


class ResourceType(enum.StrEnum):
    """Kafka ACL resource types, as Strimzi spells them (``kafka-acls.sh``: ``--topic`` ...)."""

    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactionalId"


class PatternType(enum.StrEnum):
    """A resource name matched exactly (``literal``) or as a prefix (``prefix``)."""

    LITERAL = "literal"
    PREFIX = "prefix"


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Resource:
    """A topic, group or transactional id, by exact name or by prefix."""

    type: ResourceType
    name: str
    pattern: PatternType = PatternType.LITERAL

    def __str__(self) -> str:
        kind = {"transactionalId": "transactional id"}.get(self.type.value, self.type.value)
        if self.pattern is PatternType.PREFIX:
            return f"{kind}s prefixed {self.name}"
        return f"{kind} {self.name}"


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ALLOW rule: ``principal`` may ``operation`` on ``resource`` from any host."""

    principal: str
    """``User:<name>``."""
    resource: Resource
    operation: Operation


def _topics(names: Iterable[str]) -> tuple[Resource, ...]:
    return tuple(Resource(ResourceType.TOPIC, n) for n in names)


@dataclasses.dataclass(frozen=True, slots=True)
class ComponentAccess:
    """What one Kafka client component does on the cluster, and so what its user may do.

    Topic and group names are the cluster's (the topic prefix applied). Reading or
    writing a topic implies describing it (its metadata): it is granted explicitly too.
    """

    component: str
    """The component (``relay``, ``worker`` ...): the ``zapstream`` command that runs it."""
    user: str
    """Its Kafka user (SASL username, ``KafkaUser`` name)."""
    reads: tuple[str, ...] = ()
    """Topics it fetches records from (in a group or group-less)."""
    writes: tuple[str, ...] = ()
    """Topics it produces to."""
    creates: tuple[str, ...] = ()
    """Topics it creates (and describes): ``zapstream topics ensure``."""
    describes: tuple[str, ...] = ()
    """Topics whose metadata and offsets only it reads (Describe): KEDA's lag."""
    groups: tuple[Resource, ...] = ()
    """Consumer groups it joins or commits offsets in (Read, Describe)."""
    describes_groups: tuple[str, ...] = ()
    """Other components' groups whose committed offsets it reads (Describe)."""
    transactional_ids: tuple[Resource, ...] = ()
    """Transactional ids it produces with (Write, Describe)."""
    own_topics: tuple[Resource, ...] = ()
    """Topics it creates and uses itself, outside the contract (Faust's): every operation
    it needs on them (Create, Read, Write, Describe)."""

    def topics(self) -> tuple[str, ...]:
        """Every contract topic it reads, writes or creates, each once, in order."""
        return tuple(dict.fromkeys((*self.reads, *self.writes, *self.creates, *self.describes)))

    def grants(self) -> dict[Resource, frozenset[Operation]]:
        """Resource -> the operations allowed on it."""
        out: dict[Resource, set[Operation]] = {}

        def allow(resources: Iterable[Resource], *ops: Operation) -> None:
            for resource in resources:
                out.setdefault(resource, set()).update(ops)

        allow(_topics(self.reads), Operation.READ, Operation.DESCRIBE)
        allow(_topics(self.writes), Operation.WRITE, Operation.DESCRIBE)
        allow(_topics(self.creates), Operation.CREATE, Operation.DESCRIBE)
        allow(_topics(self.describes), Operation.DESCRIBE)
        allow(self.groups, Operation.READ, Operation.DESCRIBE)
        allow((Resource(ResourceType.GROUP, g) for g in self.describes_groups), Operation.DESCRIBE)
        allow(self.transactional_ids, Operation.WRITE, Operation.DESCRIBE)
        allow(
            self.own_topics, Operation.CREATE, Operation.READ, Operation.WRITE, Operation.DESCRIBE
        )
        return {resource: frozenset(ops) for resource, ops in sorted(out.items())}

    def allows(self, resource_type: ResourceType, name: str, operation: Operation) -> bool:
        """Whether this component's user may ``operation`` on the resource named ``name``."""
        for resource, ops in self.grants().items():
            if resource.type is not resource_type or operation not in ops:
                continue
            if resource.name == name or (
                resource.pattern is PatternType.PREFIX and name.startswith(resource.name)
            ):
                return True
        return False

    def needs_line(self, topic: str) -> str:
        """What this component needs on ``topic``, in words (for a refusal's hint)."""
        ops = [op.value for op in (Operation.READ, Operation.WRITE, Operation.CREATE)
               if self.allows(ResourceType.TOPIC, topic, op)]  # fmt: skip
        return f"the {self.component} needs {' and '.join(ops) or 'Describe'} on topic {topic}"


COMPONENTS = ("relay", "worker", "sink", "webhook", "lag-monitor", "admin")
"""Every Kafka client component, in pipeline order; ``admin`` creates the topics."""

WORKER_APP_ID = "zapstream-worker"
"""``ZAPSTREAM_WORKER_APP_ID``'s default: the worker's group and its Faust topics' start."""
SINK_GROUP = "zapstream-state-sink"
"""``ZAPSTREAM_SINK_GROUP_ID``'s default (and the worker's ``DEDUP_SINK_GROUP``)."""
RELAY_TRANSACTIONS = "zapstream-relay."
"""The start of the relay's transactional id and position group: ``zapstream-relay.<slot>``
(:func:`connectors.cdc.transactions.transactional_id`), one per slot."""


def default_user(component: str) -> str:
    """The Kafka user of ``component``: ``zapstream-<component>`` (the ``KafkaUser``'s name)."""
    return f"zapstream-{component}"


def access_table(
    names: TopicNames,
    *,
    create_topics: bool = True,
    relay_exactly_once: bool = True,
    worker_app_id: str = WORKER_APP_ID,
    sink_group: str = SINK_GROUP,
    users: Mapping[str, str] | None = None,
    autoscaler: bool = False,
) -> dict[str, ComponentAccess]:
    """Component -> its access, every name under ``names``' prefix.

    ``create_topics``: an ``admin`` component creates the contract's topics (``zapstream
    topics ensure``); False where they are created otherwise (Strimzi ``KafkaTopic``): no
    admin user then. The worker creates Faust's own topics either way.
    ``relay_exactly_once``: the relay's transactional id and position group are granted
    (``ZAPSTREAM_RELAY_EXACTLY_ONCE`` may be turned on); False: the at-least-once relay's
    writes only. ``worker_app_id``, ``sink_group``: the worker's app id and the sink's group
    before the prefix (``ZAPSTREAM_WORKER_APP_ID``, ``ZAPSTREAM_SINK_GROUP_ID``).
    ``users``: component -> Kafka user, default :func:`default_user`. ``autoscaler``: a
    ``keda`` user for KEDA's kafka scaler (Kubernetes), which reads the worker group's lag.
    """
    n = names
    worker_group = n.group(worker_app_id)
    sink = n.group(sink_group)

    def user(component: str) -> str:
        return (users or {}).get(component) or default_user(component)

    relay_txn = Resource(
        ResourceType.TRANSACTIONAL_ID, n.group(RELAY_TRANSACTIONS), PatternType.PREFIX
    )
    relay_group = Resource(ResourceType.GROUP, n.group(RELAY_TRANSACTIONS), PatternType.PREFIX)
    table = [
        ComponentAccess(
            "relay",
            user("relay"),
            writes=(n.intents, n.bulk_intents, n.invalid, n.controls),
            # The exactly-once position: an offset committed on controls in a transaction.
            reads=(n.controls,) if relay_exactly_once else (),
            groups=(relay_group,) if relay_exactly_once else (),
            transactional_ids=(relay_txn,) if relay_exactly_once else (),
        ),
        ComponentAccess(
            "worker",
            user("worker"),
            reads=(n.intents, n.bulk_intents, n.controls, n.state, n.parked),
            writes=(n.state, n.parked, n.results, n.dead),
            groups=(Resource(ResourceType.GROUP, worker_group),),
            describes_groups=(sink,),
            # Faust's leader topic <app id>-__assignor-__leader, and any topic it names after
            # the app id: the "-" keeps another app id starting alike out.
            own_topics=(Resource(ResourceType.TOPIC, worker_group + "-", PatternType.PREFIX),),
        ),
        ComponentAccess(
            "sink",
            user("sink"),
            reads=(n.state, n.invalid),
            writes=(n.dead,),
            groups=(Resource(ResourceType.GROUP, sink),),
        ),
        ComponentAccess("webhook", user("webhook"), writes=(n.intents, n.dead)),
        ComponentAccess(
            "lag-monitor",
            user("lag-monitor"),
            reads=(n.intents, n.bulk_intents, n.state, n.invalid),
            describes_groups=(worker_group, sink),
        ),
    ]
    if create_topics:
        table.append(ComponentAccess("admin", user("admin"), creates=n.all()))
    if autoscaler:
        table.append(
            ComponentAccess(
                "keda",
                user("keda"),
                describes=(n.intents, n.bulk_intents),
                describes_groups=(worker_group,),
            )
        )
    return {access.component: access for access in table}


def acl_bindings(table: Mapping[str, ComponentAccess]) -> list[AclBinding]:
    """Every ALLOW binding of ``table``'s users, sorted: what a broker's ``CreateAcls`` gets."""
    return sorted(
        AclBinding(f"User:{access.user}", resource, op)
        for access in table.values()
        for resource, ops in access.grants().items()
        for op in ops
    )


_OPERATION_ORDER = tuple(Operation)


def strimzi_acls(access: ComponentAccess) -> list[dict[str, Any]]:
    """``access`` as a Strimzi ``KafkaUser``'s ``spec.authorization.acls`` (``type: simple``).

    One entry per resource, its operations in :class:`Operation` order (Strimzi's
    ``operations`` list), ``host: "*"``.
    """
    entries = []
    for resource, ops in access.grants().items():
        entries.append(
            {
                "resource": {
                    "type": resource.type.value,
                    "name": resource.name,
                    "patternType": resource.pattern.value,
                },
                "operations": [op.value for op in _OPERATION_ORDER if op in ops],
                "host": "*",
            }
        )
    return entries


def component_topics(component: str, names: TopicNames) -> tuple[str, ...]:
    """The contract topics ``component`` reads or writes (what its start-up check needs)."""
    return access_table(names)[component].topics()
