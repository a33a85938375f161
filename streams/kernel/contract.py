"""The wire contract between the CDC relay and the stream processor.

Topic names, record schemas, header names, the partition key and the job
statuses live here and nowhere else. Both ``connectors/`` (relay, state sink,
webhook intake) and ``streams/`` (agents) import this module. It is pure: no
Faust, no Kafka client, no I/O, so importing it never builds an app or opens a
connection.

Records are frozen dataclasses serialised with orjson. Every record carries a
``schema`` string so a consumer can tell versions apart and send what it does
not understand to a dead-letter topic instead of guessing.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import orjson

# --- topics -----------------------------------------------------------------

INTENTS = "zapstream.intents"
"""New send intents (and, later, commands on them) keyed by instance and conversation."""
BULK_INTENTS = "zapstream.intents.bulk"
"""Intents of priority ``bulk`` (campaigns): the same key and partition count as
:data:`INTENTS`, so the worker's tables are co-partitioned with both, but read by an
agent of their own, so a campaign's backlog never delays an operational message.
Commands and receipts of bulk jobs travel on :data:`INTENTS`."""
RESULTS = "zapstream.results"
"""One :class:`AttemptFinished` per gateway attempt or decision. Append-only.

Produced only when the worker's ``ZAPSTREAM_WORKER_PUBLISH_ATTEMPTS`` is on (off by
default: nothing in zapstream reads it). The topic stays in the contract,
and is still created, because existing deployments have it and may have consumers of
their own."""
STATE = "zapstream.state"
"""Latest :class:`StatusChanged` per job (compacted). Changelog of the worker's job table."""
INVALID = "zapstream.invalid"
"""Outbox rows the relay could not turn into an intent, with the reason."""
DEAD = "zapstream.dead"
"""Jobs that exhausted their attempts or hit a poison record, with every error."""
PARKED = "zapstream.parked"
"""Changelog of the worker's parked conversations (compacted, co-partitioned with intents):
a :class:`ParkedConversation` per conversation key, an :class:`IntentCaptured` per message
key (the layout: :mod:`streams.parking`)."""
CONTROLS = "zapstream.controls"
"""Operators' pauses and resumes of an instance or a campaign (:class:`ControlChanged`,
from ``outbox_controls`` via CDC): one partition, compacted, keyed by
:func:`control_key`, so the latest action per target survives and every worker
reads all of them. Recipients' opt-outs and opt-ins (:class:`OptOutChanged`, from
``outbox_optouts``) travel here too, keyed by :func:`optout_key` (one key per instance
and person: compaction keeps the latest, so the topic holds one record per person ever
opted out, whatever the history)."""

# The constants above are the logical names: the names on the wire when
# ``ZAPSTREAM_KAFKA_TOPIC_PREFIX`` is empty (the default). A client always gets the
# names it uses from :class:`TopicNames` (``KafkaSettings.names``), never from them.

LOGICAL_TOPICS = (INTENTS, BULK_INTENTS, RESULTS, STATE, PARKED, INVALID, DEAD, CONTROLS)
"""Every topic of the contract, by its logical name."""

TOPIC_NAME_MAX = 249
"""Kafka's longest topic name (``org.apache.kafka.common.internals.Topic``)."""
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def topic_name_problem(prefix: str, longest_suffix: str) -> str | None:
    """Why ``prefix`` cannot start topic names (up to ``prefix + longest_suffix``), or None.

    Kafka's rules: ASCII letters, digits, ``.``, ``_`` and ``-`` only, at most
    :data:`TOPIC_NAME_MAX` characters.
    """
    bad = sorted({c for c in prefix if c not in _TOPIC_CHARS})
    if bad:
        shown = " ".join(repr(c) for c in bad)
        return f"has characters a Kafka topic name cannot hold ({shown}): use [a-zA-Z0-9._-]"
    longest = prefix + longest_suffix
    if len(longest) > TOPIC_NAME_MAX:
        return (
            f"is too long: {longest[:20]}... would be {len(longest)} characters, "
            f"Kafka allows {TOPIC_NAME_MAX}"
        )
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class TopicNames:
    """The names of zapstream's topics and consumer groups in one namespace.

    ``prefix`` (``ZAPSTREAM_KAFKA_TOPIC_PREFIX``) is prepended verbatim to every topic
    of the contract and to every consumer group id and Faust app id (so Faust's own
    topics follow), so deployments sharing a cluster (staging and production,
    tenants, test modules) share no topic, group or offset. The empty prefix gives the
    logical names (:data:`INTENTS` ...). An invalid prefix raises ``ValueError``.
    """

    prefix: str = ""
    intents: str = dataclasses.field(init=False)
    bulk_intents: str = dataclasses.field(init=False)
    results: str = dataclasses.field(init=False)
    state: str = dataclasses.field(init=False)
    parked: str = dataclasses.field(init=False)
    invalid: str = dataclasses.field(init=False)
    dead: str = dataclasses.field(init=False)
    controls: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        problem = topic_name_problem(self.prefix, max(LOGICAL_TOPICS, key=len))
        if problem is not None:
            raise ValueError(f"topic prefix {self.prefix[:40]!r} {problem}")
        for field, logical in zip(_NAME_FIELDS, LOGICAL_TOPICS, strict=True):
            object.__setattr__(self, field, self.prefix + logical)

    def topic(self, logical: str) -> str:
        """The name of the topic ``logical`` (one of :data:`LOGICAL_TOPICS`) here."""
        if logical not in LOGICAL_TOPICS:
            raise ValueError(f"{logical!r} is no topic of the contract")
        return self.prefix + logical

    def group(self, logical: str) -> str:
        """A consumer group id or Faust app id (``zapstream-worker``) in this namespace."""
        return self.prefix + logical

    def intents_for(self, priority: str) -> str:
        """The topic an intent of ``priority`` travels on."""
        return self.bulk_intents if priority == Priority.BULK else self.intents

    def all(self) -> tuple[str, ...]:
        """Every topic of the contract, in :data:`LOGICAL_TOPICS` order."""
        return tuple(self.prefix + logical for logical in LOGICAL_TOPICS)

    def by_logical(self) -> dict[str, str]:
        """Logical name -> name here, for code that routes by the logical name."""
        return {logical: self.prefix + logical for logical in LOGICAL_TOPICS}


_NAME_FIELDS = ("intents", "bulk_intents", "results", "state", "parked", "invalid", "dead",
                "controls")  # fmt: skip

DEFAULT_NAMES = TopicNames()
"""The names without a prefix (the logical names)."""

# Headers set on every record the relay produces.
HEADER_SCHEMA = "zapstream-schema"
HEADER_LSN = "zapstream-lsn"
HEADER_JOB_ID = "zapstream-job-id"


class JobStatus(enum.StrEnum):
    """Where a job is. Stored as text in ``outbox_jobs.status`` and on the state topic."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    """Due later (``next_retry_at``, ``send_at``, or held for quiet hours): waits in
    PostgreSQL, not in Kafka, until the relay's release loop releases it as PENDING."""
    ATTEMPTING = "ATTEMPTING"
    ACCEPTED = "ACCEPTED"
    DELIVERED = "DELIVERED"
    READ = "READ"
    RETRY_WAIT = "RETRY_WAIT"
    FAILED = "FAILED"
    DEAD = "DEAD"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"
    UNCERTAIN = "UNCERTAIN"
    REVIEW = "REVIEW"
    INVALID = "INVALID"
    """The relay rejected the outbox row (``zapstream.invalid``); terminal, never sent."""
    OPTED_OUT = "OPTED_OUT"
    """The recipient opted out (``outbox_optouts``, or the gateway said so: Meta's 131050);
    terminal, never sent (again). The reason says which."""


class CommandOutcome(enum.StrEnum):
    """How the worker answered a command: ``StatusChanged.outcome`` with its ``command_id``.

    Operators' tools match on these values, never on the free-text reason.
    """

    CANCELLED = "cancelled"
    CANCEL_REFUSED = "cancel_refused"
    """The job is past cancelling (sent, settled) or the gateway refused."""
    CANCEL_UNSUPPORTED = "cancel_unsupported"
    """The gateway cannot cancel an accepted message."""
    CANCEL_FAILED = "cancel_failed"
    """The gateway's cancel call failed; the job keeps its state."""
    REPROCESSED = "reprocessed"
    """A new round of attempts begins (the moves that follow carry its outcome)."""
    REPROCESS_REFUSED = "reprocess_refused"


class Priority(enum.StrEnum):
    """Operational traffic (codes, confirmations) versus bulk (campaigns)."""

    OPERATIONAL = "operational"
    BULK = "bulk"


_PRIORITIES = frozenset(p.value for p in Priority)


class AttemptOutcome(enum.StrEnum):
    """How one attempt (or a decision not to attempt) ended."""

    ACCEPTED = "accepted"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    UNCERTAIN = "uncertain"
    REVIEW = "review"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    OPTED_OUT = "opted_out"


# --- partitioning -------------------------------------------------------------


def conversation_partition_key(instance_id: str, conversation_key: str) -> bytes:
    """The Kafka key of every record about a conversation.

    All intents of one conversation on one WhatsApp instance share this key, so
    the producer's murmur2 partitioner puts them in one partition, in order.
    """
    return f"{instance_id}\x1f{conversation_key}".encode()


def job_state_key(job_id: int) -> bytes:
    """Key of a job on the state topic (and in the worker's job table)."""
    return str(job_id).encode()


# --- records -------------------------------------------------------------------

R = TypeVar("R", bound="Record")

_SCHEMA_SUFFIX: dict[type, bytes] = {}
"""Per record class: its ``"schema":"..."}`` ending, encoded once."""


class ContractError(ValueError):
    """Bytes that do not decode into the record the topic promises."""


MAX_ATTEMPTS = 100
"""The most attempts one job may ask for: past it a typo (``max_attempts=1e9``) would retry
a message for ever against a gateway that refuses it."""

INSTANCE_ID_MAX = 64
"""The longest instance id (the outbox article's ``VARCHAR(64)``)."""
_INSTANCE_ID = re.compile(r"[A-Za-z0-9._~:@+-]{1,64}", re.ASCII)

CANONICAL_RECIPIENT = re.compile(
    r"[1-9]\d{7,14}(@s\.whatsapp\.net|@c\.us)?|\d{5,30}(-\d{1,20})?@g\.us", re.ASCII
)
"""A recipient as the outbox rules normalise it (:mod:`connectors.outbox.recipients`):
a phone number's digits with its country code, or a person's or group's JID."""


def instance_id_problem(value: object) -> str | None:
    """Why ``value`` cannot be an instance id, or None.

    An instance id is a path segment of the gateway's URL (``/v1/instances/{id}/...``)
    and a label on metrics and log lines: ASCII letters, digits and ``. _ ~ : @ + -``,
    1 to 64 of them, and never ``.`` or ``..`` (a URL library would resolve them and
    call another path). The value is never quoted whole: it may hold control characters.
    """
    if not isinstance(value, str):
        return f"instance_id must be a string, not {type(value).__name__}"
    if _INSTANCE_ID.fullmatch(value) and value not in (".", ".."):
        return None
    shown = value[:20].encode("unicode_escape").decode("ascii").replace("'", "\\'")
    return (
        f"instance_id '{shown}' is not 1 to "
        f"{INSTANCE_ID_MAX} of A-Z a-z 0-9 . _ ~ : @ + - (and not . or ..)"
    )


_JSON_KINDS: dict[Any, tuple[type, ...]] = {
    int: (int,), float: (float, int), str: (str,), bool: (bool,), type(None): (type(None),),
}  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldCheck:
    """How one field of a record is checked: the JSON types it accepts (``exact``, the
    fast path; a ``str`` subclass such as a :class:`Priority` also passes), and for a
    list or object the check of its items."""

    name: str
    exact: frozenset[type]
    items: Callable[[Any], bool] | None
    expected: str

    def accepts(self, value: Any) -> bool:
        kind = type(value)
        if kind not in self.exact:
            # bool is an int to Python, never to the contract.
            if kind is bool or not isinstance(value, tuple(self.exact)):
                return False
        return self.items is None or value is None or self.items(value)


def _field_check(name: str, hint: Any) -> _FieldCheck:
    """The check of a field annotated ``hint``: JSON gives ``int``, ``float``, ``str``,
    ``bool``, ``None``, ``list`` and ``dict``; the records use those, ``Any``, ``list[str]``,
    ``dict[str, ...]`` and their ``| None``."""
    if hint is Any:
        return _FieldCheck(name, frozenset(), None, "anything")
    args = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (types.UnionType, typing.Union)
        else (hint,)
    )
    exact: set[type] = set()
    items: Callable[[Any], bool] | None = None
    names = []
    for arg in args:
        origin = typing.get_origin(arg)
        if origin is list:
            exact.add(list)
            items = _items_check(typing.get_args(arg)[0], list)
            names.append("a list")
        elif origin is dict:
            exact.add(dict)
            items = _items_check(typing.get_args(arg)[1], dict)
            names.append("an object")
        elif arg in _JSON_KINDS:
            exact.update(_JSON_KINDS[arg])
            names.append(_json_kind(arg()) if arg is not type(None) else "null")
        else:
            raise TypeError(f"no JSON check for the record field type {hint!r}")
    return _FieldCheck(name, frozenset(exact), items, " or ".join(names))


def _items_check(item: Any, container: type) -> Callable[[Any], bool] | None:
    """The check of a list's items or an object's keys and values (None: any item)."""
    if item is Any:
        if container is dict:
            return lambda v: all(type(k) is str for k in v)
        return None
    check = _field_check("item", item)
    if container is dict:
        return lambda v: all(type(k) is str and check.accepts(x) for k, x in v.items())
    return lambda v: all(check.accepts(x) for x in v)


_FIELD_CHECKS: dict[type, tuple[_FieldCheck, ...]] = {}
"""Per record class: the check of every field, built once."""


def _field_checks(cls: type) -> tuple[_FieldCheck, ...]:
    checks = _FIELD_CHECKS.get(cls)
    if checks is None:
        hints = typing.get_type_hints(cls)
        checks = _FIELD_CHECKS[cls] = tuple(
            _field_check(f.name, hints[f.name]) for f in dataclasses.fields(cls)
        )
    return checks


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """Base of every record on a zapstream topic."""

    SCHEMA: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["schema"] = self.SCHEMA
        return data

    def dumps(self) -> bytes:
        """The record as JSON: its fields in declaration order, then ``schema``.

        Byte for byte what ``orjson.dumps(self.to_dict())`` gives, ten times
        cheaper: orjson serialises the dataclass natively (no ``asdict`` deep
        copy) and the ``schema`` member is spliced in before the closing brace.
        """
        body = orjson.dumps(self)
        suffix = _SCHEMA_SUFFIX.get(type(self))
        if suffix is None:
            suffix = _SCHEMA_SUFFIX[type(self)] = b'"schema":' + orjson.dumps(self.SCHEMA) + b"}"
        if body == b"{}":
            return b"{" + suffix
        return body[:-1] + b"," + suffix

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        schema = data.get("schema")
        if schema != cls.SCHEMA:
            raise ContractError(f"expected schema {cls.SCHEMA!r}, got {schema!r}")
        values = {}
        for check in _field_checks(cls):
            name = check.name
            if name in data:
                value = data[name]
                if check.exact and not check.accepts(value):
                    # The value is never quoted: it may be a phone number or a text.
                    raise ContractError(
                        f"{cls.SCHEMA}: {name} must be {check.expected}, not {_json_kind(value)}"
                    )
                values[name] = value
        try:
            record = cls(**values)
        except TypeError as exc:
            raise ContractError(f"{cls.SCHEMA}: {exc}") from exc
        problem = record.problem()
        if problem is not None:
            raise ContractError(f"{cls.SCHEMA}: {problem}")
        return record

    def problem(self) -> str | None:
        """Why this record breaks its schema's rules beyond its fields' types, or None.

        A record read from Kafka is checked before anything acts on it: a producer
        other than zapstream's (or a bug) must not make the worker send, cancel or
        settle what the contract does not allow.
        """
        return None

    @classmethod
    def loads(cls: type[R], raw: bytes | str) -> R:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ContractError(f"{cls.SCHEMA}: not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ContractError(f"{cls.SCHEMA}: not a JSON object")
        return cls.from_dict(data)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IntentCaptured(Record):
    """A new outbox row, validated and normalised by the relay."""

    SCHEMA: ClassVar[str] = "zapstream.intent.v1"

    job_id: int
    instance_id: str
    conversation_key: str
    idempotency_key: str
    message_type: str
    to: str
    text: str
    priority: str = Priority.OPERATIONAL
    purpose: str | None = None
    expires_at: str | None = None
    max_attempts: int = 5
    created_at: str | None = None
    committed_at: str | None = None
    """Commit timestamp of the outbox transaction (ISO 8601), for commit-to-gateway latency."""
    lsn: str = "0/0"
    """End LSN of the outbox transaction, for tracing a record back to the WAL."""
    template: dict[str, Any] | None = None
    """The Cloud API template object (``{"name", "language": {"code"}, "components"}``):
    what a ``template`` intent sends, or, on a ``text`` intent, its fallback template, sent
    instead when Meta answers that the customer-service window is closed (131047); None for
    a plain text (and in records from before templates). See :mod:`streams.kernel.templates`."""
    respect_opt_out: bool | None = None
    """Whether the recipient's opt-out stops this job (the payload's ``respect_opt_out``):
    None (the default) means by priority: a bulk job is never sent to an opted-out
    recipient, an operational one is (:func:`opt_out_applies`)."""
    timezone: str | None = None
    """The recipient's IANA timezone (payload key ``timezone``), for quiet hours; None:
    derived from the number's country code."""

    @property
    def partition_key(self) -> bytes:
        return conversation_partition_key(self.instance_id, self.conversation_key)

    def problem(self) -> str | None:
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            return f"max_attempts must be from 1 to {MAX_ATTEMPTS}"
        if self.priority not in _PRIORITIES:
            return "priority must be one of " + ", ".join(sorted(_PRIORITIES))
        if not CANONICAL_RECIPIENT.fullmatch(self.to):
            return "to is not a normalised recipient (digits with country code, or a JID)"
        if not self.text or not self.message_type or not self.conversation_key:
            return "text, message_type and conversation_key must not be empty"
        if self.message_type == "template" and not self.template:
            return "a template intent needs its template"
        return instance_id_problem(self.instance_id)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IntentRejected(Record):
    """An outbox row that cannot become an intent. Published to :data:`INVALID`."""

    SCHEMA: ClassVar[str] = "zapstream.invalid.v1"

    job_id: int | None
    reason: str
    row: dict[str, str | None]
    """Every column of the row as PostgreSQL's text output, so nothing is lost."""
    lsn: str = "0/0"
    committed_at: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFinished(Record):
    """The outcome of one attempt to hand a job to the gateway. Published to :data:`RESULTS`."""

    SCHEMA: ClassVar[str] = "zapstream.attempt.v1"

    job_id: int
    idempotency_key: str
    instance_id: str
    conversation_key: str
    attempt: int
    attempt_id: str
    outcome: str
    gateway: str
    gateway_job_id: str | None = None
    gateway_status: str | None = None
    error: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    committed_at: str | None = None
    reference: str | None = None
    """The reference the gateway was told (``<job>-<seq>-<tag>``,
    :mod:`streams.kernel.attempt_reference`); None in records from before it was sent."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StatusChanged(Record):
    """A job's latest state. Published to :data:`STATE` (compacted), keyed by job id."""

    SCHEMA: ClassVar[str] = "zapstream.status.v1"

    job_id: int
    idempotency_key: str
    instance_id: str
    conversation_key: str
    status: str
    previous: str
    version: int
    attempts: int = 0
    gateway_job_id: str | None = None
    reason: str | None = None
    actor: str = "worker"
    at: str = ""
    sent_at: str | None = None
    attempt_id: str | None = None
    """The attempt in progress or last made (the ``Idempotency-Key`` the gateway saw)."""
    next_retry_at: str | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    """Every failed attempt's error in this round, oldest first (what DEAD reports)."""
    attempt_seq: int = 0
    """Attempts ever made, across reprocessing: numbers attempt ids (``<job>-<seq>``).
    ``attempts`` counts this round's attempts against ``max_attempts``."""
    receipt_events: list[str] = dataclasses.field(default_factory=list)
    """Event ids of the last receipts applied (oldest first, bounded): a receipt whose
    event id is here is a duplicate and changes nothing."""
    outcome: str | None = None
    """Set on the record that answers a command (:class:`CommandOutcome`), else None."""
    command_id: int | None = None
    """The ``outbox_commands`` id this record answers, with ``outcome``."""
    reconciling_since: str | None = None
    """While an ATTEMPTING job's outcome is being reconciled: when that began (ISO 8601),
    for the bound ``ZAPSTREAM_WORKER_RECONCILE_MAX_WAIT_S``; None otherwise."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CommandRequested(Record):
    """An application or operator command on a job, from ``outbox_commands`` via CDC.

    Published to :data:`INTENTS` with the job's conversation key, so it is
    serialised with the job's intent and every other change of its conversation.
    """

    SCHEMA: ClassVar[str] = "zapstream.command.v1"

    command_id: int
    command: str
    """``cancel`` or ``reprocess`` (:class:`Command`)."""
    job_id: int
    idempotency_key: str
    instance_id: str
    conversation_key: str
    reason: str
    actor: str
    requested_at: str | None = None
    intent: dict[str, Any] | None = None
    """For ``reprocess``: the job's intent (an :class:`IntentCaptured` dict) to send again."""
    lsn: str = "0/0"

    @property
    def partition_key(self) -> bytes:
        return conversation_partition_key(self.instance_id, self.conversation_key)


class Command(enum.StrEnum):
    CANCEL = "cancel"
    REPROCESS = "reprocess"


class ControlKind(enum.StrEnum):
    """What a control holds: one WhatsApp instance, or one campaign (the jobs' ``purpose``)."""

    INSTANCE = "instance"
    CAMPAIGN = "campaign"


class ControlAction(enum.StrEnum):
    PAUSE = "pause"
    RESUME = "resume"


def control_key(kind: str, target: str) -> bytes:
    """Key of a control on :data:`CONTROLS`: ``b"<kind>:<target>"``; compaction keeps the latest."""
    return f"{kind}:{target}".encode()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ControlChanged(Record):
    """An operator paused or resumed an instance or a campaign. Published to :data:`CONTROLS`.

    From an ``outbox_controls`` row via CDC. The latest record per key is the
    target's state: paused while its ``action`` is ``pause``.
    """

    SCHEMA: ClassVar[str] = "zapstream.control.v1"

    kind: str
    """``instance`` or ``campaign`` (:class:`ControlKind`)."""
    target: str
    """The instance id, or the campaign's ``purpose``."""
    action: str
    """``pause`` or ``resume`` (:class:`ControlAction`)."""
    reason: str
    actor: str
    at: str | None
    """When the control was written (``outbox_controls.created_at``, ISO 8601)."""
    control_id: int
    """``outbox_controls.id``: later controls of a target have higher ids."""
    lsn: str = "0/0"
    """End LSN of the transaction that wrote it, for tracing a record back to the WAL."""

    @property
    def partition_key(self) -> bytes:
        return control_key(self.kind, self.target)


class OptOutAction(enum.StrEnum):
    """A recipient stops (``out``) or starts again (``in``) getting an instance's bulk messages."""

    OUT = "out"
    IN = "in"


class OptOutSource(enum.StrEnum):
    """Who recorded an opt-out: the application (a STOP reply), Meta (error 131050), an operator."""

    APP = "app"
    META = "meta"
    OPERATOR = "operator"


def opt_out_person(recipient: str) -> str:
    """Who an opt-out is about, from a normalised recipient: a person's digits (``5511987654321``
    and ``5511987654321@s.whatsapp.net`` are the same person) or a group's JID. Agrees with
    ``connectors.outbox.recipients.conversation_key_for`` and ``zapstream_conversation_key()``."""
    if recipient.endswith("@g.us"):
        return recipient
    return recipient.split("@", 1)[0]


def opt_out_applies(priority: str, respect_opt_out: bool | None) -> bool:
    """Whether an opt-out stops a job: the application's word, else bulk yes, operational no."""
    if respect_opt_out is not None:
        return respect_opt_out
    return priority == Priority.BULK


def optout_key(instance_id: str, person: str) -> bytes:
    """Key of an opt-out on :data:`CONTROLS`: ``b"optout:<instance>\\x1f<person>"``; compaction
    keeps the latest per instance and person (no clash with :func:`control_key`'s kinds)."""
    return f"optout:{instance_id}\x1f{person}".encode()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OptOutChanged(Record):
    """A recipient opted out of (or back into) an instance's messages. On :data:`CONTROLS`.

    From an ``outbox_optouts`` row via CDC. The latest record per key is the person's
    state: opted out while its ``action`` is ``out``.
    """

    SCHEMA: ClassVar[str] = "zapstream.optout.v1"

    instance_id: str
    person: str
    """The recipient as :func:`opt_out_person` gives it (digits, or a group JID)."""
    action: str
    """``out`` or ``in`` (:class:`OptOutAction`)."""
    source: str
    """``app``, ``meta`` or ``operator`` (:class:`OptOutSource`)."""
    reason: str
    at: str | None
    """When it was written (``outbox_optouts.created_at``, ISO 8601)."""
    optout_id: int
    """``outbox_optouts.id``: later changes of a person have higher ids."""
    lsn: str = "0/0"

    @property
    def partition_key(self) -> bytes:
        return optout_key(self.instance_id, self.person)

    def problem(self) -> str | None:
        if self.action not in _OPT_OUT_ACTIONS:
            return "action must be out or in"
        if opt_out_person(self.person) != self.person or not CANONICAL_RECIPIENT.fullmatch(
            self.person
        ):
            return "person is not a normalised recipient's digits or a group JID"
        return instance_id_problem(self.instance_id)


_OPT_OUT_ACTIONS = frozenset(a.value for a in OptOutAction)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptReceived(Record):
    """A gateway status callback (sent/delivered/read/failed), verified and looked up.

    Published to :data:`INTENTS` by the webhook intake with the job's conversation
    key; the worker applies it monotonically (a late "sent" never downgrades "read").
    """

    SCHEMA: ClassVar[str] = "zapstream.receipt.v1"

    event_id: str
    """The gateway's event id, or a digest of (gateway job id, label) when it has none."""
    job_id: int
    idempotency_key: str
    instance_id: str
    conversation_key: str
    gateway: str
    """The gateway the callback came from: the last segment of the webhook path."""
    gateway_job_id: str
    label: str
    """The gateway's own label, as received."""
    status: str
    """Our mapping of ``label`` (:class:`JobStatus`); REVIEW when the label is unknown."""
    received_at: str = ""
    reference: str | None = None
    """The callback's ``reference``: the attempt reference (``<job>-<seq>-<tag>``,
    :mod:`streams.kernel.attempt_reference`) the gateway was told, when it echoes it. A
    receipt about another attempt than the job's current one, or whose reference does not
    verify for its gateway and instance, changes nothing (:mod:`streams.receipts`)."""
    reason: str | None = None
    """Why the gateway failed the message (Meta's error code, title and details, masked),
    when it said; ``None`` otherwise."""
    phone_number_id: str | None = None
    """Meta only: the notification's ``metadata.phone_number_id``, the business number the
    status is about; it must be the job's instance. None for other gateways (and in
    receipts from before it was carried, which then do not bind for Meta)."""

    @property
    def partition_key(self) -> bytes:
        return conversation_partition_key(self.instance_id, self.conversation_key)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobDead(Record):
    """A job that will not be attempted again, with every attempt's error. On :data:`DEAD`."""

    SCHEMA: ClassVar[str] = "zapstream.dead.v1"

    job_id: int | None
    idempotency_key: str | None
    reason: str
    errors: list[str] = dataclasses.field(default_factory=list)
    record: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ParkedConversation(Record):
    """A parked conversation on :data:`PARKED`: its partition, when its head is due, its
    instance and the range of its messages (keys and layout: :mod:`streams.parking`).

    Positional, unlike the other records: the worker builds one for every park and
    postpone. Records written before the schema existed (no ``schema`` member, written by
    earlier workers) decode as this version; the record is compacted, so they go as their
    conversations are rewritten.
    """

    SCHEMA: ClassVar[str] = "zapstream.parked.v1"

    partition: int
    due: float
    """When the head is due again (epoch seconds)."""
    instance: str
    first: int
    """Sequence number of the head message."""
    next: int
    """Sequence number the next appended message gets."""

    @property
    def messages(self) -> int:
        """Messages parked, the head included."""
        return self.next - self.first

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParkedConversation:
        # Earlier workers wrote the record without a schema: it is this version's layout.
        schema = data.get("schema", cls.SCHEMA)
        if schema != cls.SCHEMA:
            raise ContractError(f"expected schema {cls.SCHEMA!r}, got {schema!r}")
        try:
            return cls(
                int(data["partition"]),
                float(data["due"]),
                str(data["instance"]),
                int(data["first"]),
                int(data["next"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ContractError(f"{cls.SCHEMA}: {exc!r}") from exc


def _json_kind(value: object) -> str:
    """``value``'s JSON kind, for an error message that must not quote it."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)  # fmt: skip


def decode_topic_record(raw: bytes) -> Record:
    """Decode any zapstream record by its ``schema`` field."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ContractError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ContractError("not a JSON object")
    schema = data.get("schema")
    for cls in (
        IntentCaptured,
        IntentRejected,
        AttemptFinished,
        StatusChanged,
        JobDead,
        CommandRequested,
        ReceiptReceived,
        ControlChanged,
        OptOutChanged,
        ParkedConversation,
    ):
        if cls.SCHEMA == schema:
            return cls.from_dict(data)
    raise ContractError(f"unknown schema {schema!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class TopicSpec:
    """How a topic is created: partitions and configs (Kafka semantics)."""

    name: str
    partitions: int
    configs: Mapping[str, str]


def intents_topic(priority: str) -> str:
    """The logical topic an intent of ``priority`` travels on (:meth:`TopicNames.intents_for`
    gives its name under a prefix)."""
    return BULK_INTENTS if priority == Priority.BULK else INTENTS


def topic_specs(
    partitions: int,
    changelog_topics: tuple[str, ...] = (),
    *,
    names: TopicNames = DEFAULT_NAMES,
) -> list[TopicSpec]:
    """Every topic zapstream uses, with explicit partition counts, named by ``names``.

    The intents topic, the state topic and every Faust changelog must have the
    same partition count: the worker's tables are co-partitioned with intents.
    ``min.compaction.lag.ms`` keeps each state transition readable by the state
    sink for an hour before compaction may fold it away.
    """
    compacted = {"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"}
    week = {"cleanup.policy": "delete", "retention.ms": str(7 * 24 * 3600 * 1000)}
    n = names
    specs = [
        TopicSpec(n.intents, partitions, week),
        TopicSpec(n.bulk_intents, partitions, week),
        TopicSpec(n.results, partitions, week),
        TopicSpec(n.state, partitions, compacted),
        TopicSpec(n.parked, partitions, compacted),
        TopicSpec(n.invalid, 1, {"cleanup.policy": "delete", "retention.ms": "-1"}),
        TopicSpec(n.dead, 1, {"cleanup.policy": "delete", "retention.ms": "-1"}),
        # No min.compaction.lag: only the latest control per target matters.
        TopicSpec(n.controls, 1, {"cleanup.policy": "compact"}),
    ]
    specs.extend(TopicSpec(name, partitions, compacted) for name in changelog_topics)
    return specs
