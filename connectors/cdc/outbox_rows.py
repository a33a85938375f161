"""Turn an outbox row (jobs, commands, replays, controls), as pgoutput delivers it, into a record.

pgoutput gives every column as PostgreSQL's text output (``None`` for NULL).
A row that cannot become an intent (payload not an object, unknown type,
missing recipient, ...) becomes an :class:`~streams.kernel.contract.IntentRejected`
carrying the whole row and the reason: the relay publishes it to
``zapstream.invalid`` and moves on, so one bad row never stops the stream.
The intent rules are :mod:`connectors.outbox.rules`, the ones
:func:`~connectors.outbox.enqueue.enqueue` applies before the INSERT.
An ``outbox_commands`` row becomes a :class:`~streams.kernel.contract.CommandRequested`
(:func:`command_row_to_record`), an ``outbox_controls`` row a
:class:`~streams.kernel.contract.ControlChanged` (:func:`control_row_to_record`), an
``outbox_optouts`` row an :class:`~streams.kernel.contract.OptOutChanged`
(:func:`optout_row_to_record`), or likewise a rejection.

The relay's hot path takes :func:`row_to_intent`: the same validation, but the
intent comes as a :class:`CapturedIntent`, its JSON object built directly (byte
for byte ``IntentCaptured(...).dumps()``) without the frozen dataclass, whose
construction and encoding cost more than the validation itself.

Size before parse: a row with a column whose text is longer than the relay's
``ZAPSTREAM_RELAY_MAX_RECORD_BYTES`` is never parsed. Its decoder leaves such a
value undecoded (:attr:`connectors.cdc.pgoutput.Insert.oversized`: its size and a
head) and the row becomes :func:`oversized_rejection`, an ``IntentRejected`` whose
reason names the column, its size and the setting, and whose row copy carries the
other columns and the value's head, cut with :data:`TRUNCATION_MARKER`. The job
ends INVALID; it is not sent without its extra data, even when ``type``/``to``/
``text`` alone would make a valid intent: finding them would mean parsing the
value (a JSON parser holds ~30 bytes of Python objects per byte of input), and
a payload that large is a bug in the application, which the operator should see.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Mapping
from typing import Any

import orjson

from connectors.cdc.pgoutput import OversizedValue
from connectors.outbox.recipients import conversation_key_for
from connectors.outbox.rules import (
    RuleViolation,
    check_instance_id,
    check_max_attempts,
    check_message_type,
    check_priority,
    check_recipient,
    check_respect_opt_out,
    check_template,
    check_timezone,
    require_text,
    required,
)
from streams.kernel.contract import (
    CANONICAL_RECIPIENT,
    Command,
    CommandRequested,
    ControlAction,
    ControlChanged,
    ControlKind,
    IntentCaptured,
    IntentRejected,
    JobStatus,
    OptOutAction,
    OptOutChanged,
    OptOutSource,
    Priority,
    conversation_partition_key,
    intents_topic,
    opt_out_person,
)
from streams.kernel.templates import TEMPLATE, template_summary


class _Reject(Exception):
    """The row cannot be decoded; intent rules raise :class:`RuleViolation` instead."""


def _timestamp(value: str | None) -> str | None:
    """PostgreSQL's timestamptz text (``2026-11-29 15:52:57.1+00``) as ISO 8601."""
    if value is None:
        return None
    return _iso_timestamp(value)


@functools.lru_cache(maxsize=1024)
def _iso_timestamp(value: str) -> str:
    # Cached: the rows of one transaction usually share created_at (now() is the
    # transaction's start), so most rows skip the parse. A _Reject is not cached.
    text = value.strip()
    # Python wants "+00:00" where PostgreSQL may print "+00".
    if len(text) >= 3 and text[-3] in "+-" and text[-2:].isdigit():
        text += ":00"
    try:
        return dt.datetime.fromisoformat(text).isoformat()
    except ValueError as exc:
        raise _Reject(f"unreadable timestamp {value!r}") from exc


@functools.lru_cache(maxsize=4096)
def _cached_recipient(value: str) -> str:
    return check_recipient(value)


def _recipient(value: object) -> str:
    # Cached per text (conversations repeat); a violation is raised again, never cached.
    return _cached_recipient(value) if type(value) is str else check_recipient(value)


@functools.lru_cache(maxsize=64)
def _cached_priority_value(value: str) -> str:
    return check_priority(value).value


def _priority_value(value: object) -> str:
    # The enum's .value is a descriptor lookup per row; the text is cached instead.
    return _cached_priority_value(value) if type(value) is str else check_priority(value).value


@functools.lru_cache(maxsize=1024)
def _cached_instance_id(value: str) -> str:
    return check_instance_id(value)


def _instance_id(row: Mapping[str, str | None]) -> str:
    # Cached per text (a deployment has few instances); a violation is raised again.
    value = row.get("instance_id")
    if type(value) is str and value.strip():
        return _cached_instance_id(value)
    return check_instance_id(_required(row, "instance_id"))


@functools.lru_cache(maxsize=64)
def _cached_max_attempts(text: str) -> int:
    return check_max_attempts(_integer(text))


def _required(row: Mapping[str, str | None], column: str) -> str:
    return required(row.get(column), column, problem="is missing")


def _integer(text: str) -> int | str:
    """The integer PostgreSQL printed, or the text itself for the rule to reject."""
    return int(text) if text.isascii() and text.isdigit() else text


class CapturedIntent:
    """An :class:`~streams.kernel.contract.IntentCaptured` as its JSON object, for producing.

    ``document`` holds every field of ``IntentCaptured`` in declaration order,
    then ``schema``: ``orjson.dumps(document)`` is exactly ``record().dumps()``
    (``tests/unit/connectors/cdc/test_outbox_rows.py`` proves it). The attributes
    the relay routes and labels by are copied out once.
    """

    __slots__ = ("committed_at", "document", "job_id", "lsn", "partition_key", "topic")

    SCHEMA = IntentCaptured.SCHEMA

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.job_id: int = document["job_id"]
        self.lsn: str = document["lsn"]
        self.committed_at: str | None = document["committed_at"]
        self.partition_key = conversation_partition_key(
            document["instance_id"], document["conversation_key"]
        )
        self.topic = intents_topic(document["priority"])

    @classmethod
    def of(
        cls, document: dict[str, Any], job_id: int, lsn: str, committed_at: str | None, topic: str
    ) -> CapturedIntent:
        """:class:`CapturedIntent` ``(document)`` from values the caller already holds
        (:func:`row_to_intent`, once per row: no look-ups in the document)."""
        intent = cls.__new__(cls)
        intent.document = document
        intent.job_id = job_id
        intent.lsn = lsn
        intent.committed_at = committed_at
        intent.partition_key = conversation_partition_key(
            document["instance_id"], document["conversation_key"]
        )
        intent.topic = topic
        return intent

    def dumps(self) -> bytes:
        return orjson.dumps(self.document)

    def record(self) -> IntentCaptured:
        """The dataclass (for the paths that need one: commands, refusals, tests)."""
        return IntentCaptured.from_dict(self.document)


def row_to_record(
    row: Mapping[str, str | None], *, lsn: str, committed_at: str | None
) -> IntentCaptured | IntentRejected:
    """Validate one inserted row; return the intent, or the rejection with its reason."""
    intent = row_to_intent(row, lsn=lsn, committed_at=committed_at)
    return intent if isinstance(intent, IntentRejected) else intent.record()


_INTENT_SCHEMA = IntentCaptured.SCHEMA
_OPERATIONAL = Priority.OPERATIONAL.value
_INTENTS_TOPIC_OF = {p.value: intents_topic(p.value) for p in Priority}
"""Each (valid) priority's logical topic, by its text."""

INTENT_COLUMNS = frozenset(
    (
        "id",
        "instance_id",
        "idempotency_key",
        "payload",
        "priority",
        "max_attempts",
        "conversation_key",
        "purpose",
        "expires_at",
        "created_at",
    )
)
"""The ``outbox_jobs`` columns :func:`row_to_intent` reads. The relay decodes only
these (``PgOutputDecoder(columns=...)``) and the whole row again for a rejection,
which carries every column; a unit test checks no other column is read."""


SCHEDULED = JobStatus.SCHEDULED.value

CAPTURED_COLUMNS = INTENT_COLUMNS | {"status"}
"""The ``outbox_jobs`` columns the relay decodes: the intent's, and ``status``, which says
whether the row waits for its release (:func:`waits_for_release`)."""


def waits_for_release(row: Mapping[str, str | None]) -> bool:
    """The row was inserted SCHEDULED (migration 0008's trigger: ``next_retry_at`` in the
    future): the relay publishes nothing for it; its release (an ``outbox_replays`` row
    written by :mod:`connectors.cdc.scheduled_release` when it is due) is its intent."""
    return row.get("status") == SCHEDULED


def row_to_intent(
    row: Mapping[str, str | None], *, lsn: str, committed_at: str | None
) -> CapturedIntent | IntentRejected:
    """:func:`row_to_record` for the relay: the intent as a :class:`CapturedIntent`."""
    job_id_text = row.get("id")
    job_id = int(job_id_text) if job_id_text and job_id_text.isdigit() else None
    try:
        if job_id is None:
            raise _Reject("id is missing")
        instance_id = _instance_id(row)
        idempotency_key = _required(row, "idempotency_key")
        try:
            payload = orjson.loads(_required(row, "payload"))
        except orjson.JSONDecodeError as exc:
            raise _Reject(f"payload is not JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise _Reject(f"payload is a JSON {type(payload).__name__}, not an object")
        kind = check_message_type(payload.get("type", "text"))
        recipient = _recipient(payload.get("to"))
        text, template = _content(kind, payload)
        # NULL or empty columns take the table's defaults.
        priority = _priority_value(row.get("priority") or _OPERATIONAL)
        max_attempts = _cached_max_attempts(row.get("max_attempts") or "5")
        timezone = payload.get("timezone")
        if timezone is not None:
            timezone = check_timezone(timezone)
        # IntentCaptured's fields in declaration order, then its schema (see CapturedIntent).
        return CapturedIntent.of(
            {
                "job_id": job_id,
                "instance_id": instance_id,
                "conversation_key": row.get("conversation_key") or conversation_key_for(recipient),
                "idempotency_key": idempotency_key,
                "message_type": kind,
                "to": recipient,
                "text": text,
                "priority": priority,
                "purpose": row.get("purpose"),
                "expires_at": _timestamp(row.get("expires_at")),
                "max_attempts": max_attempts,
                "created_at": _timestamp(row.get("created_at")),
                "committed_at": committed_at,
                "lsn": lsn,
                "template": template,
                "respect_opt_out": check_respect_opt_out(payload.get("respect_opt_out")),
                "timezone": timezone,
                "schema": _INTENT_SCHEMA,
            },
            job_id,
            lsn,
            committed_at,
            _INTENTS_TOPIC_OF[priority],
        )
    except (_Reject, RuleViolation) as reason:
        return IntentRejected(
            job_id=job_id, reason=str(reason), row=dict(row), lsn=lsn, committed_at=committed_at
        )


def _content(kind: str, payload: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The intent's ``text`` and ``template``: a text with its optional
    ``fallback_template``, or a template (its ``text`` a summary naming it)."""
    if kind == TEMPLATE:
        template = check_template(payload.get("template"))
        return template_summary(template), template
    text = require_text(payload.get("text"), problem="is missing or empty")
    fallback = payload.get("fallback_template")
    if fallback is None:
        return text, None
    return text, check_template(fallback, what="fallback_template")


def _row_id(row: Mapping[str, str | None], column: str) -> int | None:
    text = row.get(column)
    return int(text) if text and text.isdigit() else None


def command_row_to_record(
    row: Mapping[str, str | None], *, lsn: str, committed_at: str | None
) -> CommandRequested | IntentRejected:
    """Validate one inserted ``outbox_commands`` row; return the command or the rejection.

    The row carries copies of its job's columns (``instance_id``, ``payload``,
    ..., ``job_created_at``), filled by the table's trigger. For ``reprocess``
    they become the intent to send again, validated exactly like a new
    ``outbox_jobs`` row by :func:`row_to_record`; for ``cancel`` they give the
    conversation the command is keyed by.
    """
    job_id = _row_id(row, "job_id")
    try:
        command_id = _row_id(row, "id")
        if command_id is None:
            raise _Reject("id is missing")
        if job_id is None:
            raise _Reject("job_id is missing")
        command = row.get("command")
        if command not in {c.value for c in Command}:
            raise _Reject(f"unknown command {command!r}")
        idempotency_key = _required(row, "idempotency_key")
        instance_id = _required(row, "instance_id")
        reason = _required(row, "reason")
        actor = _required(row, "actor")
        requested_at = _timestamp(row.get("created_at"))
        job_row = {
            "id": row.get("job_id"),
            "instance_id": row.get("instance_id"),
            "payload": row.get("payload"),
            "idempotency_key": row.get("idempotency_key"),
            "conversation_key": row.get("conversation_key"),
            "priority": row.get("priority"),
            "purpose": row.get("purpose"),
            "expires_at": row.get("expires_at"),
            "max_attempts": row.get("max_attempts"),
            "created_at": row.get("job_created_at"),
        }
        job = row_to_record(job_row, lsn=lsn, committed_at=committed_at)
        intent = None
        if command == Command.REPROCESS:
            if isinstance(job, IntentRejected):
                raise _Reject(f"cannot reprocess job {job_id}: {job.reason}")
            intent = job.to_dict()
        conversation_key = row.get("conversation_key")
        if not conversation_key and isinstance(job, IntentCaptured):
            conversation_key = job.conversation_key
        if not conversation_key:
            # The job's own row was rejected too: it never reached a conversation.
            reason_text = job.reason if isinstance(job, IntentRejected) else "unknown"
            raise _Reject(f"conversation_key is missing (the job's row: {reason_text})")
        return CommandRequested(
            command_id=command_id,
            command=command,
            job_id=job_id,
            idempotency_key=idempotency_key,
            instance_id=instance_id,
            conversation_key=conversation_key,
            reason=reason,
            actor=actor,
            requested_at=requested_at,
            intent=intent,
            lsn=lsn,
        )
    except (_Reject, RuleViolation) as rejected:
        return IntentRejected(
            job_id=job_id, reason=str(rejected), row=dict(row), lsn=lsn, committed_at=committed_at
        )


def replay_row_to_record(
    row: Mapping[str, str | None], *, lsn: str, committed_at: str | None
) -> IntentCaptured | IntentRejected:
    """An ``outbox_replays`` row (``zapstream outbox restream``) as its job's own intent.

    The row carries copies of the job's columns; the intent is built exactly as
    from the job's ``outbox_jobs`` row, with the job's id, so the worker treats it
    as a redelivery of that job (dropped if already handled).
    """
    job_row = {
        "id": row.get("job_id"),
        "instance_id": row.get("instance_id"),
        "payload": row.get("payload"),
        "idempotency_key": row.get("idempotency_key"),
        "conversation_key": row.get("conversation_key"),
        "priority": row.get("priority"),
        "purpose": row.get("purpose"),
        "expires_at": row.get("expires_at"),
        "max_attempts": row.get("max_attempts"),
        "created_at": row.get("job_created_at"),
    }
    record = row_to_record(job_row, lsn=lsn, committed_at=committed_at)
    if isinstance(record, IntentRejected):
        return dataclasses.replace(record, row=dict(row))
    return record


def control_row_to_record(
    row: Mapping[str, str | None], *, lsn: str, committed_at: str | None
) -> ControlChanged | IntentRejected:
    """Validate one inserted ``outbox_controls`` row; return the control or the rejection.

    The table's CHECK constraints make a bad row unlikely, but the relay does not
    trust the schema it streams from (a table created by hand, a constraint
    dropped): an unknown kind or action, or an empty target, reason or actor,
    becomes an :class:`~streams.kernel.contract.IntentRejected` (``job_id`` None, the
    whole row) on ``zapstream.invalid``, and the stream goes on.
    """
    try:
        control_id = _row_id(row, "id")
        if control_id is None:
            raise _Reject("id is missing")
        kind = row.get("kind")
        if kind not in _CONTROL_KINDS:
            raise _Reject(f"unknown control kind {kind!r} (instance or campaign)")
        action = row.get("action")
        if action not in _CONTROL_ACTIONS:
            raise _Reject(f"unknown control action {action!r} (pause or resume)")
        target = _required(row, "target").strip()
        if not target:
            raise _Reject("target is empty")
        reason = (row.get("reason") or "").strip()
        if not reason:
            raise _Reject("reason is missing or empty")
        actor = (row.get("actor") or "").strip()
        if not actor:
            raise _Reject("actor is missing or empty")
        return ControlChanged(
            kind=kind,
            target=target,
            action=action,
            reason=reason,
            actor=actor,
            at=_timestamp(row.get("created_at")),
            control_id=control_id,
            lsn=lsn,
        )
    except (_Reject, RuleViolation) as rejected:
        return IntentRejected(
            job_id=None, reason=str(rejected), row=dict(row), lsn=lsn, committed_at=committed_at
        )


_CONTROL_KINDS = frozenset(k.value for k in ControlKind)
_CONTROL_ACTIONS = frozenset(a.value for a in ControlAction)


def optout_row_to_record(
    row: Mapping[str, str | None], *, lsn: str, committed_at: str | None
) -> OptOutChanged | IntentRejected:
    """Validate one inserted ``outbox_optouts`` row; return the opt-out or the rejection.

    The table's trigger normalises the recipient to the person and its CHECKs bound the
    action and source, but as for controls the relay does not trust the schema: a row
    that breaks the contract becomes an ``IntentRejected`` (``job_id`` None, the whole
    row) on ``zapstream.invalid``, and the stream goes on.
    """
    try:
        optout_id = _row_id(row, "id")
        if optout_id is None:
            raise _Reject("id is missing")
        action = row.get("action")
        if action not in _OPT_OUT_ACTIONS:
            raise _Reject(f"unknown opt-out action {action!r} (out or in)")
        source = row.get("source")
        if source not in _OPT_OUT_SOURCES:
            raise _Reject(f"unknown opt-out source {source!r} (app, meta or operator)")
        instance_id = check_instance_id(_required(row, "instance_id"))
        recipient = _required(row, "recipient")
        person = opt_out_person(recipient)
        if person != recipient or not CANONICAL_RECIPIENT.fullmatch(person):
            raise _Reject("recipient is not a person's digits or a group JID")
        reason = (row.get("reason") or "").strip() or "opted out"
        return OptOutChanged(
            instance_id=instance_id,
            person=person,
            action=action,
            source=source,
            reason=reason,
            at=_timestamp(row.get("created_at")),
            optout_id=optout_id,
            lsn=lsn,
        )
    except (_Reject, RuleViolation) as rejected:
        return IntentRejected(
            job_id=None, reason=str(rejected), row=dict(row), lsn=lsn, committed_at=committed_at
        )


_OPT_OUT_ACTIONS = frozenset(a.value for a in OptOutAction)
_OPT_OUT_SOURCES = frozenset(s.value for s in OptOutSource)


# --- keeping records producible ------------------------------------------------------------

TRUNCATION_MARKER = "...[zapstream: truncated, {size} bytes in total]"
"""Appended to a column value cut short in a reduced rejection."""
REASON_MAX_CHARS = 1_000

_MARKER_HEAD, _MARKER_TAIL = TRUNCATION_MARKER.split("{size}")


def _already_cut(text: str) -> tuple[str, int] | None:
    """(head, full size) of a value that ends with the marker; None for any other text."""
    if not text.endswith(_MARKER_TAIL):
        return None
    head, marker, rest = text.rpartition(_MARKER_HEAD)
    size = rest[: -len(_MARKER_TAIL)]
    if not marker or not (size.isascii() and size.isdigit()):
        return None
    return head, int(size)


def _cut(text: str, max_bytes: int) -> str:
    """``text`` in at most ``max_bytes`` bytes plus the marker with its full size.

    A value cut already (it ends with the marker) is cut again from its head and keeps
    the size it had in full: cutting is idempotent, so an oversized column's head
    (:func:`cut_value`) goes through :func:`reduced_rejection` with its true size.
    """
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    cut = _already_cut(text)
    if cut is not None:
        head = cut[0].encode()
        if len(head) <= max_bytes:
            return text
        return cut_value(head[:max_bytes].decode("utf-8", errors="ignore"), cut[1])
    head_text = data[:max_bytes].decode("utf-8", errors="ignore")
    return head_text + TRUNCATION_MARKER.format(size=len(data))


def cut_value(head: str, size: int) -> str:
    """A value known only by its first characters and its size in bytes, as a cut value."""
    return head + TRUNCATION_MARKER.format(size=size)


def reduced_rejection(
    *,
    job_id: int | None,
    reason: str,
    row: Mapping[str, str | None],
    lsn: str,
    committed_at: str | None,
    max_record_bytes: int,
    max_value_bytes: int,
) -> IntentRejected:
    """A rejection that fits ``max_record_bytes``: long column values cut, with a marker.

    The job id and LSN always survive, so the row can be found in ``outbox_jobs``
    (or the WAL). If cutting every value to ``max_value_bytes`` is not enough
    (a very wide row), values are cut to a few bytes each; if even that is too
    big, only the id column stays.
    """
    reason = _cut(reason, REASON_MAX_CHARS)
    for limit in (max_value_bytes, 64, 0):
        cut = {k: (None if v is None else _cut(v, limit)) for k, v in row.items()}
        record = IntentRejected(
            job_id=job_id, reason=reason, row=cut, lsn=lsn, committed_at=committed_at
        )
        if len(record.dumps()) <= max_record_bytes:
            return record
    return minimal_rejection(
        job_id=job_id, reason=reason, lsn=lsn, committed_at=committed_at, row=row
    )


MAX_RECORD_BYTES_SETTING = "ZAPSTREAM_RELAY_MAX_RECORD_BYTES"


def with_cut_values(
    row: Mapping[str, str | None], oversized: Mapping[str, OversizedValue] | None
) -> dict[str, str | None]:
    """``row`` with each oversized column back, as its head cut with :data:`TRUNCATION_MARKER`."""
    whole = dict(row)
    for name, value in (oversized or {}).items():
        whole[name] = cut_value(value.head, value.size)
    return whole


def oversized_rejection(
    *,
    row: Mapping[str, str | None],
    oversized: Mapping[str, OversizedValue],
    job_id_column: str | None,
    limit_bytes: int,
    lsn: str,
    committed_at: str | None,
    max_record_bytes: int,
    max_value_bytes: int,
) -> IntentRejected:
    """The rejection of a row with values over ``limit_bytes``, built without parsing any.

    ``row`` holds the columns that were decoded, ``oversized`` the others (their size and
    head, see :class:`~connectors.cdc.pgoutput.OversizedValue`). The reason names each
    oversized column, its size and the setting; the row copy carries each one's head cut
    with :data:`TRUNCATION_MARKER` (its full size), reduced like any rejection
    (:func:`reduced_rejection`). ``job_id_column``: the column holding the job's id
    (``id`` for ``outbox_jobs``, ``job_id`` for commands and replays; None: no job).
    """
    sizes = ", ".join(f"{name} is {value.size} bytes" for name, value in oversized.items())
    reason = (
        f"{sizes}, over the relay's {MAX_RECORD_BYTES_SETTING} ({limit_bytes}): rejected unparsed"
    )
    return reduced_rejection(
        job_id=None if job_id_column is None else _row_id(row, job_id_column),
        reason=reason,
        row=with_cut_values(row, oversized),
        lsn=lsn,
        committed_at=committed_at,
        max_record_bytes=max_record_bytes,
        max_value_bytes=max_value_bytes,
    )


REFERENCE_COLUMNS = ("id", "job_id", "command")
"""Kept (cut short) in a minimal rejection: they say which row it was, and whether it was
a command (the state sink leaves the job alone for a rejected command)."""


def minimal_rejection(
    *,
    job_id: int | None,
    reason: str,
    lsn: str,
    committed_at: str | None = None,
    row: Mapping[str, str | None] | None = None,
) -> IntentRejected:
    """The smallest rejection: job id, LSN and reason; the row is referenced, not copied."""
    reference: dict[str, str | None] = {"id": None if job_id is None else str(job_id)}
    for column in REFERENCE_COLUMNS:
        value = (row or {}).get(column)
        if value is not None:
            reference[column] = _cut(value, 64)
    return IntentRejected(
        job_id=job_id,
        reason=_cut(reason, REASON_MAX_CHARS),
        row=reference,
        lsn=lsn,
        committed_at=committed_at,
    )
