"""The failure vocabulary: :class:`Failure` (a dependency, retriable or not, the problem, a
hint), and the gateway tree every gateway client maps its failures into, classified once at
its edge. PostgreSQL and Kafka failures use the same vocabulary
(:mod:`streams.kernel.failures` classifies them).

Gateway clients live in ``connectors/gateways``; each failure becomes one of three
classes carrying a ``retriable`` attribute, so callers never need an except-list
of transport errors:

- :class:`PermanentGatewayError`: a retry fails the same way (auth, unknown
  instance, invalid data). Never retried.
- :class:`TransientGatewayError`: certainly had no effect (connect error, pool
  timeout, 5xx before the body was read, 429/503). Retried after ``retry_after_s``
  when the gateway said so.
- :class:`UncertainGatewayError`: may have taken effect (read timeout after the
  request was written, connection reset mid-response, a proxy's 502/504 on a
  send). Never counted as success or failure; reconciled.
- :class:`RateLimitedError` (transient): a rate of the instance or of the recipient
  pair was exceeded (429, Meta 130429/131056); nothing was sent, no attempt spent.
- :class:`InstanceUnavailableError` (a transient error with ``scope = "instance"``):
  the gateway refused the *instance*, not the message (401/403 bad credentials,
  404 unknown instance). Certainly not sent; the worker pauses the instance and
  probes it instead of spending the messages' attempts.
- :class:`RecipientOptedOut` (permanent): the recipient stopped the business's messages
  (Meta 131050); the job ends OPTED_OUT and the opt-out is recorded.
- :class:`GatewayMisconfigured` (an instance error naming a ``setting``): our
  configuration is wrong, not the message (a 404 on the send route, the same
  permanent error for many recipients in a row). Paused and probed, never FAILED.
"""

from __future__ import annotations

import re


class Failure(Exception):
    """A classified failure of one dependency: every edge raises or returns these.

    ``retriable``: a later attempt may succeed (transient) or not (permanent: one line for
    the operator, exit 2 at start). ``dependency`` names the peer (``postgres``, ``kafka``,
    ``gateway``, ``config``); ``problem`` is one line, masked; ``hint`` what the operator
    must do (the setting or the command); ``code`` the peer's code (a SQLSTATE, an HTTP
    status) when there is one.
    """

    retriable: bool = False
    dependency: str = "unknown"

    def __init__(
        self,
        problem: str,
        *,
        dependency: str | None = None,
        retriable: bool | None = None,
        hint: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(problem if hint is None else f"{problem}: {hint}")
        self.problem = problem
        self.hint = hint
        self.code = code
        if dependency is not None:
            self.dependency = dependency
        if retriable is not None:
            self.retriable = retriable


class GatewayError(Failure):
    """Base of every classified gateway failure."""

    retriable: bool = False
    dependency = "gateway"
    scope: str = "message"
    """What the failure is about: ``message`` (this request) or ``instance`` (every
    request of the instance fails the same way until an operator fixes it)."""

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


class InstanceUnavailableError(TransientGatewayError):
    """The gateway refused the instance (credentials, unknown instance): nothing was sent.

    Retriable, because it ends when an operator fixes the key or the instance; a
    caller that does not know the class treats it as transient, which is right.
    """

    retriable = True
    scope = "instance"


class RateLimitedError(TransientGatewayError):
    """The gateway refused because a rate was exceeded: nothing was sent.

    ``limit`` says whose rate: ``"instance"`` (the number's throughput: HTTP 429 from
    a gateway, Meta's 130429) or ``"recipient"`` (the business-number/user pair:
    Meta's 131056). The worker slows the instance or the conversation down and sends
    again after ``retry_after_s`` (or its own backoff), without spending an attempt.
    """

    retriable = True

    def __init__(
        self,
        message: str,
        *,
        limit: str = "instance",
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, retry_after_s=retry_after_s)
        if limit not in ("instance", "recipient"):
            raise ValueError(f"unknown rate limit {limit!r}")
        self.limit = limit


class RecipientOptedOut(PermanentGatewayError):
    """The gateway refused because the recipient stopped this business's messages (Meta's
    131050: "this recipient has chosen to stop receiving marketing messages on WhatsApp from
    your business"). Nothing was sent. Permanent for the message; the worker ends the job
    OPTED_OUT and records the opt-out, so later bulk jobs to the person are never sent."""

    retriable = False


class ListingUnreadable(GatewayError):
    """The gateway answered its job listing in a shape the configured field names do not
    describe (``ZAPSTREAM_STACKZAP_LISTING_FIELDS``). Says nothing about any job: the
    reconciler postpones (never UNCERTAIN, never a resend) until it parses again."""

    retriable = False


class GatewayMisconfigured(InstanceUnavailableError):
    """The gateway's answer says our configuration is wrong, not the message: a 404 (or a
    redirect, or 405) on the send or listing route that names no recipient or resource, as
    a wrong base URL gets; or the same permanent error for many sends in a row to different
    recipients. Nothing was sent; every instance configured the same way fails the same
    way. ``setting`` names what to check (``ZAP_API_URL``, ``STACKZAP_API_URL``...).

    An :class:`InstanceUnavailableError`: the worker pauses the instance and probes it
    (with backoff) instead of failing its queue; the first such pause of the gateway is
    the one ERROR line (:mod:`streams.instance_pauses`)."""

    def __init__(
        self,
        message: str,
        *,
        setting: str,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, retry_after_s=retry_after_s)
        self.setting = setting


_RECIPIENT_WORDS = re.compile(
    r"recipient|number|phone|contact|user|chat|jid|wa_?id|destination|not on whatsapp|"
    r"not registered|job|message id|\bmessage not found",
    re.IGNORECASE,
)
_URL_OR_PATH = re.compile(r"https?://\S+|/\S*")


def names_a_resource(reason: str) -> bool:
    """True when a gateway's error message is about a recipient or a resource (``invalid
    recipient``, ``number not on WhatsApp``, ``unknown job``): a message's own failure.

    URL paths in the message are ignored: ``Cannot POST /v1/instances/x/messages`` (a
    web framework's answer to a route it does not have) names no resource."""
    return bool(_RECIPIENT_WORDS.search(_URL_OR_PATH.sub(" ", reason)))


def without_paths(reason: str) -> str:
    """``reason`` with URLs and paths blanked (a route echoed back is not a resource name)."""
    return _URL_OR_PATH.sub(" ", reason)
