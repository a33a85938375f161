"""The port the job processor sends through: what a WhatsApp gateway client offers.

Concrete clients live in ``connectors/gateways`` and raise from :mod:`streams.kernel.errors`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from streams.kernel.contract import JobStatus


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
    template: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False)
    """Send this Cloud API template instead of ``text`` (which then only names it); only a
    gateway whose client has ``sends_templates = True`` is ever given one
    (:mod:`streams.kernel.templates`)."""


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

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: Callable[[], Awaitable[None]] | None = None,
    ) -> list[ListedJob] | None:
        """The instance's jobs that may be these attempts; None when it has no listing.

        ``references`` (our attempt ids) and ``since`` (no job of interest is older)
        let a gateway whose API filters answer narrowly; one that cannot filter
        returns every job. Never fewer than the matching jobs: reconciliation treats
        "not listed" as "not accepted" when the listing is authoritative. Raises
        :class:`~streams.kernel.errors.ListingUnreadable` when the answer does not parse.
        ``before_page`` is awaited before each request (the caller's bound on requests).
        """
        ...

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        """Cancel an accepted job, or say why not."""
        ...

    async def probe_configuration(self, instance_id: str) -> str:
        """One harmless request for the instance that tells a working configuration from
        a wrong one; returns what it saw, for a log line or ``zapstream doctor``.

        Nothing is ever sent to anybody. Raises
        :class:`~streams.kernel.errors.GatewayMisconfigured` (wrong base URL or route, naming
        the setting), :class:`~streams.kernel.errors.InstanceUnavailableError` (credentials
        refused, unknown instance), :class:`~streams.kernel.errors.ListingUnreadable` (the
        listing reconciliation needs does not parse) or a transient error (the gateway
        is down: nothing is known)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
