"""The port the dispatcher sends through, and the error tree every gateway client maps into.

Gateway clients live in ``connectors/gateways``; they classify every failure
once, at their edge, into one of three classes that carry a ``retriable``
attribute, so the dispatcher never needs an except-list of transport errors:

- :class:`PermanentGatewayError`: a retry fails the same way (auth, unknown
  instance, invalid data). Never retried.
- :class:`TransientGatewayError`: certainly had no effect (connect error, pool
  timeout, 5xx before the body was read, 429/503). Retried after ``retry_after_s``
  when the gateway said so.
- :class:`UncertainGatewayError`: may have taken effect (read timeout after the
  request was written, connection reset mid-response). Never counted as success
  or failure; reconciled.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol

from streams.contract import JobStatus


class GatewayError(Exception):
    """Base of every classified gateway failure."""

    retriable: bool = False

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class PermanentGatewayError(GatewayError):
    """A retry would fail the same way."""

    retriable = False


class TransientGatewayError(GatewayError):
    """The request certainly had no effect; safe to retry."""

    retriable = True

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after_s = retry_after_s


class UncertainGatewayError(GatewayError):
    """The gateway may or may not have accepted the message."""

    retriable = False


@dataclasses.dataclass(frozen=True, slots=True)
class SendAccepted:
    """The gateway took the message. ``status`` is our mapping of its label."""

    gateway_job_id: str | None
    gateway_status: str | None
    status: JobStatus


@dataclasses.dataclass(frozen=True, slots=True)
class TextMessage:
    """What the dispatcher asks a gateway to send."""

    instance_id: str
    to: str
    text: str
    reference: str
    """Our attempt id, sent as the ``Idempotency-Key`` header."""


@dataclasses.dataclass(frozen=True, slots=True)
class ListedJob:
    """A job as the gateway's listing shows it, for reconciliation."""

    gateway_job_id: str | None
    reference: str | None
    """The ``Idempotency-Key`` we sent, when the gateway echoes it."""
    to: str | None
    text: str | None = dataclasses.field(repr=False)
    status: JobStatus
    gateway_status: str | None


class CancelOutcome(enum.StrEnum):
    CANCELLED = "cancelled"
    REFUSED = "refused"
    """The gateway says it is too late (already sent)."""
    UNSUPPORTED = "unsupported"


class Gateway(Protocol):
    """A WhatsApp gateway client as the dispatcher sees it."""

    name: str

    async def send_text(self, message: TextMessage) -> SendAccepted:
        """Send one text message or raise a :class:`GatewayError` subclass."""
        ...

    async def list_for_reconciliation(self, instance_id: str) -> list[ListedJob] | None:
        """Every job the gateway holds for the instance; None when it has no listing."""
        ...

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        """Cancel an accepted job, or say why not."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
