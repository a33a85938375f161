"""A WhatsApp gateway simulator speaking StackZap, the ZAP API and Meta's Cloud API, with faults.

Run it as ``python -m devtools.simulator.gateway_sim --port P [--api-key K] [--token T]``
or in-process as :class:`GatewaySimulator`. It records every message it accepts
(global arrival ``seq``, api, instance, to, text, ``Idempotency-Key`` as
``reference``, the id it answered, arrival time) so tests can count what a
gateway really received, duplicates included: it does **not** deduplicate by
``Idempotency-Key``.

Gateway endpoints (``X-API-Key`` / ``Authorization: Bearer`` checked when configured):

- ``POST /v1/instances/{i}/send-queue/text`` (StackZap send) -> 201 ``{"id", "status"}``
- ``GET  /v1/instances/{i}/send-queue?page=&page_size=&status=&reference=&since=``
  (StackZap listing): ``reference`` (repeatable) keeps the jobs sent with one of
  those ``Idempotency-Key`` values (ignored under ``hide_references``), ``since``
  (ISO 8601 or epoch seconds) the jobs that arrived at or after it; the keys of
  the answer are renamed by ``listing_fields`` (e.g. ``{"items": "jobs",
  "reference": "ref"}``) to imitate a gateway that words its listing differently,
  and ``listing_shape`` answers in the seed guide's jobs-and-counts shape (``seed``)
  or in one nobody can read (``unknown``)
- ``POST /v1/instances/{i}/send-queue/{id}/cancel`` -> ``{"id", "status": "cancelled"}``
  while the job is not yet sent (again on an already-cancelled job), 409 once sent
- ``POST /v1/instances/{i}/messages`` (ZAP API send) -> 200 ``{"id", "status"}``
- ``GET /{version}/{phone_number_id}`` (Meta: the number's node) -> ``{"id"}``
- ``POST /{version}/{phone_number_id}/messages`` (Meta Cloud API send, ``version`` like
  ``v21.0``; the ZAP API's Bearer token is checked) -> 200 ``{"messaging_product",
  "contacts": [{"input", "wa_id"}], "messages": [{"id": "wamid..."}]}``; the body's
  ``biz_opaque_callback_data`` is recorded as the message's ``reference``. Its faults
  answer Graph errors ``{"error": {"message", "type", "code", "error_subcode"?,
  "fbtrace_id"}}``: rate limit 130429 (HTTP ``meta_rate_limit_http_status``, 400 by
  default), error 131000 (500), outage 2 (503 with ``Retry-After``), refused key 190
  (401), unknown instance 100/33 (400), invalid recipient 131026 (400),
  ``fail_recipients`` 2 (503), ``pair_limited_recipients`` 131056 (400),
  ``opted_out_recipients`` 131050 (400: the user stopped the business's marketing
  messages). A body of ``"type": "template"`` is checked against ``meta_templates`` (see
  "Meta templates" below); ``meta_window_closed`` recipients answer a text 131047
  (re-engagement)

Control endpoints (no auth):

- ``GET  /_sim/health``
- ``GET  /_sim/messages[?since=<seq>]``: accepted messages with ``seq > since``
- ``GET  /_sim/stats``: ``accepted``, ``requests``, ``by_outcome``, ``by_api``,
  ``distinct_references``, ``listings`` (StackZap listing requests: ``filtered`` by
  reference or since, or ``all``), ``listing_times`` (per instance, the epoch times of
  its last 10,000 listing requests)
- ``GET|POST /_sim/config``: read / partially update :class:`SimConfig`; ``outage_s``
  sets ``outage_until`` to now + N seconds; ``seed`` re-seeds the fault generator
- ``POST /_sim/reset``: forget messages, stats and config
- ``POST /_sim/jobs/status``: ``{"status", "ids"?, "instance"?, "from_status"?}``
  relabels jobs (e.g. ``"sent"`` so a cancel answers 409)
- ``POST /_sim/callbacks/emit``: ``{"id", "status", "event_id"?, "signed"?, "signed_at"?}``
  sends one status callback now (``signed_at``: epoch seconds to sign with instead of
  now, to replay an old one) and answers the body it sent, with the receiver's HTTP
  status in the ``X-Sim-Callback-Status`` header (``error`` when it could not be reached)

Status callbacks: with ``callback_url`` configured, every accepted message (both
APIs, dropped responses included: the gateway did accept them) is followed by one
signed callback per ``callback_statuses`` label, in order, each after
``callback_delay_ms``; the job is relabelled before its callback goes out, as a
real gateway's state moves first. The body is ``{"event_id", "id", "status",
"reference", "timestamp"}`` and ``X-Zap-Signature`` is
:func:`connectors.webhook.signature.sign` of it under ``callback_secret``
(``t=<unix seconds>,v2=<hex HMAC-SHA256(secret, "<t>.<gateway>." + body)>``, the
gateway being the last segment of ``callback_url``'s path). Callbacks are not
retried; a failure (no connection, non-2xx) is logged and counted in
``callbacks_failed``, a 2xx in ``callbacks_sent``. ``/_sim/callbacks/emit`` relabels
nothing, so it can replay old labels out of order or twice.

Meta messages' callbacks are Cloud API notifications (``{"object":
"whatsapp_business_account", "entry": [{"changes": [{"field": "messages", "value":
{"metadata": {"phone_number_id"}, "statuses": [{"id", "status", "timestamp",
"recipient_id", "biz_opaque_callback_data", "errors"?}]}}]}]}``, ``errors`` with
131026 on ``failed``), POSTed to ``meta_callback_url`` (else ``callback_url``) with
``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(meta_app_secret, body)>``.

Meta templates: ``meta_templates`` lists the approved templates (``{"name", "language",
"parameters": {"header"?, "body"?, "button"?: count}, "status": "APPROVED" | "PAUSED" |
"DISABLED", "max_chars"}``). A template send is answered, in this order: the code
``meta_template_errors`` names for the template (``{"<name>": 132007}``: any Graph code,
while set), 132001 (no approved template of that name in that language), 132015
(paused), 132016 (disabled), 132000 (a component's parameter count differs from the
template's), 132012 (a parameter without its value: text, currency code/amount_1000/
fallback_value, date_time fallback_value, media link or id), 132005 (the body's text
parameters longer than ``max_chars`` in all); else it is accepted and recorded with
its ``template`` object (the message's ``text`` then names it: ``[template
name/language]``). ``meta_window_closed`` (``["<to>"]``) answers a *text* to those
recipients 131047, "more than 24 hours since the customer last replied" (nothing
recorded); templates to them go through.

``pair_limited_recipients`` (``{"<to>": N}``) refuses the first N sends to that
recipient for the pair's rate (Meta 131056; the other APIs 429 ``Retry-After: 0``),
counting down like ``fail_recipients``.

``fail_recipients`` (``{"<to as received>": N}``) answers the first N sends to that
recipient 503 with ``Retry-After: 0``, after auth and the other faults, counting
down in ``GET /_sim/config``.

``reject_keys_for_instances`` (``["inst-01"]``) answers 401 to every request on
those instances, as if their API key were wrong; set it back to ``[]`` to "fix
the key" at run time. ``accept_then_502_rate`` records that fraction of sends
(they count as accepted, callbacks included) and answers them 502 with an HTML
body, like a proxy whose upstream accepted; it has its own random generator, so
the seeded sequence of the other faults does not move. ``invalid_recipients``
answers every send to those recipients 400 "invalid recipient" (permanent).

Faults are decided when a request arrives, in arrival order, from
``random.Random(seed)``: three draws per faultable request (rate limit, error,
drop) whatever the rates, so a seed gives the same sequence for the same
arrival order. Latency jitter has its own generator so it never shifts them.
By default only sends are faultable (``fault_scope="send"``) so reconciliation
can list while sends fail; ``"all"`` includes listing and cancel. An outage
answers 503 to every gateway endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import datetime
import hmac
import logging
import math
import random
import re
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import aiohttp
import orjson
import yarl
from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
)

from connectors.gateways.classify import mask_secret
from connectors.webhook.signature import sign, sign_hub
from streams.kernel.runtime.run import run_until_signalled
from streams.kernel.runtime.service import Service

log = logging.getLogger(__name__)

STACKZAP = "stackzap"
ZAPAPI = "zapapi"
META = "meta"

_SENT_LABELS = frozenset({"sent", "delivered", "read", "played", "failed", "error"})
_CANCELLED = "cancelled"
_MAX_PAGE_SIZE = 1000
_CALLBACK_TIMEOUT_S = 5.0
SIGNATURE_HEADER = "X-Zap-Signature"
HUB_SIGNATURE_HEADER = "X-Hub-Signature-256"
# Graph API error codes the simulator answers on the Meta route.
META_RATE_LIMIT = 130429
META_PAIR_RATE_LIMIT = 131056
META_UNDELIVERABLE = 131026
META_OPTED_OUT = 131050
META_UNKNOWN_ERROR = 131000
META_SERVICE_UNAVAILABLE = 2
META_INVALID_TOKEN = 190
META_INVALID_PARAMETER = 100
META_UNKNOWN_OBJECT_SUBCODE = 33
META_WINDOW_CLOSED = 131047
META_TEMPLATE_PARAMETER_COUNT = 132000
META_TEMPLATE_UNKNOWN = 132001
META_TEMPLATE_TOO_LONG = 132005
META_TEMPLATE_PARAMETER_FORMAT = 132012
META_TEMPLATE_PAUSED = 132015
META_TEMPLATE_DISABLED = 132016
META_TEMPLATE_MESSAGES = {
    132000: "Number of parameters does not match the expected number of params",
    132001: "Template name does not exist in the translation",
    132005: "Translated text too long",
    132007: "Template format character policy violated",
    132012: "Parameter format does not match format in the created template",
    132015: "Template is Paused",
    132016: "Template is Disabled",
}
CALLBACK_STATUS_HEADER = "X-Sim-Callback-Status"


@dataclasses.dataclass(slots=True)
class SimMessage:
    """One message the simulator accepted."""

    seq: int
    api: str
    instance: str
    to: str
    text: str
    reference: str | None
    id: str
    status: str
    arrived_at: float
    dropped: bool = False
    """The message was recorded but the connection was aborted instead of answering."""
    template: dict[str, Any] | None = None
    """A Meta template message's template object, as received (parameters included)."""


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http(s) URL or null")
    return value


_Rate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
"""A fraction of requests: a finite number from 0 to 1."""
_NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""Milliseconds, seconds or epoch seconds: a finite number >= 0."""
_Count = Annotated[int, Field(ge=0)]
_HttpUrl = Annotated[str, AfterValidator(_http_url)]
_ListingKey = Literal[
    "items",
    "id",
    "reference",
    "to",
    "text",
    "status",
    "created_at",
    "page",
    "page_size",
    "total",
    "counts",
    "next_page",
]


class SimTemplate(BaseModel):
    """An approved Meta template, as the simulator checks a template send against it."""

    model_config = ConfigDict(strict=True, extra="forbid", use_attribute_docstrings=True)

    name: Annotated[str, Field(min_length=1)]
    language: Annotated[str, Field(min_length=2)]
    """The language code of this translation (``pt_BR``)."""
    parameters: dict[Literal["header", "body", "button"], _Count] = Field(default_factory=dict)
    """How many parameters each component takes (``button``: all buttons' together)."""
    status: Literal["APPROVED", "PAUSED", "DISABLED"] = "APPROVED"
    max_chars: _Count = 1024
    """The body's text parameters together at most (else 132005)."""


class SimConfig(BaseModel):
    """Fault injection and behaviour, changed at run time through ``POST /_sim/config``.

    Strict: a JSON number is not a boolean nor a string a number, and an unknown key is
    refused, so a typo in a test's fault set-up fails loudly instead of injecting nothing.
    """

    model_config = ConfigDict(strict=True, extra="forbid", use_attribute_docstrings=True)

    seed: int | None = 0
    """Seed of the fault generator (``None``: unseeded); setting it re-seeds."""
    latency_ms: _NonNegative = 0.0
    """Added before every gateway answer."""
    latency_jitter_ms: _NonNegative = 0.0
    """Up to this much more latency, drawn at random."""
    error_rate: _Rate = 0.0
    """Fraction of faultable requests answered 500."""
    rate_limit_rate: _Rate = 0.0
    """Fraction of faultable requests answered 429 with ``Retry-After: retry_after_s``."""
    retry_after_s: _NonNegative = 1.0
    """``Retry-After`` of the 429s the simulator answers."""
    outage_until: _NonNegative | None = None
    """Epoch seconds until which every gateway request is answered 503."""
    drop_response_rate: _Rate = 0.0
    """Fraction of faultable requests processed (message recorded) and then aborted."""
    hide_references: bool = False
    """Listings leave out the ``reference`` of every job."""
    initial_status: Annotated[str, Field(min_length=1)] = "queued"
    """The status label a new message gets."""
    reject_instances: list[str] = Field(default_factory=list)
    """Instances the gateway does not know: answered 404 (Meta: 400, error 100 subcode 33)."""
    id_field: Literal["id", "jobId", "job_id", "messageId"] = "id"
    """Key the send answer uses for the id: ``id``, ``jobId``, ``job_id`` or ``messageId``."""
    fault_scope: Literal["send", "all"] = "send"
    """``send``: error/rate-limit/drop only on sends; ``all``: on listing and cancel too."""
    callback_url: _HttpUrl | None = None
    """Full URL status callbacks are POSTed to (e.g. ``http://h:p/v1/webhooks/zapapi``)."""
    callback_secret: str = ""
    """HMAC secret of ``X-Zap-Signature``; shown masked by ``/_sim/config``."""
    callback_statuses: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: ["sent", "delivered", "read"]
    )
    """The labels of the automatic callbacks after each accepted message, in order."""
    callback_delay_ms: _NonNegative = 50.0
    """Pause before each automatic callback."""
    fail_recipients: dict[str, _Count] = Field(default_factory=dict)
    """Recipient (``to`` as received) -> sends still to be answered 503 (transient)."""
    reject_keys_for_instances: list[str] = Field(default_factory=list)
    """Instances whose credentials are refused: every gateway request on them answers 401,
    as if the instance's API key were wrong (empty the list to "fix the key")."""
    invalid_recipients: list[str] = Field(default_factory=list)
    """Recipients (``to`` as received) every send to which is refused 400 "invalid
    recipient": a permanent, per-message failure."""
    accept_then_502_rate: _Rate = 0.0
    """Fraction of sends recorded (accepted) and then answered 502, like a proxy whose
    upstream accepted the message and timed out or broke on the way back."""
    rate_limited_instances: dict[str, _NonNegative] = Field(default_factory=dict)
    """Instance -> epoch seconds until which every request on it answers 429 with
    ``Retry-After: retry_after_s`` (a rate-limit storm on one number). Set through
    ``/_sim/config`` as ``{"rate_limited_instances": {"inst": seconds}}``; 0 ends it."""
    disconnected_instances: dict[str, _NonNegative] = Field(default_factory=dict)
    """Instance -> epoch seconds until which every request on it answers 503 "instance
    disconnected" (the phone lost its WhatsApp session). Set like ``rate_limited_instances``."""
    listing_fields: dict[_ListingKey, Annotated[str, Field(min_length=1)]] = Field(
        default_factory=dict
    )
    """StackZap listing key -> the name the answer uses instead (``items``, ``id``,
    ``reference``, ``to``, ``text``, ``status``, ``created_at``, ``page``,
    ``page_size``, ``total``, ``counts``, ``next_page``); empty: today's names."""
    listing_shape: Literal["items", "seed", "unknown"] = "items"
    """How the StackZap listing answers: ``items`` (``{"items", "page", "page_size", "total",
    "counts", "next_page"}``), ``seed`` (the seed guide's "jobs and counts": ``{"jobs":
    [{"id", "ref", ...}], "counts"}``, no pagination keys, every job on one page) or
    ``unknown`` (a shape no parser can read: ``{"result": {"encoded": "..."}}``)."""
    pair_limited_recipients: dict[str, _Count] = Field(default_factory=dict)
    """Recipient (``to`` as received) -> sends still to be refused for the sender/recipient
    pair's rate (Meta: error 131056, HTTP 400; the other APIs: 429 ``Retry-After: 0``)."""
    meta_rate_limit_http_status: Literal[400, 429] = 400
    """HTTP status of Meta's throughput error 130429 (Meta documents 400; some edges 429)."""
    meta_callback_url: _HttpUrl | None = None
    """Where Meta-shaped status notifications go (e.g. ``http://h:p/v1/webhooks/meta``);
    None: ``callback_url``."""
    meta_app_secret: str = ""
    """The app secret of ``X-Hub-Signature-256`` on Meta notifications; shown masked."""
    meta_templates: list[SimTemplate] = Field(default_factory=list)
    """The approved Meta templates a template send is checked against."""
    meta_template_errors: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    """Template name -> the Graph error code every send of it is answered (400), while set."""
    meta_window_closed: list[str] = Field(default_factory=list)
    """Recipients whose customer-service window is closed: a text to them answers 131047."""
    opted_out_recipients: list[str] = Field(default_factory=list)
    """Meta only: recipients (``to`` as received) who stopped the business's marketing
    messages; every Cloud API send to them is refused 400, error 131050 (nothing sent).
    The other APIs have no such answer and send as usual."""


_INSTANCE_WINDOWS = ("rate_limited_instances", "disconnected_instances")
"""Updates give these as seconds from now (0 ends one); the config holds epoch seconds."""
_SECONDS = TypeAdapter(_NonNegative)
_WINDOWS = TypeAdapter(dict[str, _NonNegative])


class SimConfigError(ValueError):
    """A ``/_sim/config`` update that does not make sense."""


def _problem(exc: ValidationError, key: str | None = None) -> str:
    """A validation error as one sentence naming the key: ``error_rate must be ...``."""
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"] if part != "[key]"]
    if key is not None:
        loc.insert(0, key)
    where = loc[0] + "".join(f"[{part}]" for part in loc[1:]) if loc else "config"
    if error["type"] == "extra_forbidden":
        return f"unknown config key {loc[0]!r}"
    # pydantic's "Input should be ...", "String should have ..." read as "<key> must ...".
    message = re.sub(r"^[A-Z][a-z]+ should ", "must ", str(error["msg"]))
    return f"{where} {message.removeprefix('Value error, ')}"


def _checked(key: str, adapter: TypeAdapter[Any], value: Any) -> Any:
    try:
        return adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        raise SimConfigError(_problem(exc, key)) from None


def _updated_config(current: SimConfig, changes: Mapping[str, Any]) -> SimConfig:
    """A copy of ``current`` with ``changes`` validated and applied (all or nothing).

    Besides the fields, ``outage_s`` sets ``outage_until`` to now + N seconds (0: none),
    and the instance windows take seconds from now and merge into the current ones.
    """
    values = current.model_dump()  # new containers: the running config is never shared
    now = time.time()
    for key, value in changes.items():
        if key == "outage_s":
            seconds = _checked(key, _SECONDS, value)
            values["outage_until"] = now + seconds if seconds > 0 else None
        elif key in _INSTANCE_WINDOWS:
            until = dict(values[key])
            for instance, span in _checked(key, _WINDOWS, value).items():
                if span > 0:
                    until[instance] = now + span
                else:
                    until.pop(instance, None)
            values[key] = until
        else:
            values[key] = value
    try:
        return SimConfig.model_validate(values)
    except ValidationError as exc:
        raise SimConfigError(_problem(exc)) from None


def _shown_config(cfg: SimConfig) -> dict[str, Any]:
    """The config as ``/_sim/config`` answers it: the callback secret masked."""
    shown = cfg.model_dump()
    shown["callback_secret"] = mask_secret(cfg.callback_secret)
    shown["meta_app_secret"] = mask_secret(cfg.meta_app_secret)
    return shown


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, headers=headers, content_type="application/json"
    )


def _seconds_header(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:.3f}"


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()


_BAD_SINCE = object()


def _since(raw: str | None) -> float | None | object:
    """The listing's ``since`` as epoch seconds; None when absent; ``_BAD_SINCE`` if unreadable."""
    if raw is None or not raw.strip():
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        parsed = datetime.datetime.fromisoformat(raw.strip().replace(" ", "+"))
    except ValueError:
        return _BAD_SINCE
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


_Send = tuple[str, str, str | None, dict[str, Any] | None]
"""A send as read: ``(to, text, reference, template)``; ``template`` only on Meta's."""


def _language(template: Mapping[str, Any]) -> str:
    language = template.get("language")
    if isinstance(language, Mapping):
        language = language.get("code")
    return language if isinstance(language, str) else "?"


def _parameters(template: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The parameters the send gives each component type (all buttons' together)."""
    given: dict[str, list[Any]] = {"header": [], "body": [], "button": []}
    components = template.get("components")
    for component in components if isinstance(components, list) else []:
        if not isinstance(component, Mapping):
            continue
        parameters = component.get("parameters")
        kind = component.get("type")
        if isinstance(kind, str) and kind.lower() in given and isinstance(parameters, list):
            given[kind.lower()].extend(parameters)
    return given


def _well_formed(parameter: Any) -> bool:
    """A parameter with its value in the shape its type needs (else Meta's 132012)."""
    if not isinstance(parameter, Mapping):
        return False
    kind = parameter.get("type")
    value = parameter.get(kind) if isinstance(kind, str) else None
    if kind in ("text", "payload", "coupon_code"):
        return isinstance(value, str) and bool(value.strip())
    if not isinstance(value, Mapping):
        return False
    if kind == "currency":
        return (
            isinstance(value.get("fallback_value"), str)
            and isinstance(value.get("code"), str)
            and type(value.get("amount_1000")) is int
        )
    if kind == "date_time":
        return isinstance(value.get("fallback_value"), str)
    if kind in ("image", "document", "video"):
        return isinstance(value.get("link"), str) or isinstance(value.get("id"), str)
    return kind == "action"


def template_error(cfg: SimConfig, template: Mapping[str, Any]) -> int | None:
    """The Graph error code a template send gets (see the module's "Meta templates"), or
    None when it is accepted."""
    name = template.get("name")
    if isinstance(name, str) and name in cfg.meta_template_errors:
        return cfg.meta_template_errors[name]
    language = _language(template)
    approved = next(
        (t for t in cfg.meta_templates if t.name == name and t.language == language), None
    )
    if approved is None:
        return META_TEMPLATE_UNKNOWN
    if approved.status == "PAUSED":
        return META_TEMPLATE_PAUSED
    if approved.status == "DISABLED":
        return META_TEMPLATE_DISABLED
    given = _parameters(template)
    expected = {str(kind): count for kind, count in approved.parameters.items()}
    if any(len(given[kind]) != expected.get(kind, 0) for kind in given):
        return META_TEMPLATE_PARAMETER_COUNT
    if not all(_well_formed(p) for parameters in given.values() for p in parameters):
        return META_TEMPLATE_PARAMETER_FORMAT
    body_chars = sum(
        len(p["text"]) for p in given["body"] if p.get("type") == "text" and "text" in p
    )
    if body_chars > approved.max_chars:
        return META_TEMPLATE_TOO_LONG
    return None


@dataclasses.dataclass(slots=True)
class _Decision:
    rate_limited: bool
    error: bool
    drop: bool


_NO_FAULT = _Decision(False, False, False)


class GatewaySimulator(Service):
    """An in-process (or ``python -m``) aiohttp server imitating both gateways.

    A :class:`~streams.kernel.runtime.service.Service`: ``start()`` binds ``host`` and
    ``port`` (0: a free one, then :attr:`port`), ``stop()`` lets requests in flight
    finish, cancels pending callbacks and closes the callbacks' HTTP session; both are
    idempotent and ``async with`` does both.
    """

    name = "gateway-sim"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        token: str | None = None,
        seed: int | None = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__()
        self._api_key = api_key or None
        self._bearer = f"Bearer {token}" if token else None
        self._default_seed = seed
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._callback_tasks: set[asyncio.Task[None]] = set()
        self._host = host
        self._port = port
        self._reset_state()

    def _reset_state(self) -> None:
        self._config = SimConfig(seed=self._default_seed)
        self._fault_rng = random.Random(self._default_seed)
        self._latency_rng = random.Random(self._default_seed)
        # Its own generator: enabling 502s never shifts the other faults' sequence.
        self._proxy_rng = random.Random(self._default_seed)
        self._messages: list[SimMessage] = []
        self._by_id: dict[str, SimMessage] = {}
        self._queues: dict[str, list[SimMessage]] = {}
        self._counts: dict[str, collections.Counter[str]] = {}
        self._requests = 0
        self._sends_open = 0
        self._peak_sends_open = 0
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._callbacks_sent = 0
        self._callbacks_failed = 0
        self._listings: collections.Counter[str] = collections.Counter()
        self._listing_times: dict[str, collections.deque[float]] = {}
        """Per instance, the epoch times of its last listing requests (bounded)."""

    # --- lifecycle -----------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Base URL to give both clients (``STACKZAP_API_URL`` and ``ZAP_API_URL``)."""
        return f"http://{self._host}:{self._port}"

    async def on_start(self) -> None:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/v1/instances/{instance}/send-queue/text", self._stackzap_send)
        app.router.add_get("/v1/instances/{instance}/send-queue", self._stackzap_list)
        app.router.add_post(
            "/v1/instances/{instance}/send-queue/{job_id}/cancel", self._stackzap_cancel
        )
        app.router.add_post("/v1/instances/{instance}/messages", self._zapapi_send)
        app.router.add_post(r"/{version:v\d+\.\d+}/{instance}/messages", self._meta_send)
        app.router.add_get(r"/{version:v\d+\.\d+}/{instance}", self._meta_number)
        app.router.add_get("/_sim/health", self._health)
        app.router.add_get("/_sim/messages", self._messages_endpoint)
        app.router.add_get("/_sim/stats", self._stats_endpoint)
        app.router.add_get("/_sim/config", self._config_get)
        app.router.add_post("/_sim/config", self._config_post)
        app.router.add_post("/_sim/reset", self._reset_endpoint)
        app.router.add_post("/_sim/jobs/status", self._jobs_status_endpoint)
        app.router.add_post("/_sim/callbacks/emit", self._callbacks_emit_endpoint)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port, backlog=1024)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=_CALLBACK_TIMEOUT_S)
        )
        self._port = int(runner.addresses[0][1])
        log.info(
            "gateway simulator listening on http://%s:%d (api key %s, token %s)",
            self._host,
            self._port,
            mask_secret(self._api_key or "") or "off",
            "on" if self._bearer else "off",
        )

    async def on_stop(self) -> None:
        runner, self._runner = self._runner, None
        try:
            if runner is not None:
                # Requests in flight finish first; they may still schedule callbacks.
                await runner.cleanup()
        finally:
            await self._cancel_callbacks()
            session, self._session = self._session, None
            if session is not None:
                await session.close()

    def summary(self) -> str:
        return f"{self._requests} requests, {len(self._messages)} messages accepted"

    async def _cancel_callbacks(self) -> None:
        tasks = list(self._callback_tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- in-process control (the /_sim endpoints call these) ---------------------------

    @property
    def config(self) -> SimConfig:
        return self._config

    @property
    def messages(self) -> Sequence[SimMessage]:
        """Every accepted message, in arrival order (``seq`` = index + 1)."""
        return self._messages

    def configure(self, **changes: Any) -> SimConfig:
        """Validate and apply a partial config update; raises :class:`SimConfigError`."""
        cfg = _updated_config(self._config, changes)
        if "seed" in changes:
            self._fault_rng = random.Random(cfg.seed)
            self._latency_rng = random.Random(cfg.seed)
            self._proxy_rng = random.Random(cfg.seed)
        self._config = cfg
        return cfg

    def reset(self) -> None:
        # Callbacks still scheduled belong to the forgotten messages and config.
        for task in self._callback_tasks:
            task.cancel()
        self._reset_state()

    def stats(self) -> dict[str, Any]:
        by_api = collections.Counter(m.api for m in self._messages)
        return {
            "accepted": len(self._messages),
            "requests": self._requests,
            "peak_concurrent_sends": self._peak_sends_open,
            "by_outcome": dict(self._outcomes),
            "by_api": dict(by_api),
            "distinct_references": len({m.reference for m in self._messages}),
            "callbacks_sent": self._callbacks_sent,
            "callbacks_failed": self._callbacks_failed,
            "listings": dict(self._listings),
            "listing_times": {i: list(t) for i, t in self._listing_times.items()},
        }

    def set_job_status(
        self,
        status: str,
        *,
        ids: Sequence[str] | None = None,
        instance: str | None = None,
        from_status: str | None = None,
    ) -> int:
        """Relabel matching jobs; returns how many changed."""
        if ids is not None:
            candidates = [self._by_id[i] for i in ids if i in self._by_id]
        else:
            candidates = self._messages
        updated = 0
        for msg in candidates:
            if instance is not None and msg.instance != instance:
                continue
            if from_status is not None and msg.status != from_status:
                continue
            self._relabel(msg, status)
            updated += 1
        return updated

    def _relabel(self, msg: SimMessage, status: str) -> None:
        if msg.api == STACKZAP:
            counts = self._counts[msg.instance]
            counts[msg.status] -= 1
            if counts[msg.status] <= 0:
                del counts[msg.status]
            counts[status] += 1
        msg.status = status

    # --- the request path ---------------------------------------------------------------

    def _decide(self, faultable: bool) -> _Decision:
        if not faultable:
            return _NO_FAULT
        cfg = self._config
        rng = self._fault_rng
        # Always three draws, so changing one rate never shifts the others' sequence.
        r_limit, r_error, r_drop = rng.random(), rng.random(), rng.random()
        return _Decision(
            rate_limited=r_limit < cfg.rate_limit_rate,
            error=r_error < cfg.error_rate,
            drop=r_drop < cfg.drop_response_rate,
        )

    async def _prelude(
        self, request: web.Request, *, api: str, send: bool
    ) -> tuple[web.Response | None, _Decision]:
        """Outage, latency, auth, rate limit, error and unknown instance, in that order."""
        self._requests += 1
        cfg = self._config
        if cfg.outage_until is not None:
            remaining = cfg.outage_until - time.time()
            if remaining > 0:
                self._outcomes["outage"] += 1
                retry_after = {"Retry-After": str(max(1, math.ceil(remaining)))}
                if api == META:
                    return (
                        self._error(
                            META,
                            503,
                            "Service temporarily unavailable",
                            retry_after,
                            code=META_SERVICE_UNAVAILABLE,
                        ),
                        _NO_FAULT,
                    )
                return (
                    _json(
                        {"error": "service unavailable", "message": "service unavailable"},
                        503,
                        retry_after,
                    ),
                    _NO_FAULT,
                )
        decision = self._decide(send or cfg.fault_scope == "all")
        delay_ms = cfg.latency_ms
        if cfg.latency_jitter_ms > 0:
            delay_ms += self._latency_rng.uniform(0, cfg.latency_jitter_ms)
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        if api == STACKZAP:
            key = request.headers.get("X-API-Key")
            authorized = self._api_key is None or (
                key is not None and hmac.compare_digest(key, self._api_key)
            )
        else:
            header = request.headers.get("Authorization")
            authorized = self._bearer is None or (
                header is not None and hmac.compare_digest(header, self._bearer)
            )
        if not authorized or request.match_info["instance"] in cfg.reject_keys_for_instances:
            self._outcomes["unauthorized"] += 1
            return (
                self._error(api, 401, "Invalid OAuth access token", code=META_INVALID_TOKEN)
                if api == META
                else self._error(api, 401, "unauthorized")
            ), decision
        instance = request.match_info["instance"]
        now = time.time()
        if cfg.disconnected_instances.get(instance, 0.0) > now:
            self._outcomes["disconnected"] += 1
            return self._error(api, 503, "instance disconnected"), decision
        if cfg.rate_limited_instances.get(instance, 0.0) > now:
            self._outcomes["rate_limited"] += 1
            if api == META:
                status = cfg.meta_rate_limit_http_status
                return self._error(META, status, "Rate limit hit", code=META_RATE_LIMIT), decision
            return (
                self._error(
                    api, 429, "rate limited", {"Retry-After": _seconds_header(cfg.retry_after_s)}
                ),
                decision,
            )
        if decision.rate_limited:
            self._outcomes["rate_limited"] += 1
            if api == META:
                status = cfg.meta_rate_limit_http_status
                limited = self._error(META, status, "Rate limit hit", code=META_RATE_LIMIT)
                return limited, decision
            return (
                self._error(
                    api, 429, "rate limited", {"Retry-After": _seconds_header(cfg.retry_after_s)}
                ),
                decision,
            )
        if decision.error:
            self._outcomes["error"] += 1
            return self._error(
                api, 500, "simulated internal error", code=META_UNKNOWN_ERROR
            ), decision
        if request.match_info["instance"] in cfg.reject_instances:
            self._outcomes["unknown_instance"] += 1
            if api == META:
                instance = request.match_info["instance"]
                unknown = self._error(
                    META,
                    400,
                    f"Unsupported post request. Object with ID '{instance}' does not exist",
                    code=META_INVALID_PARAMETER,
                    subcode=META_UNKNOWN_OBJECT_SUBCODE,
                )
                return unknown, decision
            return self._error(api, 404, "unknown instance"), decision
        return None, decision

    @staticmethod
    def _error(
        api: str,
        status: int,
        message: str,
        headers: Mapping[str, str] | None = None,
        *,
        code: int | None = None,
        subcode: int | None = None,
    ) -> web.Response:
        """An error answer in the API's own shape; ``code``/``subcode``: Meta's Graph codes."""
        body: dict[str, Any]
        if api == META:
            error: dict[str, Any] = {
                "message": f"(#{code}) {message}",
                "type": "OAuthException",
                "code": META_UNKNOWN_ERROR if code is None else code,
                "fbtrace_id": uuid.uuid4().hex[:22],
            }
            if subcode is not None:
                error["error_subcode"] = subcode
            body = {"error": error}
        elif api == STACKZAP:
            body = {"error": message}
        else:
            body = {"message": message, "code": status}
        return _json(body, status, headers)

    async def _read_send(self, request: web.Request, api: str) -> _Send | web.Response:
        """``(to, text, reference, template)`` of a send, or the 4xx answer to a bad one.

        The reference is the ``Idempotency-Key`` header, or for Meta the body's
        ``biz_opaque_callback_data`` (the Cloud API has no idempotency key).
        """
        invalid = META_INVALID_PARAMETER
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            self._outcomes["bad_request"] += 1
            return self._error(api, 400, "body is not JSON", code=invalid)
        if not isinstance(body, dict):
            self._outcomes["bad_request"] += 1
            return self._error(api, 400, "body is not a JSON object", code=invalid)
        if api == META:
            return self._read_meta_send(body)
        if api == ZAPAPI and body.get("type") != "text":
            self._outcomes["bad_request"] += 1
            return self._error(api, 422, "type must be 'text'")
        to, text = body.get("to"), body.get("text")
        if not isinstance(to, str) or not to or not isinstance(text, str) or not text:
            self._outcomes["bad_request"] += 1
            return self._error(api, 400, "'to' and 'text' must be non-empty strings")
        return to, text, request.headers.get("Idempotency-Key"), None

    def _read_meta_send(self, body: Mapping[str, Any]) -> _Send | web.Response:
        problem: str | None = None
        text_object = body.get("text")
        to = body.get("to")
        text = text_object.get("body") if isinstance(text_object, dict) else None
        reference = body.get("biz_opaque_callback_data")
        kind = body.get("type", "text")
        template = body.get("template")
        if kind == "template" and isinstance(template, dict):
            text = f"[template {template.get('name')}/{_language(template)}]"
        if body.get("messaging_product") != "whatsapp":
            problem = "messaging_product must be 'whatsapp'"
        elif kind not in ("text", "template"):
            problem = "type must be 'text' or 'template'"
        elif kind == "template" and not (
            isinstance(template, dict) and isinstance(template.get("name"), str)
        ):
            problem = "'template' must be an object with a name and a language"
        elif not isinstance(to, str) or not to.isdigit():
            problem = "'to' must be the recipient's digits"
        elif not isinstance(text, str) or not text:
            problem = "'text.body' must be a non-empty string"
        elif reference is not None and not isinstance(reference, str):
            problem = "'biz_opaque_callback_data' must be a string"
        if problem is not None:
            self._outcomes["bad_request"] += 1
            return self._error(META, 400, f"Invalid parameter: {problem}", code=100)
        assert isinstance(to, str) and isinstance(text, str)
        sent_template = template if kind == "template" and isinstance(template, dict) else None
        return to, text, reference if isinstance(reference, str) else None, sent_template

    def _record(
        self,
        request: web.Request,
        api: str,
        to: str,
        text: str,
        reference: str | None,
        template: dict[str, Any] | None = None,
    ) -> SimMessage:
        instance = request.match_info["instance"]
        msg = SimMessage(
            seq=len(self._messages) + 1,
            api=api,
            instance=instance,
            to=to,
            text=text,
            reference=reference,
            id=("wamid." + uuid.uuid4().hex) if api == META else uuid.uuid4().hex,
            status=self._config.initial_status,
            arrived_at=time.time(),
            template=template,
        )
        self._messages.append(msg)
        self._by_id[msg.id] = msg
        if api == STACKZAP:
            self._queues.setdefault(instance, []).append(msg)
            self._counts.setdefault(instance, collections.Counter())[msg.status] += 1
        return msg

    def _answer(
        self, request: web.Request, decision: _Decision, outcome: str, response: web.Response
    ) -> web.Response:
        if decision.drop:
            self._outcomes["dropped"] += 1
            transport = request.transport
            if transport is not None:
                # The client sees the connection close without a response.
                transport.close()
            return response
        self._outcomes[outcome] += 1
        return response

    async def _send(self, request: web.Request, api: str, ok_status: int) -> web.Response:
        # How many sends the gateway holds at once (``peak_concurrent_sends`` in the stats):
        # what a client's connection pool lets through, whatever the machine's speed.
        self._sends_open += 1
        self._peak_sends_open = max(self._peak_sends_open, self._sends_open)
        try:
            return await self._send_once(request, api, ok_status)
        finally:
            self._sends_open -= 1

    async def _send_once(self, request: web.Request, api: str, ok_status: int) -> web.Response:
        early, decision = await self._prelude(request, api=api, send=True)
        if early is not None:
            return early
        parsed = await self._read_send(request, api)
        if isinstance(parsed, web.Response):
            return parsed
        to, text, reference, template = parsed
        if to in self._config.invalid_recipients:
            self._outcomes["invalid_recipient"] += 1
            if api == META:
                return self._error(META, 400, "Message undeliverable", code=META_UNDELIVERABLE)
            return self._error(api, 400, "invalid recipient")
        if api == META and to in self._config.opted_out_recipients:
            self._outcomes["opted_out"] += 1
            return self._error(
                META,
                400,
                "Unable to deliver the message. This recipient has chosen to stop receiving "
                "marketing messages on WhatsApp from your business",
                code=META_OPTED_OUT,
            )
        remaining = self._config.fail_recipients.get(to, 0)
        if remaining > 0:
            self._config.fail_recipients[to] = remaining - 1
            self._outcomes["recipient_failed"] += 1
            return self._error(
                api,
                503,
                "recipient temporarily unavailable",
                {"Retry-After": "0"},
                code=META_SERVICE_UNAVAILABLE,
            )
        remaining = self._config.pair_limited_recipients.get(to, 0)
        if remaining > 0:
            self._config.pair_limited_recipients[to] = remaining - 1
            self._outcomes["pair_rate_limited"] += 1
            if api == META:
                return self._error(
                    META,
                    400,
                    "Pair rate limit hit: too many messages sent to this recipient",
                    code=META_PAIR_RATE_LIMIT,
                )
            return self._error(api, 429, "recipient rate limited", {"Retry-After": "0"})
        if api == META:
            refused = self._meta_content_refusal(to, template)
            if refused is not None:
                return refused
        msg = self._record(request, api, to, text, reference, template)
        msg.dropped = decision.drop
        self._schedule_callbacks(msg)
        rate = self._config.accept_then_502_rate
        if not decision.drop and rate > 0 and self._proxy_rng.random() < rate:
            # Accepted upstream, but the proxy in front answers 502.
            self._outcomes["accepted_then_502"] += 1
            return web.Response(
                text="<html><body><h1>502 Bad Gateway</h1></body></html>",
                status=502,
                content_type="text/html",
            )
        body: dict[str, Any]
        if api == META:
            body = {
                "messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": msg.id}],
            }
        else:
            body = {self._config.id_field: msg.id, "status": msg.status}
        return self._answer(request, decision, "accepted", _json(body, ok_status))

    def _meta_content_refusal(
        self, to: str, template: dict[str, Any] | None
    ) -> web.Response | None:
        """131047 for a text to a closed window; a template's error code; None: accept."""
        if template is None:
            if to not in self._config.meta_window_closed:
                return None
            self._outcomes["window_closed"] += 1
            return self._error(
                META,
                400,
                "Re-engagement message: more than 24 hours have passed since the customer "
                "last replied to this number",
                code=META_WINDOW_CLOSED,
            )
        code = template_error(self._config, template)
        if code is None:
            return None
        self._outcomes[f"template_{code}"] += 1
        message = META_TEMPLATE_MESSAGES.get(code, "Template error")
        return self._error(META, 400, message, code=code)

    async def _stackzap_send(self, request: web.Request) -> web.Response:
        return await self._send(request, STACKZAP, 201)

    async def _zapapi_send(self, request: web.Request) -> web.Response:
        return await self._send(request, ZAPAPI, 200)

    async def _meta_send(self, request: web.Request) -> web.Response:
        return await self._send(request, META, 200)

    async def _meta_number(self, request: web.Request) -> web.Response:
        """The phone number's node (what ``zapstream doctor`` and the worker's start-up
        check read): ``{"id"}``, after the same auth and unknown-instance answers."""
        early, decision = await self._prelude(request, api=META, send=False)
        if early is not None:
            return early
        return self._answer(
            request, decision, "number_read", _json({"id": request.match_info["instance"]})
        )

    async def _stackzap_list(self, request: web.Request) -> web.Response:
        early, decision = await self._prelude(request, api=STACKZAP, send=False)
        if early is not None:
            return early
        try:
            page = int(request.query.get("page", "1"))
            page_size = int(request.query.get("page_size", "100"))
        except ValueError:
            self._outcomes["bad_request"] += 1
            return self._error(STACKZAP, 400, "page and page_size must be integers")
        if page < 1 or not 1 <= page_size <= _MAX_PAGE_SIZE:
            self._outcomes["bad_request"] += 1
            return self._error(STACKZAP, 400, f"page >= 1 and 1 <= page_size <= {_MAX_PAGE_SIZE}")
        since = _since(request.query.get("since"))
        if since is _BAD_SINCE:
            self._outcomes["bad_request"] += 1
            return self._error(STACKZAP, 400, "since must be ISO 8601 or epoch seconds")
        instance = request.match_info["instance"]
        jobs: Sequence[SimMessage] = self._queues.get(instance, [])
        label = request.query.get("status")
        if label is not None:
            jobs = [j for j in jobs if j.status == label]
        references = set(request.query.getall("reference", []))
        # A gateway that hides references does not know them either: it cannot filter
        # by them, and ignores the parameter (the caller must match by content).
        if references and not self._config.hide_references:
            jobs = [j for j in jobs if j.reference in references]
        if isinstance(since, float):
            jobs = [j for j in jobs if j.arrived_at >= since]
        shape = self._config.listing_shape
        start = (page - 1) * page_size
        # The seed's shape says nothing of pages: every job is on the one page.
        chunk = jobs if shape == "seed" else jobs[start : start + page_size]
        hide = self._config.hide_references
        name = self._config.listing_fields.get
        reference_name = "ref" if shape == "seed" else name("reference", "reference")
        items = []
        for job in chunk:
            item: dict[str, Any] = {
                name("id", "id"): job.id,
                name("to", "to"): job.to,
                name("text", "text"): job.text,
                name("status", "status"): job.status,
                name("created_at", "created_at"): _iso(job.arrived_at),
            }
            if not hide:
                item[reference_name] = job.reference
            items.append(item)
        counts = dict(self._counts.get(instance, {}))
        body: dict[str, Any]
        if shape == "seed":
            body = {"jobs": items, "counts": counts}
        elif shape == "unknown":
            body = {"result": {"encoded": "eyJqb2JzIjogW119"}, "ok": True}
        else:
            body = {
                name("items", "items"): items,
                name("page", "page"): page,
                name("page_size", "page_size"): page_size,
                name("total", "total"): len(jobs),
                name("counts", "counts"): counts,
                name("next_page", "next_page"): (
                    page + 1 if start + page_size < len(jobs) else None
                ),
            }
        self._listings["filtered" if references or since is not None else "all"] += 1
        self._listing_times.setdefault(instance, collections.deque(maxlen=10_000)).append(
            time.time()
        )
        return self._answer(request, decision, "listed", _json(body))

    async def _stackzap_cancel(self, request: web.Request) -> web.Response:
        early, decision = await self._prelude(request, api=STACKZAP, send=False)
        if early is not None:
            return early
        job = self._by_id.get(request.match_info["job_id"])
        if job is None or job.api != STACKZAP or job.instance != request.match_info["instance"]:
            self._outcomes["not_found"] += 1
            return self._error(STACKZAP, 404, "unknown job")
        if job.status.lower() in _SENT_LABELS:
            self._outcomes["cancel_conflict"] += 1
            return self._error(STACKZAP, 409, f"job already {job.status}")
        if job.status != _CANCELLED:
            self._relabel(job, _CANCELLED)
        return self._answer(
            request, decision, "cancelled", _json({"id": job.id, "status": _CANCELLED})
        )

    # --- status callbacks -------------------------------------------------------------------

    def _callback_target(self, msg: SimMessage) -> tuple[str | None, str]:
        """Where ``msg``'s callbacks go and the secret they are signed with."""
        cfg = self._config
        if msg.api == META:
            return cfg.meta_callback_url or cfg.callback_url, cfg.meta_app_secret
        return cfg.callback_url, cfg.callback_secret

    def _schedule_callbacks(self, msg: SimMessage) -> None:
        cfg = self._config
        url, secret = self._callback_target(msg)
        if url is None or not cfg.callback_statuses or self._session is None:
            return
        task = asyncio.create_task(
            self._run_callbacks(
                msg,
                url=url,
                secret=secret,
                statuses=list(cfg.callback_statuses),
                delay_s=cfg.callback_delay_ms / 1000,
            ),
            name=f"sim-callbacks-{msg.id}",
        )
        self._callback_tasks.add(task)
        task.add_done_callback(self._callback_tasks.discard)

    async def _run_callbacks(
        self, msg: SimMessage, *, url: str, secret: str, statuses: list[str], delay_s: float
    ) -> None:
        for status in statuses:
            await asyncio.sleep(delay_s)
            if msg.status == _CANCELLED:
                return  # cancelled before it went out: a gateway reports nothing more
            if msg.status != status:
                self._relabel(msg, status)
            await self.emit_callback(msg, status, url=url, secret=secret)

    def callback_body(
        self, msg: SimMessage, status: str, *, event_id: str | None = None
    ) -> dict[str, Any]:
        if msg.api == META:
            return self.meta_notification(msg, status)
        return {
            "event_id": event_id or uuid.uuid4().hex,
            "id": msg.id,
            "status": status,
            "reference": msg.reference,
            "timestamp": round(time.time(), 3),
        }

    @staticmethod
    def meta_notification(msg: SimMessage, status: str) -> dict[str, Any]:
        """A Cloud API status notification for ``msg`` (``errors`` on ``failed``)."""
        item: dict[str, Any] = {
            "id": msg.id,
            "status": status,
            "timestamp": str(int(time.time())),
            "recipient_id": msg.to,
        }
        if msg.reference is not None:
            item["biz_opaque_callback_data"] = msg.reference
        if status == "failed":
            item["errors"] = [
                {
                    "code": META_UNDELIVERABLE,
                    "title": "Message undeliverable",
                    "message": "Message undeliverable",
                    "error_data": {"details": "Message Undeliverable."},
                }
            ]
        return {
            "object": "whatsapp_business_account",
            "entry": [
                {
                    "id": "sim-waba",
                    "changes": [
                        {
                            "field": "messages",
                            "value": {
                                "messaging_product": "whatsapp",
                                "metadata": {
                                    "display_phone_number": msg.instance,
                                    "phone_number_id": msg.instance,
                                },
                                "statuses": [item],
                            },
                        }
                    ],
                }
            ],
        }

    async def emit_callback(
        self,
        msg: SimMessage,
        status: str,
        *,
        url: str,
        secret: str,
        event_id: str | None = None,
        signed: bool = True,
        signed_at: int | None = None,
    ) -> tuple[dict[str, Any], int | None]:
        """POST one callback; return the body sent and the receiver's status (None: no answer).

        Never raises for the receiver's failures: they are logged and counted.
        """
        body = self.callback_body(msg, status, event_id=event_id)
        raw = orjson.dumps(body)
        headers = {"Content-Type": "application/json"}
        if signed and msg.api == META:
            headers[HUB_SIGNATURE_HEADER] = sign_hub(secret, raw)
        elif signed:
            # v2 names the gateway: the last segment of the webhook path it is POSTed to.
            gateway = yarl.URL(url).path.rstrip("/").rsplit("/", 1)[-1]
            headers[SIGNATURE_HEADER] = sign(secret, raw, gateway=gateway, timestamp=signed_at)
        session = self._session
        if session is None:
            raise RuntimeError("GatewaySimulator is not started")
        try:
            async with session.post(url, data=raw, headers=headers) as response:
                await response.read()
                answered: int | None = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            answered = None
            self._callbacks_failed += 1
            log.warning("callback %r for job %s failed: %s", status, msg.id, type(exc).__name__)
        else:
            if response.ok:
                self._callbacks_sent += 1
            else:
                self._callbacks_failed += 1
                log.warning(
                    "callback %r for job %s answered HTTP %d", status, msg.id, response.status
                )
        return body, answered

    # --- control endpoints ----------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return _json({"ok": True, "port": self._port})

    async def _messages_endpoint(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            return _json({"error": "since must be an integer"}, 400)
        return _json(self._messages[max(0, since) :])

    async def _stats_endpoint(self, request: web.Request) -> web.Response:
        return _json(self.stats())

    async def _config_get(self, request: web.Request) -> web.Response:
        return _json(_shown_config(self._config))

    async def _config_post(self, request: web.Request) -> web.Response:
        try:
            changes = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _json({"error": "body is not JSON"}, 400)
        if not isinstance(changes, dict):
            return _json({"error": "body is not a JSON object"}, 400)
        try:
            cfg = self.configure(**changes)
        except SimConfigError as exc:
            return _json({"error": str(exc)}, 400)
        return _json(_shown_config(cfg))

    async def _reset_endpoint(self, request: web.Request) -> web.Response:
        self.reset()
        return _json({"ok": True})

    async def _jobs_status_endpoint(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _json({"error": "body is not JSON"}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("status"), str):
            return _json({"error": "need {'status': str}"}, 400)
        ids = body.get("ids")
        instance = body.get("instance")
        from_status = body.get("from_status")
        if ids is not None and (
            not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)
        ):
            return _json({"error": "ids must be a list of strings"}, 400)
        if instance is not None and not isinstance(instance, str):
            return _json({"error": "instance must be a string"}, 400)
        if from_status is not None and not isinstance(from_status, str):
            return _json({"error": "from_status must be a string"}, 400)
        updated = self.set_job_status(
            body["status"], ids=ids, instance=instance, from_status=from_status
        )
        return _json({"updated": updated})

    async def _callbacks_emit_endpoint(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _json({"error": "body is not JSON"}, 400)
        if not isinstance(body, dict):
            return _json({"error": "body is not a JSON object"}, 400)
        job_id, status = body.get("id"), body.get("status")
        event_id, signed = body.get("event_id"), body.get("signed", True)
        if not isinstance(job_id, str) or not isinstance(status, str) or not status:
            return _json({"error": "need {'id': str, 'status': str}"}, 400)
        if event_id is not None and not isinstance(event_id, str):
            return _json({"error": "event_id must be a string"}, 400)
        if not isinstance(signed, bool):
            return _json({"error": "signed must be a boolean"}, 400)
        signed_at = body.get("signed_at")
        if signed_at is not None and (
            isinstance(signed_at, bool) or not isinstance(signed_at, int)
        ):
            return _json({"error": "signed_at must be an integer (epoch seconds)"}, 400)
        msg = self._by_id.get(job_id)
        if msg is None:
            return _json({"error": "unknown job"}, 404)
        url, secret = self._callback_target(msg)
        if url is None:
            return _json({"error": "callback_url is not configured"}, 409)
        sent, answered = await self.emit_callback(
            msg,
            status,
            url=url,
            secret=secret,
            event_id=event_id,
            signed=signed,
            signed_at=signed_at,
        )
        header = "error" if answered is None else str(answered)
        return _json(sent, 200, {CALLBACK_STATUS_HEADER: header})


# --- command line -------------------------------------------------------------------------


def _build(args: argparse.Namespace) -> GatewaySimulator:
    sim = GatewaySimulator(
        api_key=args.api_key, token=args.token, seed=args.seed, host=args.host, port=args.port
    )
    if args.callback_url:
        sim.configure(callback_url=args.callback_url, callback_secret=args.callback_secret)
    return sim


_DRAIN_S = 5.0
"""Requests in flight get this long after SIGTERM (aiohttp's own shutdown is 2 s)."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.simulator.gateway_sim",
        description="WhatsApp gateway simulator (StackZap, ZAP API, Meta Cloud API) with faults.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8088, help="0 picks a free port (logged)")
    parser.add_argument("--api-key", default=None, help="required X-API-Key (StackZap)")
    parser.add_argument(
        "--token", default=None, help="required Bearer token (ZAP API and Meta Cloud API)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault generator")
    parser.add_argument("--callback-url", default=None, help="where status callbacks go")
    parser.add_argument("--callback-secret", default="", help="HMAC secret of the callbacks")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # SIGTERM/SIGINT, the bounded drain and the closing line: the runtime's, as a deployable.
    sys.exit(run_until_signalled(lambda: _build(args), drain_s=_DRAIN_S))


if __name__ == "__main__":
    main()
