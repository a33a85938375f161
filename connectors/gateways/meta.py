"""Meta WhatsApp Cloud API gateway client.

``POST {META_GRAPH_URL}/{META_API_VERSION}/{phone_number_id}/messages`` with
``Authorization: Bearer <META_ACCESS_TOKEN>`` and::

    {"messaging_product": "whatsapp", "recipient_type": "individual", "to": "<digits>",
     "type": "text", "text": {"body": "<text>"}, "biz_opaque_callback_data": "<reference>"}

or, for a template (:attr:`~streams.kernel.ports.TextMessage.template`, the Cloud API's
template object as the application gave it, validated by
:func:`connectors.outbox.rules.check_template`)::

    {"messaging_product": "whatsapp", "recipient_type": "individual", "to": "<digits>",
     "type": "template", "template": {"name", "language": {"code"}, "components"?},
     "biz_opaque_callback_data": "<reference>"}

answers ``{"messaging_product", "contacts": [{"input", "wa_id"}], "messages": [{"id":
"wamid...", "message_status"?}]}``. The ``wamid`` is the gateway job id;
``message_status`` (``accepted`` when absent, as Meta answers plain text messages) is
mapped with ``settings.meta_labels``.

Instances: the outbox ``instance_id`` *is* the business phone number's id (the
numeric ``phone_number_id`` of WhatsApp Manager); one zapstream instance per
business number, no mapping table to keep in step.

Our attempt reference (``<job_id>-<seq>``) travels as ``biz_opaque_callback_data``:
the Cloud API has no ``Idempotency-Key``, but echoes that field in every status
webhook, which is how the intake finds the job and the attempt.

Failures. Transport failures and HTTP statuses without a Graph error we know are
classified by :mod:`connectors.gateways.classify` (the one place that decides "how
far did the request get"); a Graph error body ``{"error": {"code", "error_subcode",
"message", "type", "fbtrace_id"}}`` is read first by :func:`meta_error`:

============================  ==========================================================
Graph error ``code``          our class
============================  ==========================================================
130429 (throughput), 80007,   :class:`RateLimitedError` ``limit="instance"`` (nothing sent;
4 (app call limit)            ``Retry-After`` when given, else 1 s)
131056 (pair rate limit)      :class:`RateLimitedError` ``limit="recipient"``, 6 s (Meta
                              allows about one message per 6 s to the same user)
131049 (per-user marketing    :class:`PermanentGatewayError`: Meta decided not to deliver it
limit / ecosystem health)     to this user now and asks not to resend right away; our retry
                              schedule (seconds to minutes) would meet the same refusal,
                              so the message is FAILED with the reason and an operator
                              decides whether to send it again later
131050 (the user stopped      :class:`RecipientOptedOut` (permanent, on a 4xx): nothing sent;
marketing messages)           the job ends OPTED_OUT and the opt-out is recorded
                              (``outbox_optouts``, source ``meta``), so later bulk jobs to
                              the person are never sent
131026 (undeliverable), 100   :class:`PermanentGatewayError` (on a 4xx)
(invalid parameter),
131051, 131052, 131053
131047 (re-engagement: more   :class:`~streams.kernel.templates.WindowClosed` (permanent, on
than 24 h since the customer  a 4xx): nothing was sent; a text with a fallback template is
last wrote)                   sent as that template instead, else FAILED
132000, 132001, 132005,       :class:`~streams.kernel.templates.TemplateRejected` (permanent,
132007, 132012, 132016        on a 4xx): the template's fault, with the reason
(template errors)             (:data:`TEMPLATE_ERRORS`); never counted as the number's fault
132015 (template paused)      :class:`~streams.kernel.templates.TemplatePaused` (permanent for
                              the attempt): the worker holds the template's jobs and
                              re-checks it (:mod:`streams.template_pauses`)
131057 (account in            :class:`InstanceUnavailableError` (transient, ``scope=
maintenance mode)             "instance"``), 60 s: every message of the number fails the
                              same way until Meta finishes; the worker pauses the number
                              and probes it instead of spending the messages' attempts
190, 0 (token), 10, 200-299   :class:`InstanceUnavailableError`: the access token or its
(permissions), 131031         permissions, the business account locked, the number not
(account locked), 133010      registered, or the phone number id unknown; also any 401/403
(number not registered),
100 with subcode 33
any other code on HTTP 429    :class:`RateLimitedError` ``limit="instance"``
131000, 1, 2, any other code  the shared HTTP classification (400 permanent; 500/503
                              transient; 502/504 and other 5xx uncertain on a send)
============================  ==========================================================

``META_GRAPH_URL`` is the Graph API's root: the client adds ``/{META_API_VERSION}``
itself and drops a trailing version (``https://graph.facebook.com/v21.0``) from the URL.
:meth:`MetaCloudClient.probe_configuration` reads the phone number's node (``GET
/{version}/{phone_number_id}``): the token and the number id, without sending anything.

There is no listing: :meth:`MetaCloudClient.list_for_reconciliation` returns None, so
an uncertain send (lost answer, proxy 502) ends UNCERTAIN and is never resent blindly.
Nothing can be cancelled once sent.

Logs and errors never carry the access token, the recipient or the text: they are
passed as sensitive values to be redacted, and phone-like digit runs are masked.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from connectors.gateways.classify import (
    MAX_REASON_CHARS,
    GatewayResponse,
    error_for_response,
    json_object,
    mask_text,
    parse_retry_after,
    send_request,
)
from connectors.gateways.http_client import HttpGatewayClient, first_str
from connectors.gateways.labels import map_label
from streams.kernel.contract import JobStatus
from streams.kernel.errors import (
    GatewayError,
    InstanceUnavailableError,
    PermanentGatewayError,
    RateLimitedError,
    RecipientOptedOut,
)
from streams.kernel.ports import CancelOutcome, ListedJob, SendAccepted, TextMessage
from streams.kernel.settings import GatewaySettings
from streams.kernel.templates import TemplatePaused, TemplateRejected, WindowClosed

log = logging.getLogger(__name__)

NAME = "meta"
DEFAULT_LABEL = "accepted"
"""What a send's answer means when it carries no ``message_status`` (plain text)."""

THROUGHPUT_WAIT_S = 1.0
"""Wait after 130429 without ``Retry-After``: the number's messages-per-second cap."""
PAIR_WAIT_S = 6.0
"""Wait after 131056: Meta allows about one message every 6 s to the same user."""
MAINTENANCE_WAIT_S = 60.0
"""Wait after 131057 (the business account is being upgraded or in maintenance)."""

THROUGHPUT_CODES = frozenset({130429, 80007, 4})
PAIR_RATE_CODE = 131056
MARKETING_LIMIT_CODE = 131049
MAINTENANCE_CODE = 131057
OPT_OUT_CODE = 131050
"""The user stopped marketing messages from the business: never send them bulk again."""
CREDENTIAL_CODES = frozenset({0, 10, 190, 131031, 133010})
"""Token expired/invalid (0, 190), permission missing (10), account locked (131031),
number not registered (133010); 200-299 (permissions) too."""
UNKNOWN_OBJECT_SUBCODE = 33
"""Code 100 with subcode 33: the phone number id in the URL does not exist (or the token
cannot see it); every message of that instance fails the same way."""
PERMANENT_CODES = frozenset({100, 131026, 131051, 131052, 131053, MARKETING_LIMIT_CODE})
WINDOW_CLOSED_CODE = 131047
"""Re-engagement: more than 24 hours since the customer last wrote; only a template goes."""
TEMPLATE_PAUSED_CODE = 132015
TEMPLATE_ERRORS: dict[int, str] = {
    132000: "the number of parameters does not match the template",
    132001: "the template does not exist in this language",
    132005: "the template's text is too long once filled in",
    132007: "the template's content violates a WhatsApp policy",
    132012: "a parameter's format does not match the template",
    TEMPLATE_PAUSED_CODE: "the template is paused for its quality",
    132016: "the template is disabled (paused too many times)",
}
"""Meta's template errors and the reason each puts in ``last_error``."""


@dataclasses.dataclass(frozen=True, slots=True)
class GraphError:
    """The ``error`` object of a Graph API answer. ``message`` is already masked."""

    code: int | None
    subcode: int | None
    message: str
    type: str | None
    fbtrace_id: str | None
    details: str | None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def graph_error(response: GatewayResponse, sensitive: Iterable[str] = ()) -> GraphError | None:
    """The Graph error of an answer, or ``None`` when the body is not one."""
    body = json_object(response)
    error = body.get("error") if body else None
    if not isinstance(error, Mapping):
        return None
    data = error.get("error_data")
    details = data.get("details") if isinstance(data, Mapping) else None
    raw_message = error.get("message")
    message = raw_message if isinstance(raw_message, str) else ""
    if isinstance(details, str) and details and details not in message:
        message = f"{message} ({details})" if message else details
    text = " ".join(mask_text(message, sensitive).split())  # redacted before it is flattened
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3] + "..."
    return GraphError(
        code=_int(error.get("code")),
        subcode=_int(error.get("error_subcode")),
        message=text,
        type=error.get("type") if isinstance(error.get("type"), str) else None,
        fbtrace_id=error.get("fbtrace_id") if isinstance(error.get("fbtrace_id"), str) else None,
        details=details if isinstance(details, str) else None,
    )


def meta_error(
    response: GatewayResponse,
    *,
    sensitive: Iterable[str] = (),
    now: float | None = None,
    url_setting: str | None = None,
) -> GatewayError | None:
    """``None`` for a 2xx, else the error-tree class of a Cloud API answer (table above).

    A Graph error code we know decides; otherwise the shared HTTP classification does,
    except that any 429 is the number's rate. ``url_setting``: as for
    :func:`~connectors.gateways.classify.error_for_response` (a 404 without a Graph error
    on the messages route means ``META_GRAPH_URL`` is wrong).
    """
    status = response.status_code
    if 200 <= status < 300:
        return None
    sensitive = tuple(sensitive)
    retry_after_s = parse_retry_after(response.headers.get("Retry-After"), now=now)
    error = graph_error(response, sensitive)
    if error is None or error.code is None:
        shared = error_for_response(
            response, gateway=NAME, sensitive=sensitive, now=now, url_setting=url_setting
        )
        if status == 429 and shared is not None:
            return _throughput(str(shared), status, retry_after_s)
        return shared
    code = error.code
    where = f"code {code}" + (f"/{error.subcode}" if error.subcode is not None else "")
    message = f"{NAME}: HTTP {status}: {where}: {error.message}"
    if error.fbtrace_id:
        message += f" (fbtrace_id {error.fbtrace_id})"
    if code in THROUGHPUT_CODES:
        return _throughput(message, status, retry_after_s)
    if code == PAIR_RATE_CODE:
        return RateLimitedError(
            message,
            limit="recipient",
            status_code=status,
            retry_after_s=max(PAIR_WAIT_S, retry_after_s or 0.0),
        )
    if code == MAINTENANCE_CODE:
        return InstanceUnavailableError(
            f"{message} (business account in maintenance)",
            status_code=status,
            retry_after_s=max(MAINTENANCE_WAIT_S, retry_after_s or 0.0),
        )
    if code == 100 and error.subcode == UNKNOWN_OBJECT_SUBCODE:
        return InstanceUnavailableError(f"{message} (unknown phone number id)", status_code=status)
    if code in CREDENTIAL_CODES or 200 <= code <= 299 or status in (401, 403):
        return InstanceUnavailableError(
            f"{message} (gateway refused credentials)", status_code=status
        )
    if status < 500:
        known = _permanent(code, message, status)
        if known is not None:
            return known
    if status == 429:
        # A throttling edge in front of the Graph API, whatever the code says.
        return _throughput(message, status, retry_after_s)
    # 131000 "something went wrong", 1/2 (unknown, service down), and codes we do not
    # know: how far the request got is the HTTP status's to say, in the one shared place.
    return error_for_response(response, gateway=NAME, sensitive=sensitive, now=now)


def _permanent(code: int, message: str, status: int) -> PermanentGatewayError | None:
    """The permanent error a Graph ``code`` answered with a 4xx means, or None."""
    if code == OPT_OUT_CODE:
        return RecipientOptedOut(f"{message} (the recipient opted out)", status_code=status)
    if code == WINDOW_CLOSED_CODE:
        return WindowClosed(
            f"{message} (customer-service window closed: only a template can be sent)",
            status_code=status,
        )
    if code in TEMPLATE_ERRORS:
        kind = TemplatePaused if code == TEMPLATE_PAUSED_CODE else TemplateRejected
        return kind(f"{message} ({TEMPLATE_ERRORS[code]})", code=code, status_code=status)
    if code in PERMANENT_CODES:
        return PermanentGatewayError(message, status_code=status)
    return None


def _throughput(message: str, status: int, retry_after_s: float | None) -> RateLimitedError:
    """The number's messages-per-second cap: nothing sent, wait ``Retry-After`` or 1 s."""
    return RateLimitedError(
        message,
        limit="instance",
        status_code=status,
        retry_after_s=THROUGHPUT_WAIT_S if retry_after_s is None else retry_after_s,
    )


def recipient_digits(to: str) -> str:
    """The Cloud API's ``to``: the phone's digits (a personal JID's user part).

    Raises :class:`PermanentGatewayError` for a group JID: the Cloud API sends to
    people, so a group message can never be sent through it.
    """
    if to.endswith("@g.us"):
        raise PermanentGatewayError(f"{NAME}: the Cloud API cannot send to a group")
    return to.split("@", 1)[0].removeprefix("+")


def template_values(template: Mapping[str, Any] | None) -> list[str]:
    """The strings a template's parameters carry (a name, a code, an amount, a link): Meta
    may echo one in an error, and they are redacted like a text."""
    if template is None:
        return []
    found: list[str] = []

    def walk(value: Any, key: str | None) -> None:
        if isinstance(value, str):
            if key not in ("type", "sub_type", "code", "policy", "name"):
                found.append(value)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, list):
            for item in value:
                walk(item, key)

    walk(template.get("components"), None)
    return found


class MetaCloudClient(HttpGatewayClient):
    """A :class:`~streams.kernel.ports.Gateway` for the Meta WhatsApp Cloud API.

    The instance id is the business number's ``phone_number_id``. Owns its connection
    pool (:class:`~connectors.gateways.http_transport.HttpTransport`): opened in
    :meth:`start`, closed in :meth:`stop` (idempotent); ``async with`` does both.
    """

    name = NAME
    sends_templates = True
    """The Cloud API sends templates (:mod:`streams.kernel.templates`)."""
    url_setting = "META_GRAPH_URL"
    credential_setting = "META_ACCESS_TOKEN"
    added_path = re.compile(r"/v\d+\.\d+$")

    def __init__(self, settings: GatewaySettings) -> None:
        self._token = settings.meta_access_token.get_secret_value()
        self._labels = settings.meta_labels
        self._version = settings.meta_api_version
        super().__init__(
            settings,
            base_url=settings.meta_graph_url,
            auth_headers={"Authorization": f"Bearer {self._token}"} if self._token else {},
        )

    def messages_url(self, phone_number_id: str) -> str:
        return self._url(f"/{self._version}/{quote(phone_number_id, safe='')}/messages")

    @staticmethod
    def request_body(message: TextMessage) -> dict[str, Any]:
        """The JSON of a send: a text, or the message's template."""
        if message.template is not None:
            return {
                "messaging_product": "whatsapp",
                "recipient_type": "individual",
                "to": recipient_digits(message.to),
                "type": "template",
                "template": dict(message.template),
                "biz_opaque_callback_data": message.reference,
            }
        return {
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": recipient_digits(message.to),
            "type": "text",
            "text": {"body": message.text},
            "biz_opaque_callback_data": message.reference,
        }

    async def send_text(self, message: TextMessage) -> SendAccepted:
        """Send one text or template; the ``wamid`` becomes the gateway job id."""
        body = self.request_body(message)
        sensitive = (
            message.to,
            body["to"],
            message.text,
            self._token,
            *template_values(message.template),
        )
        response = await send_request(
            self._http,
            "POST",
            self.messages_url(message.instance_id),
            gateway=self.name,
            sensitive=sensitive,
            json_body=body,
            error_for=lambda answer: meta_error(
                answer, sensitive=sensitive, url_setting=self.url_setting
            ),
        )
        return self._accepted_wamid(response)

    def _accepted_wamid(self, response: GatewayResponse) -> SendAccepted:
        body = json_object(response) or {}
        messages = body.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        wamid = first_str(first, "id") if isinstance(first, Mapping) else None
        label = (first_str(first, "message_status") if isinstance(first, Mapping) else None) or (
            DEFAULT_LABEL
        )
        if wamid is None:
            # A 2xx without a message id: Meta took *something*; we cannot tell what.
            log.warning(
                "%s: send answered %d without a message id", self.name, response.status_code
            )
        status = map_label(label, self._labels)
        if status in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise PermanentGatewayError(
                f"{self.name}: message {wamid} answered {label!r}", status_code=response.status_code
            )
        return SendAccepted(gateway_job_id=wamid, gateway_status=label, status=status)

    async def list_for_reconciliation(
        self,
        instance_id: str,
        *,
        references: Sequence[str] = (),
        since: dt.datetime | None = None,
        before_page: object = None,
    ) -> list[ListedJob] | None:
        """The Cloud API has no message listing: uncertain outcomes end UNCERTAIN."""
        return None

    async def cancel_job(self, instance_id: str, gateway_job_id: str) -> CancelOutcome:
        """A Cloud API message cannot be cancelled."""
        return CancelOutcome.UNSUPPORTED

    async def probe_configuration(self, instance_id: str) -> str:
        """``GET /{version}/{phone_number_id}``: the token and the number, nothing sent.

        A Graph error is classified like a send's (190 refused token, 100/33 unknown
        number id: :class:`~streams.kernel.errors.InstanceUnavailableError`); a bare 404
        raises :class:`~streams.kernel.errors.GatewayMisconfigured` naming ``META_GRAPH_URL``."""
        sensitive = (self._token,)
        await send_request(
            self._http,
            "GET",
            self._url(f"/{self._version}/{quote(instance_id, safe='')}"),
            gateway=self.name,
            sensitive=sensitive,
            params={"fields": "id"},
            error_for=lambda answer: meta_error(
                answer, sensitive=sensitive, url_setting=self.url_setting
            ),
        )
        return f"the phone number {self._version}/{instance_id} answered with the token"
