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
import re
import zoneinfo
from collections.abc import Mapping
from typing import Any

from connectors.outbox.recipients import InvalidRecipient, normalize_recipient
from streams.kernel.contract import MAX_ATTEMPTS, Priority, instance_id_problem

MAX_TEXT_CHARS = 4096
"""WhatsApp's limit for a text message body, in characters (code points)."""

SUPPORTED_TYPES = frozenset({"text", "template"})
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


def check_respect_opt_out(value: object, *, allowed: str = "true, false or absent") -> bool | None:
    """Return ``value`` if it is None (decide by priority), True or False: whether the
    recipient's opt-out stops the job. ``allowed`` words the choices for each end."""
    if value is None or isinstance(value, bool):
        return value
    raise RuleViolation(f"respect_opt_out must be {allowed}")


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


# --- templates (Meta's Cloud API) ----------------------------------------------------------
#
# The template object as the Cloud API's messages endpoint defines it:
#   {"name": "order_confirmation", "language": {"code": "pt_BR"},
#    "components": [{"type": "body", "parameters": [{"type": "text", "text": "Ana"}]},
#                   {"type": "button", "sub_type": "url", "index": 0,
#                    "parameters": [{"type": "text", "text": "123"}]}]}
# ``language`` may be given as the bare code ("pt_BR"); it is normalised to the object.
# Whether the template exists, in that language, with that many parameters is Meta's to
# say (132001, 132000): these rules catch what can never be right, before the INSERT.

TEMPLATE_NAME_MAX = 512
_TEMPLATE_NAME = re.compile(r"[a-z0-9_]+")
"""Meta's template names: lowercase letters, digits and underscores."""
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(_[A-Za-z]{2,4})?")
"""``pt_BR``, ``en``, ``en_US``, ``zh_HK``, ``fil``: Meta's language and locale codes."""
_CURRENCY_CODE = re.compile(r"[A-Z]{3}")
COMPONENT_TYPES = frozenset({"header", "body", "button"})
BUTTON_SUB_TYPES = frozenset({"quick_reply", "url", "copy_code", "catalog", "flow"})
MEDIA_TYPES = frozenset({"image", "document", "video"})
PARAMETER_TYPES = MEDIA_TYPES | {
    "text",
    "currency",
    "date_time",
    "payload",
    "coupon_code",
    "action",
}
MAX_PARAMETERS = 100
"""Parameters per component at most (a guard against a runaway list, not Meta's limit)."""
_TEMPLATE_KEYS = frozenset({"name", "language", "components"})


def check_template(value: object, *, what: str = "template") -> dict[str, Any]:
    """Return the template object, ``language`` normalised to ``{"code": ...}``, or raise
    :class:`RuleViolation` naming the first thing that can never be sent."""
    if not isinstance(value, Mapping):
        raise RuleViolation(f"{what} must be an object with name, language and components")
    unknown = sorted(str(k) for k in value if k not in _TEMPLATE_KEYS)
    if unknown:
        raise RuleViolation(f"{what} has unknown keys {unknown}; use name, language, components")
    name = value.get("name")
    if not isinstance(name, str) or not _TEMPLATE_NAME.fullmatch(name):
        raise RuleViolation(f"{what}.name must be lowercase letters, digits and underscores")
    if len(name) > TEMPLATE_NAME_MAX:
        raise RuleViolation(f"{what}.name is longer than {TEMPLATE_NAME_MAX} characters")
    language = value.get("language")
    if isinstance(language, Mapping):
        extra = sorted(str(k) for k in language if k not in ("code", "policy"))
        if extra or language.get("policy", "deterministic") != "deterministic":
            raise RuleViolation(f"{what}.language takes code (and policy 'deterministic')")
        language = language.get("code")
    if not isinstance(language, str) or not _LANGUAGE_CODE.fullmatch(language):
        raise RuleViolation(f"{what}.language must be a language code such as pt_BR or en")
    components = value.get("components", [])
    if not isinstance(components, list):
        raise RuleViolation(f"{what}.components must be a list")
    checked = [_component(c, f"{what}.components[{i}]") for i, c in enumerate(components)]
    template: dict[str, Any] = {"name": name, "language": {"code": language}}
    if checked:
        template["components"] = checked
    return template


def _component(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise RuleViolation(f"{what} must be an object")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in COMPONENT_TYPES:
        raise RuleViolation(f"{what}.type must be one of header, body, button")
    component = dict(value)
    if kind == "button":
        sub_type = value.get("sub_type")
        if not isinstance(sub_type, str) or sub_type not in BUTTON_SUB_TYPES:
            allowed = ", ".join(sorted(BUTTON_SUB_TYPES))
            raise RuleViolation(f"{what}.sub_type must be one of {allowed}")
        index = value.get("index")
        if isinstance(index, str) and index.isdigit():
            index = int(index)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= 9:
            raise RuleViolation(f"{what}.index must be a button position from 0 to 9")
    elif "sub_type" in value or "index" in value:
        raise RuleViolation(f"{what}: sub_type and index belong to a button")
    parameters = value.get("parameters", [])
    if not isinstance(parameters, list) or len(parameters) > MAX_PARAMETERS:
        raise RuleViolation(f"{what}.parameters must be a list of at most {MAX_PARAMETERS}")
    component["parameters"] = [
        _parameter(p, f"{what}.parameters[{i}]") for i, p in enumerate(parameters)
    ]
    return component


def _parameter(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise RuleViolation(f"{what} must be an object")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in PARAMETER_TYPES:
        allowed = ", ".join(sorted(PARAMETER_TYPES))
        raise RuleViolation(f"{what}.type must be one of {allowed}")
    body = value.get(kind)
    if kind in ("text", "payload", "coupon_code"):
        if not isinstance(body, str) or not body.strip():
            raise RuleViolation(f"{what}.{kind} must be a non-empty string")
        if len(body) > MAX_TEXT_CHARS:
            raise RuleViolation(f"{what}.{kind} is longer than {MAX_TEXT_CHARS} characters")
    elif kind == "currency":
        _currency(body, what)
    elif kind == "date_time":
        if not isinstance(body, Mapping) or not _filled(body.get("fallback_value")):
            raise RuleViolation(f"{what}.date_time needs a fallback_value")
    elif kind in MEDIA_TYPES:
        _media(body, f"{what}.{kind}")
    elif not isinstance(body, Mapping):
        raise RuleViolation(f"{what}.action must be an object")
    return dict(value)


def _filled(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _currency(body: object, what: str) -> None:
    if not isinstance(body, Mapping) or not _filled(body.get("fallback_value")):
        raise RuleViolation(f"{what}.currency needs a fallback_value")
    code = body.get("code")
    if not isinstance(code, str) or not _CURRENCY_CODE.fullmatch(code):
        raise RuleViolation(f"{what}.currency.code must be an ISO 4217 code such as BRL")
    amount = body.get("amount_1000")
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise RuleViolation(f"{what}.currency.amount_1000 must be an integer (amount x 1000)")


def _media(body: object, what: str) -> None:
    """An image, document or video by ``link`` (http or https) or by uploaded media ``id``."""
    if not isinstance(body, Mapping):
        raise RuleViolation(f"{what} must be an object with link or id")
    link, media_id = body.get("link"), body.get("id")
    if (link is None) == (media_id is None):
        raise RuleViolation(f"{what} needs exactly one of link and id")
    if link is not None and not (
        isinstance(link, str) and link.startswith(("https://", "http://"))
    ):
        raise RuleViolation(f"{what}.link must be an http(s) URL")
    if media_id is not None and not _filled(media_id):
        raise RuleViolation(f"{what}.id must be a non-empty string")


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
