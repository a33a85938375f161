"""What makes a send intent valid: the one place both ends of the outbox check it.

An intent is checked twice, by the same rules: by :mod:`connectors.outbox.enqueue`
before the application's INSERT (a violation becomes
:class:`~connectors.outbox.enqueue.InvalidIntent` and nothing is written), and by
:mod:`connectors.cdc.outbox_rows` when the relay reads a row, because applications
may INSERT directly (a violation becomes an
:class:`~streams.kernel.contract.IntentRejected` published to ``zapstream.invalid``).
The ``outbox_jobs`` table deliberately accepts malformed payloads so that a bad
intent never aborts the application's transaction; it only enforces
``max_attempts > 0`` and its NOT NULL columns.

Each rule returns the value to use or raises :class:`RuleViolation` with the
reason. The API and the relay word an absent value differently: a parameter
"is required", a column or payload key "is missing". Those rules take the
wording as ``problem``; every other reason is the same on both sides.
"""

from __future__ import annotations

import datetime as dt
import functools
import zoneinfo

from connectors.outbox.recipients import InvalidRecipient, normalize_recipient
from streams.kernel.contract import MAX_ATTEMPTS, Priority, instance_id_problem

MAX_TEXT_CHARS = 4096
"""WhatsApp's limit for a text message body, in characters (code points)."""

SUPPORTED_TYPES = frozenset({"text"})
"""The message types the pipeline can send."""


class RuleViolation(ValueError):
    """A value breaks one of the intent rules; the message is the reason."""


def required(value: object, what: str, *, problem: str = "is required") -> str:
    """Return ``value`` unchanged if it is a string with something besides whitespace."""
    if not isinstance(value, str) or not value.strip():
        raise RuleViolation(f"{what} {problem}")
    return value


def require_text(value: object, *, problem: str = "is empty") -> str:
    """Return the message body unchanged if it is non-blank and within :data:`MAX_TEXT_CHARS`."""
    text = required(value, "text", problem=problem)
    if len(text) > MAX_TEXT_CHARS:
        raise RuleViolation(f"text has {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    return text


def check_instance_id(value: object, *, problem: str = "is required") -> str:
    """Return ``value`` if it is a valid instance id (see
    :func:`~streams.kernel.contract.instance_id_problem`): a path segment of the gateway's
    URL and a label on metrics, so ``..``, ``/``, spaces and control characters are refused."""
    instance_id = required(value, "instance_id", problem=problem)
    reason = instance_id_problem(instance_id)
    if reason is not None:
        raise RuleViolation(reason)
    return instance_id


def check_recipient(value: object) -> str:
    """Return the normalised recipient (see :mod:`connectors.outbox.recipients`)."""
    try:
        return normalize_recipient(value)
    except InvalidRecipient as exc:
        raise RuleViolation(str(exc)) from exc


def check_priority(value: object) -> Priority:
    """Return the :class:`~streams.kernel.contract.Priority` named by ``value``."""
    if isinstance(value, str):
        try:
            return Priority(value)
        except ValueError:
            pass
    allowed = ", ".join(p.value for p in Priority)
    raise RuleViolation(f"unknown priority {value!r}; use one of {allowed}")


def check_max_attempts(value: object) -> int:
    """Return ``value`` if it is an integer from 1 to :data:`MAX_ATTEMPTS`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise RuleViolation(
            f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS}, not {value!r}"
        )
    return value


def check_message_type(value: object) -> str:
    """Return ``value`` if it is one of :data:`SUPPORTED_TYPES`."""
    # The isinstance check first: a JSON list or object is unhashable.
    if not isinstance(value, str) or value not in SUPPORTED_TYPES:
        raise RuleViolation(f"unknown message type {value!r}")
    return value


def check_expires_at(value: dt.datetime | None) -> dt.datetime | None:
    """Return ``value`` if it is absent or timezone-aware: a naive time is ambiguous."""
    if value is not None and value.tzinfo is None:
        raise RuleViolation("expires_at must be timezone-aware")
    return value


def check_conversation_key(value: str | None) -> str | None:
    """Return ``value`` if it is absent or non-blank; absent means "derive it"."""
    if value is not None and not value.strip():
        raise RuleViolation("conversation_key, when given, must not be empty")
    return value


def check_send_at(value: dt.datetime | None) -> dt.datetime | None:
    """Return ``value`` if it is absent or timezone-aware: a naive time is ambiguous.

    A time in the past is allowed: the job is sent at once (it is due)."""
    if value is not None and value.tzinfo is None:
        raise RuleViolation("send_at must be timezone-aware")
    return value


def check_send_window(send_at: dt.datetime | None, expires_at: dt.datetime | None) -> None:
    """Refuse a job due at or after its own expiry: it could never be sent."""
    if send_at is not None and expires_at is not None and send_at >= expires_at:
        raise RuleViolation("send_at must be before expires_at: the job would expire unsent")


@functools.lru_cache(maxsize=512)
def _known_zone(name: str) -> bool:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


def check_timezone(value: object) -> str:
    """Return ``value`` if it names an IANA timezone (``America/Sao_Paulo``), for quiet hours."""
    if not isinstance(value, str) or not value.strip() or not _known_zone(value.strip()):
        raise RuleViolation(f"timezone {value!r} is not an IANA timezone name (e.g. Europe/Lisbon)")
    return value.strip()
