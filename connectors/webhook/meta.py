"""Meta WhatsApp Cloud API webhooks: the subscription handshake and status notifications, parsed.

Pure (no I/O): :class:`~connectors.webhook.intake.WebhookIntake` verifies the
signature and publishes; this module only reads bodies.

A notification (``POST``, signed ``X-Hub-Signature-256``) looks like::

    {"object": "whatsapp_business_account",
     "entry": [{"id": "<WABA id>",
                "changes": [{"field": "messages",
                             "value": {"messaging_product": "whatsapp",
                                       "metadata": {"phone_number_id": "<id>", ...},
                                       "statuses": [{"id": "wamid...", "status": "delivered",
                                                     "timestamp": "<unix s>",
                                                     "recipient_id": "<digits>",
                                                     "biz_opaque_callback_data": "<job>-<seq>",
                                                     "errors": [{"code", "title", "message",
                                                                 "error_data": {"details"}}]}]}}]}]}

One body may carry several entries, changes and statuses; each status becomes one
:class:`MetaStatus`. Inbound messages (``value.messages``), ``value.errors`` not tied
to a message and other fields (``account_update``, template updates...) are counted
as ignored: zapstream only sends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from connectors.gateways.classify import MAX_REASON_CHARS, mask_text
from connectors.outbox.recipients import mask_phone
from connectors.webhook.limits import (
    MAX_GATEWAY_ID_CHARS,
    MAX_LABEL_CHARS,
    MAX_REFERENCE_CHARS,
    CallbackTooDeep,
    check_depth,
    scalar,
    too_long,
)

OBJECT = "whatsapp_business_account"


class MalformedMetaCallback(ValueError):
    """A signed body that is not a Cloud API notification (answered 400)."""


@dataclasses.dataclass(frozen=True, slots=True)
class MetaStatus:
    """One entry of ``value.statuses``. ``recipient_id`` stays out of ``repr``."""

    wamid: str
    status: str
    reference: str | None
    """``biz_opaque_callback_data``: our attempt reference, echoed by Meta."""
    phone_number_id: str | None
    timestamp: str | None
    reason: str | None
    """The first error's code, title, message and details (masked), when Meta gave any."""
    recipient_id: str | None = dataclasses.field(default=None, repr=False)

    def dead_letter_record(self) -> dict[str, Any]:
        """What goes to the dead letters when no job matches or the status does not bind:
        allow-listed scalars only, cut to length, the recipient masked, the reason masked."""
        return {
            "gateway": "meta",
            "id": scalar(self.wamid),
            "status": scalar(self.status),
            "biz_opaque_callback_data": scalar(self.reference),
            "phone_number_id": scalar(self.phone_number_id),
            "timestamp": scalar(self.timestamp),
            "recipient_id": mask_phone(self.recipient_id) if self.recipient_id else None,
            "reason": self.reason,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class MetaNotification:
    statuses: tuple[MetaStatus, ...]
    ignored: int
    """Changes or items zapstream does not act on (inbound messages, other fields)."""


def _str(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def error_reason(errors: Any, sensitive: tuple[str, ...] = ()) -> str | None:
    """``"<code> <title>: <message> (<details>)"`` of the first error, masked and truncated."""
    if not isinstance(errors, list) or not errors or not isinstance(errors[0], Mapping):
        return None
    first = errors[0]
    parts: list[str] = []
    code, title, message = (
        _str(first.get("code")),
        _str(first.get("title")),
        _str(first.get("message")),
    )
    head = " ".join(p for p in (code, title) if p)
    if head:
        parts.append(head)
    if message and message != title:
        parts.append(message)
    data = first.get("error_data")
    details = _str(data.get("details")) if isinstance(data, Mapping) else None
    text = ": ".join(parts) if parts else "error"
    if details and details not in text:
        text += f" ({details})"
    text = " ".join(mask_text(text, sensitive).split())  # redacted before it is flattened
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3] + "..."
    return text


def _status(item: Any, phone_number_id: str | None) -> MetaStatus:
    if not isinstance(item, Mapping):
        raise MalformedMetaCallback("a status must be a JSON object")
    wamid, label = _str(item.get("id")), _str(item.get("status"))
    if wamid is None:
        raise MalformedMetaCallback("a status needs a non-empty 'id'")
    if label is None:
        raise MalformedMetaCallback("a status needs a non-empty 'status'")
    reference = item.get("biz_opaque_callback_data")
    if reference is not None and not isinstance(reference, str):
        raise MalformedMetaCallback("'biz_opaque_callback_data' must be a string")
    problem = (
        too_long("id", wamid, MAX_GATEWAY_ID_CHARS)
        or too_long("status", label, MAX_LABEL_CHARS)
        or too_long("biz_opaque_callback_data", reference, MAX_REFERENCE_CHARS)
        or too_long("phone_number_id", phone_number_id, MAX_GATEWAY_ID_CHARS)
    )
    if problem is not None:
        raise MalformedMetaCallback(problem)
    recipient = _str(item.get("recipient_id"))
    return MetaStatus(
        wamid=wamid,
        status=label,
        reference=reference or None,
        phone_number_id=phone_number_id,
        timestamp=_str(item.get("timestamp")),
        reason=error_reason(item.get("errors"), (recipient,) if recipient else ()),
        recipient_id=recipient,
    )


def parse_notification(raw: bytes) -> MetaNotification:
    """Every status of a notification body; raises :class:`MalformedMetaCallback`."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedMetaCallback("body is not JSON") from exc
    if not isinstance(body, dict):
        raise MalformedMetaCallback("body is not a JSON object")
    try:
        check_depth(body)
    except CallbackTooDeep as exc:
        raise MalformedMetaCallback(str(exc)) from None
    if body.get("object") != OBJECT:
        raise MalformedMetaCallback(f"'object' must be {OBJECT!r}")
    entries = body.get("entry")
    if not isinstance(entries, list):
        raise MalformedMetaCallback("'entry' must be a list")
    statuses: list[MetaStatus] = []
    ignored = 0
    for entry in entries:
        changes = entry.get("changes") if isinstance(entry, Mapping) else None
        if not isinstance(changes, list):
            raise MalformedMetaCallback("each entry needs a 'changes' list")
        for change in changes:
            if not isinstance(change, Mapping):
                raise MalformedMetaCallback("a change must be a JSON object")
            value = change.get("value")
            if change.get("field") != "messages" or not isinstance(value, Mapping):
                ignored += 1
                continue
            metadata = value.get("metadata")
            phone_number_id = (
                _str(metadata.get("phone_number_id")) if isinstance(metadata, Mapping) else None
            )
            items = value.get("statuses")
            if items is None:
                ignored += 1  # inbound messages, or errors not about a message we sent
                continue
            if not isinstance(items, list):
                raise MalformedMetaCallback("'statuses' must be a list")
            statuses.extend(_status(item, phone_number_id) for item in items)
    return MetaNotification(tuple(statuses), ignored)


def handshake_challenge(query: Mapping[str, str]) -> tuple[str | None, str | None]:
    """``(verify_token, challenge)`` of a subscription request; both None unless mode=subscribe."""
    if query.get("hub.mode") != "subscribe":
        return None, None
    return query.get("hub.verify_token"), query.get("hub.challenge")
