"""Attempt references: what a gateway is told about an attempt, unguessable and bound to it.

Every attempt to send a job hands the gateway a *reference* (StackZap's and the ZAP
API's ``Idempotency-Key``, Meta's ``biz_opaque_callback_data``), which the gateway
echoes in its status callbacks and listings::

    <job_id>-<seq>-<tag>        e.g. 4711-2-9c1d0e5a7b3f21c48d6e0a9b

``<job_id>-<seq>`` is the attempt id (``StatusChanged.attempt_id``); ``<tag>`` is the
first :data:`TAG_HEX` lower-case hex digits (96 bits) of
``HMAC-SHA256(key, "zapstream-reference:v1:<gateway>:<instance_id>:<job_id>-<seq>")``
with ``ZAPSTREAM_REFERENCE_KEY`` as the key.
Without the key nobody can make a reference for a job, and a reference made for one
gateway or instance does not verify for another: a receipt replayed to another gateway's
webhook path, or naming another job, does not bind (:mod:`streams.receipts`).

References from before the tag (``<job_id>-<seq>``, *legacy*) are still read, as
references that prove nothing: a receipt carrying one applies only when its gateway job
id is the attempt's (see :func:`streams.receipts.ignored_because`).

Pure: standard library only. The worker makes references, the webhook intake and the
worker verify them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac

TAG_HEX = 24
"""Hex digits of the tag: 96 bits, far beyond guessing within any replay window."""
MIN_KEY_CHARS = 32
"""The shortest ``ZAPSTREAM_REFERENCE_KEY`` accepted at start."""
KEY_SETTING = "ZAPSTREAM_REFERENCE_KEY"
MAX_REFERENCE_CHARS = 128
"""Longer than any reference we make; a longer one is refused before it is parsed."""
_DOMAIN = "zapstream-reference:v1"


@dataclasses.dataclass(frozen=True, slots=True)
class ParsedReference:
    """A reference read back: the job, the attempt's sequence number and the tag (None:
    a legacy ``<job>-<seq>`` reference)."""

    job_id: int
    seq: int
    tag: str | None

    @property
    def attempt_id(self) -> str:
        return f"{self.job_id}-{self.seq}"


def _number(text: str) -> int | None:
    if not text or len(text) > 19 or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def parse_reference(reference: str | None) -> ParsedReference | None:
    """``<job>-<seq>[-<tag>]`` read back, or None when ``reference`` is not one of ours."""
    if not reference or len(reference) > MAX_REFERENCE_CHARS:
        return None
    parts = reference.strip().split("-")
    if len(parts) not in (2, 3):
        return None
    job_id, seq = _number(parts[0]), _number(parts[1])
    # outbox_jobs.id is a BIGSERIAL: anything outside it cannot be one of ours.
    if job_id is None or seq is None or not 0 < job_id < 2**63 or seq < 1:
        return None
    tag = parts[2] if len(parts) == 3 else None
    if tag is not None and (len(tag) != TAG_HEX or not _is_hex(tag)):
        return None
    return ParsedReference(job_id, seq, tag)


def _is_hex(text: str) -> bool:
    return text.isascii() and all(c in "0123456789abcdef" for c in text)


class ReferenceKey:
    """Makes and verifies attempt references with the deployment's key.

    ``repr`` never shows the key. Raises ``ValueError`` for a key shorter than
    :data:`MIN_KEY_CHARS` (the caller names the setting).
    """

    __slots__ = ("_key",)

    def __init__(self, key: str) -> None:
        if len(key) < MIN_KEY_CHARS:
            raise ValueError(f"must be at least {MIN_KEY_CHARS} characters")
        self._key = key.encode()

    def __repr__(self) -> str:
        return "ReferenceKey(***)"

    def _tag(self, gateway: str, instance_id: str, job_id: int, seq: int) -> str:
        message = f"{_DOMAIN}:{gateway}:{instance_id}:{job_id}-{seq}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:TAG_HEX]

    def reference(self, gateway: str, instance_id: str, job_id: int, seq: int) -> str:
        """Attempt ``seq`` of ``job_id``'s reference, through ``gateway``, for ``instance_id``."""
        return f"{job_id}-{seq}-{self._tag(gateway, instance_id, job_id, seq)}"

    def verifies(self, parsed: ParsedReference, *, gateway: str, instance_id: str) -> bool:
        """The tag of ``parsed`` is the one this key makes for ``gateway`` and ``instance_id``
        (constant-time); a legacy reference (no tag) never verifies."""
        if parsed.tag is None:
            return False
        expected = self._tag(gateway, instance_id, parsed.job_id, parsed.seq)
        return hmac.compare_digest(parsed.tag.encode(), expected.encode())


def legacy_reference(job_id: int, seq: int) -> str:
    """The reference made before the tag (``<job>-<seq>``): without a key (tests, tools)."""
    return f"{job_id}-{seq}"


def load_reference_key(key: str) -> ReferenceKey:
    """The deployment's key, or :class:`~streams.kernel.failures.StartRefused` naming
    :data:`KEY_SETTING` (exit 2) when it is missing or short. Never shows the value."""
    from streams.kernel.failures import StartRefused

    try:
        return ReferenceKey(key)
    except ValueError:
        problem = "is not set" if not key else f"is shorter than {MIN_KEY_CHARS} characters"
        raise StartRefused(
            f"{KEY_SETTING} {problem}: the worker and the webhook need the same key of at least "
            f"{MIN_KEY_CHARS} characters (e.g. `openssl rand -hex 32`)"
        ) from None
