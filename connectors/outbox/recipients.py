"""What a WhatsApp recipient is, and how it is normalised and masked.

Accepted forms:

- a phone number in international format, with or without ``+``, spaces,
  dashes, dots or parentheses: ``+55 (11) 98765-4321`` -> ``5511987654321``
  (E.164: 8 to 15 digits, not starting with 0);
- a personal JID ``<digits>@s.whatsapp.net`` or ``<digits>@c.us``;
- a group JID ``<id>@g.us`` (``<id>`` digits, optionally ``-`` and more digits).

The conversation key is the recipient's digits for a person and the group JID
for a group; ``zapstream_conversation_key()`` in the SQL migration computes the
same thing for rows applications insert directly.
"""

from __future__ import annotations

import re

_PHONE_PUNCTUATION = re.compile(r"[\s\-().]")
_DIGITS = re.compile(r"[1-9]\d{7,14}", re.ASCII)
_PERSONAL_JID = re.compile(r"([1-9]\d{7,14})@(s\.whatsapp\.net|c\.us)", re.ASCII)
_GROUP_JID = re.compile(r"\d{5,30}(-\d{1,20})?@g\.us", re.ASCII)


class InvalidRecipient(ValueError):
    """Not a phone number or WhatsApp JID we can send to."""


def normalize_recipient(raw: object) -> str:
    """Return the canonical recipient: digits for a phone, the JID for a group or person."""
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidRecipient("recipient is missing")
    value = raw.strip().lower()
    if "@" in value:
        if _PERSONAL_JID.fullmatch(value) or _GROUP_JID.fullmatch(value):
            return value
        raise InvalidRecipient(f"recipient {mask_recipient(raw)!r} is not a WhatsApp JID")
    digits = _PHONE_PUNCTUATION.sub("", value).removeprefix("+")
    if not _DIGITS.fullmatch(digits):
        raise InvalidRecipient(
            f"recipient {mask_recipient(raw)!r} is not an international phone number "
            "(8 to 15 digits with country code)"
        )
    return digits


def conversation_key_for(recipient: str) -> str:
    """The conversation a normalised recipient belongs to."""
    if recipient.endswith("@g.us"):
        return recipient
    return recipient.split("@", 1)[0]


def mask_phone(phone: str) -> str:
    """Keep the first two characters (the country code's start) and the last four digits
    of a long number, two of a shorter one: ``55*******4321``, ``14******71``.

    At least six digits stay hidden for any valid number (10**6 candidates or more): a
    masked number can be told apart from its neighbours in a log, never guessed.
    """
    n = len(phone)
    if n >= 12:
        return phone[:2] + "*" * (n - 6) + phone[-4:]
    if n >= 9:
        return phone[:2] + "*" * (n - 4) + phone[-2:]
    if n > 2:
        return "*" * (n - 2) + phone[-2:]
    return "*" * n


def mask_recipient(raw: str) -> str:
    """Keep enough of a recipient to tell numbers apart in logs, never the whole of it.

    A JID keeps its domain; its local part is masked like a phone number, except that a
    short one (never a valid recipient) shows at most its first two characters.
    """
    head, at, domain = raw.partition("@")
    if len(head) > 8:
        masked = mask_phone(head)
    elif len(head) > 6:
        masked = head[:2] + "***"
    else:
        masked = "*" * len(head)
    return masked + at + domain
