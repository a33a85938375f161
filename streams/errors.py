"""The error tree every gateway client maps its failures into, classified once at its edge.

Gateway clients live in ``connectors/gateways``; each failure becomes one of three
classes carrying a ``retriable`` attribute, so callers never need an except-list
of transport errors:

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
