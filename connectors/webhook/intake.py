"""``zapstream webhook``: gateway status callbacks (receipts) into Kafka.

Every gateway calls us back when a message is sent, delivered, read or fails:

- ``POST /v1/webhooks/zapapi`` and ``POST /v1/webhooks/stackzap`` (the gateway is
  the last path segment), body ``{"event_id"?, "id", "status", "reference"?,
  "timestamp"?}``; ``id`` is the gateway's job id, ``reference`` the
  ``Idempotency-Key`` we sent (``"<job_id>-<attempt>-<tag>"``,
  :mod:`streams.kernel.attempt_reference`).
- ``GET /v1/webhooks/meta`` (the Cloud API's subscription handshake) and ``POST
  /v1/webhooks/meta`` (its notifications, signed ``X-Hub-Signature-256``): see
  "Meta" below.
- ``GET /v1/webhooks/health``: liveness, no auth; and the runtime's ``/metrics``,
  ``/healthz`` and ``/readyz`` (:func:`streams.kernel.runtime.health.add_health_routes`,
  readiness: the Kafka producer runs).

Every callback must be signed (the scheme gateways must implement; see
:mod:`connectors.webhook.signature`)::

    X-Zap-Signature: t=<unix seconds>,v2=<hex HMAC-SHA256(secret, "<t>.<gateway>." + raw body)>

``t`` is when the gateway signed (whole seconds, UTC epoch) and is covered by the
HMAC, so it cannot be changed without the secret; ``<gateway>`` is the last segment of
the path, so the same bytes replayed to another gateway's path do not verify. A callback
is refused with 401 (nothing published or written) when the signature is missing,
malformed, the old untimestamped ``sha256=<hex>`` or gateway-less ``v1=`` form, does
not match, is older than ``ZAPSTREAM_WEBHOOK_REPLAY_WINDOW_S`` (default 300 s) or more
than ``ZAPSTREAM_WEBHOOK_CLOCK_SKEW_S`` (default 30 s) in the future, or when the
configured secret is empty (allowed only with ``ZAPSTREAM_GATEWAY=meta``; otherwise a
secret under 32 characters refuses the start). Several ``v2=`` entries may be sent
while a secret is rotated. A gateway retrying a callback later than the window must
sign it again with a fresh ``t``. Worked example: secret ``s3cret``, body
``{"id":"g-1","status":"read"}`` POSTed to ``/v1/webhooks/stackzap`` at
``t=1767225600``: the HMAC input is the bytes
``1767225600.stackzap.{"id":"g-1","status":"read"}`` and the header is
``t=1767225600,v2=4faeac64faf2364b7c335d2278cca9aeb720ee0b95a575d761768fc81724ddea``.

A signed body nested deeper than 32 levels, or with an ``id``, ``status``,
``reference`` or ``event_id`` longer than its cap (:mod:`connectors.webhook.limits`),
is refused with 400 and the reason. Every refusal is counted
(``zapstream_webhook_rejected_total``) and logged at most once a minute per kind
(:mod:`connectors.webhook.rejections`).

A verified callback is looked up in ``outbox_jobs`` (by the job id in
``reference`` first, because the state sink may not have written
``gateway_job_id`` yet when the first callback arrives; by ``gateway_job_id``
otherwise), mapped to a :class:`~streams.kernel.contract.JobStatus` with the gateway's
configured labels (unknown -> REVIEW) and published as a
:class:`~streams.kernel.contract.ReceiptReceived` on the intents topic with the job's
conversation key, so the worker applies it in order with everything else of the
conversation. A callback for a job we cannot find becomes a
:class:`~streams.kernel.contract.JobDead` on the dead-letter topic: accepted for review,
never lost; its copy there keeps only allow-listed scalars (:data:`DEAD_LETTER_KEYS`).
A callback that does not bind to the job it names (:func:`unbound_because`: a tagged
reference that does not verify for the path's gateway and the job's instance, a Meta
status about another ``phone_number_id``) is dead-lettered the same way with the reason
and counted (``zapstream_webhook_receipts_unbound_total``); the worker checks the rest
against the attempt (:mod:`streams.receipts`).

The answer (202) is given only after Kafka acknowledged the record. When Kafka
or PostgreSQL fails the answer is 503 and the gateway retries; a retried
callback keeps its ``event_id`` (or, without one, gets the same digest of
gateway, id and label), so the worker drops the duplicate (it keeps the last
event ids of each job). The body's ``timestamp`` is not used (the signed ``t`` is):
the worker orders receipts by status, not by clock. The ``reference`` travels
with the receipt, so the worker applies a receipt only to the job's current
attempt it binds to: a late callback about an earlier attempt changes nothing.

Meta (WhatsApp Cloud API). The handshake ``GET /v1/webhooks/meta?hub.mode=subscribe
&hub.verify_token=<t>&hub.challenge=<c>`` answers ``c`` (200, text/plain) when ``t``
equals ``META_VERIFY_TOKEN`` (constant-time), else 403. A notification must carry
``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(META_APP_SECRET, raw body)>``; a
missing, malformed or wrong one, or an empty ``META_APP_SECRET``, is 401 and counted
as ``unauthorized``, nothing published. Every ``statuses`` item
(:mod:`connectors.webhook.meta`) becomes a receipt like a StackZap callback: the job
is found by ``biz_opaque_callback_data`` (our ``<job_id>-<attempt>`` reference, sent
with the message) or else by the ``wamid``; the label is mapped with
``ZAPSTREAM_META_LABELS`` (unknown -> REVIEW); a status with ``errors`` carries the
first error's code, title and details as the receipt's ``reason``; the event id is
the digest of (``meta``, wamid, status); ``metadata.phone_number_id`` must be the
job's instance. Meta's signature has no timestamp, so a captured notification
verifies forever: a status (number, wamid, status) published within the last
:data:`META_SEEN_MAX` is answered without publishing it again
(``zapstream_webhook_meta_replays_total``); after a restart a replay is the same
event id (dropped by the worker), a receipt never moves a job backwards and applies
only to the attempt it binds to. Meta is answered 200 once every status is in Kafka (503 when
not: Meta sends the whole body again). Inbound messages and other fields are counted
as ``ignored``.

Logs carry the gateway, job ids, labels and the reason of a rejection; never a
body, a phone number, a text, the secret or a signature.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
import psycopg
from aiohttp import web
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from connectors.gateways.labels import map_label
from connectors.webhook.limits import (
    MAX_EVENT_ID_CHARS,
    MAX_GATEWAY_ID_CHARS,
    MAX_LABEL_CHARS,
    MAX_REFERENCE_CHARS,
    CallbackTooDeep,
    check_depth,
    scalar,
    too_long,
)
from connectors.webhook.meta import (
    MalformedMetaCallback,
    MetaStatus,
    handshake_challenge,
    parse_notification,
)
from connectors.webhook.metrics import META_REPLAYS, REJECTED, UNBOUND
from connectors.webhook.settings import WebhookSettings
from connectors.webhook.signature import (
    HUB_SIGNATURE_HEADER,
    HubSignatureCheck,
    SignatureCheck,
    check_hub_signature,
    check_signature,
    check_verify_token,
)
from streams.kernel.attempt_reference import ReferenceKey, load_reference_key
from streams.kernel.attempt_reference import parse_reference as parse_attempt_reference
from streams.kernel.contract import (
    HEADER_JOB_ID,
    HEADER_SCHEMA,
    JobDead,
    ReceiptReceived,
    Record,
)
from streams.kernel.failures import StartRefused
from streams.kernel.producer_stop import stop_producer
from streams.kernel.runtime.health import IDLE_CONNECTION_TIMEOUT_S, add_health_routes
from streams.kernel.runtime.service import Service
from streams.kernel.runtime.throttled_log import ThrottledLog
from streams.kernel.settings import GatewayKind

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
"""Callbacks are a few hundred bytes; anything far larger is not a callback."""
POOL_MAX_CONNECTIONS = 4
"""Each lookup is one indexed SELECT; a handful of connections keeps up with Kafka's acks."""

DEAD_LETTER_KEYS = ("id", "status", "reference", "event_id", "timestamp")
"""What a callback's dead-letter copy keeps: these keys' scalar values, cut to length.
Anything else a body carries (recipients, texts, nested objects) is left out."""
META_SEEN_MAX = 65_536
"""Meta statuses (number, message id, status) remembered as published: a replay of one
within the last this-many is answered 200 and not published again."""

_BY_ID = "SELECT id, idempotency_key, instance_id, conversation_key FROM outbox_jobs WHERE id = %s"
# Newest first: a gateway id is unique per gateway, but nothing in the schema promises it.
_BY_GATEWAY_JOB_ID = (
    "SELECT id, idempotency_key, instance_id, conversation_key FROM outbox_jobs "
    "WHERE gateway_job_id = %s ORDER BY id DESC LIMIT 1"
)


# --- the callback body ---------------------------------------------------------------


class MalformedCallback(ValueError):
    """A signed body that is not a status callback (answered 400)."""


def parse_reference(reference: str | None) -> int | None:
    """The job id in our reference (``"<job_id>-<seq>-<tag>"``, or a legacy
    ``"<job_id>-<seq>"``), or ``None``."""
    parsed = parse_attempt_reference(reference)
    return parsed.job_id if parsed is not None else None


def receipt_event_id(gateway: str, gateway_job_id: str, label: str) -> str:
    """The dedup key of a callback without ``event_id``: the same for every retry of it."""
    raw = f"{gateway}:{gateway_job_id}:{label.lower()}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


def _callback_fields(raw: bytes) -> tuple[dict[str, Any], str, str, str | None, str | None]:
    """``(body, id, status, reference, event_id)``; raises :class:`MalformedCallback`."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedCallback("body is not JSON") from exc
    if not isinstance(body, dict):
        raise MalformedCallback("body is not a JSON object")
    try:
        check_depth(body)
    except CallbackTooDeep as exc:
        raise MalformedCallback(str(exc)) from None
    job = body.get("id")
    if isinstance(job, int) and not isinstance(job, bool):
        job = str(job)
    if not isinstance(job, str) or not job.strip():
        raise MalformedCallback("'id' must be a non-empty string")
    label = body.get("status")
    if not isinstance(label, str) or not label.strip():
        raise MalformedCallback("'status' must be a non-empty string")
    reference = body.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise MalformedCallback("'reference' must be a string")
    event_id = body.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise MalformedCallback("'event_id' must be a string")
    problem = (
        too_long("id", job, MAX_GATEWAY_ID_CHARS)
        or too_long("status", label, MAX_LABEL_CHARS)
        or too_long("reference", reference, MAX_REFERENCE_CHARS)
        or too_long("event_id", event_id, MAX_EVENT_ID_CHARS)
    )
    if problem is not None:
        raise MalformedCallback(problem)
    return body, job.strip(), label.strip(), reference, event_id or None


def dead_letter_record(gateway: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A callback's copy for the dead letters: the gateway and the allow-listed
    :data:`DEAD_LETTER_KEYS`, scalars only and cut to length; never a recipient or a text."""
    return {"gateway": gateway, **{key: scalar(body.get(key)) for key in DEAD_LETTER_KEYS}}


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _json(data: Any, status: int) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


@dataclasses.dataclass(frozen=True, slots=True)
class _Job:
    """What a receipt needs from ``outbox_jobs``."""

    id: int
    idempotency_key: str
    instance_id: str
    conversation_key: str | None


class _Unavailable(Exception):
    """PostgreSQL or Kafka could not do its part now; the gateway should retry (503)."""


def unbound_because(
    gateway: GatewayKind,
    job: _Job,
    reference: str | None,
    phone_number_id: str | None,
    key: ReferenceKey,
) -> tuple[str, str] | None:
    """``(reason, detail)`` when a verified callback does not bind to ``job``, else None.

    The intake checks what it can before publishing (the worker checks again, with the
    attempt): a tagged reference must verify for the gateway of the webhook path and the
    job's instance and name the job; a Meta status must name the job's business number
    (``metadata.phone_number_id`` is the instance id). A legacy or missing reference is
    left to the worker, which then binds by the attempt's gateway job id.
    """
    parsed = parse_attempt_reference(reference)
    if parsed is not None and parsed.job_id != job.id:
        return "other_job", f"the reference names job {parsed.job_id}, found job {job.id}"
    if parsed is not None and parsed.tag is not None:
        if not key.verifies(parsed, gateway=gateway.value, instance_id=job.instance_id):
            return (
                "bad_reference",
                f"the reference of attempt {parsed.attempt_id} does not verify for "
                f"{gateway.value} and instance {job.instance_id}",
            )
    if gateway is GatewayKind.META and phone_number_id != job.instance_id:
        return (
            "other_phone_number",
            f"phone number id {phone_number_id} is not job {job.id}'s instance",
        )
    return None


# --- the service ------------------------------------------------------------------------


class WebhookIntake(Service):
    """Verifies gateway status callbacks, looks their jobs up and publishes them to Kafka.

    A :class:`~streams.kernel.runtime.service.Service`: ``start()`` opens the PostgreSQL
    pool and the Kafka producer, then listens (:attr:`port` is the bound port;
    ``settings.port`` may be 0). ``stop()`` stops listening, lets requests in flight
    finish, flushes the producer and closes the pool; it is idempotent.
    ``publish_timeout_s`` bounds the wait for Kafka's acknowledgement before answering 503.
    """

    name = "webhook"

    def __init__(self, settings: WebhookSettings, *, publish_timeout_s: float = 10.0) -> None:
        super().__init__()
        self.settings = settings
        self._names = settings.kafka.names
        self._publish_timeout_s = publish_timeout_s
        self._runner: web.AppRunner | None = None
        self._producer: AIOKafkaProducer | None = None
        self._pool: AsyncConnectionPool | None = None
        self._port = 0
        self.stats: dict[str, int] = {
            "accepted": 0,
            "unknown_job": 0,
            "unauthorized": 0,
            "stale": 0,
            "malformed": 0,
            "unbound": 0,
            "replayed": 0,
            "unavailable": 0,
            "ignored": 0,
        }
        """What the intake answered, by outcome, for the closing summary and tests."""
        self._rejections = ThrottledLog(log)
        self._references: ReferenceKey | None = None
        self._meta_seen: collections.OrderedDict[tuple[str | None, str, str], None] = (
            collections.OrderedDict()
        )

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Base URL; callbacks go to ``{url}/v1/webhooks/{gateway}``."""
        return f"http://{self.settings.host}:{self._port}"

    async def on_start(self) -> None:
        self._references = load_reference_key(
            self.settings.gateway.reference_key.get_secret_value()
        )
        if not self.settings.secret.get_secret_value():
            # Only with ZAPSTREAM_GATEWAY=meta (settings refuse it otherwise): Meta signs
            # with its app secret; the other gateways' paths answer 401.
            log.warning("webhook secret is empty: every non-Meta callback will get 401")
        gateway_settings = self.settings.gateway
        if (
            gateway_settings.kind is GatewayKind.META
            and not gateway_settings.meta_app_secret.get_secret_value()
        ):
            log.warning("META_APP_SECRET is empty: every Meta callback will be rejected with 401")
        await self._open_clients()
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        for gateway in GatewayKind:
            if gateway is GatewayKind.META:
                app.router.add_get("/v1/webhooks/meta", self._meta_handshake)
                app.router.add_post("/v1/webhooks/meta", self._meta_callback)
            else:
                app.router.add_post(f"/v1/webhooks/{gateway.value}", self._handler(gateway))
        app.router.add_get("/v1/webhooks/health", self._health)
        add_health_routes(app, self.readiness)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=5,
            keepalive_timeout=IDLE_CONNECTION_TIMEOUT_S,
        )
        await runner.setup()
        # Kept before listening: a failed start (the port taken) is closed by on_stop.
        self._runner = runner
        site = web.TCPSite(runner, self.settings.host, self.settings.port)
        try:
            await site.start()
        except OSError as exc:
            raise StartRefused(
                f"cannot listen on {self.settings.host}:{self.settings.port} "
                f"({exc.strerror or exc})",
                hint="set ZAPSTREAM_WEBHOOK_PORT to a free port",
            ) from exc
        self._port = int(runner.addresses[0][1])
        log.info("webhook intake listening on http://%s:%d", self.settings.host, self._port)

    async def _open_clients(self) -> None:
        kafka = self.settings.kafka
        self._producer = AIOKafkaProducer(
            **kafka.client_options(),
            client_id="zapstream-webhook",
            acks="all",
            enable_idempotence=kafka.use_idempotent_producer,
            # A request unanswered this long fails (the idempotent producer on Apache Kafka
            # retries it, though: stop() bounds its flush itself, streams.kernel.producer_stop).
            request_timeout_ms=int(self._publish_timeout_s * 1000),
        )
        await self._producer.start()
        self._pool = AsyncConnectionPool(
            self.settings.postgres.dsn,
            min_size=1,
            max_size=POOL_MAX_CONNECTIONS,
            kwargs={"autocommit": True},
            timeout=self._publish_timeout_s,
            open=False,
            name="zapstream-webhook",
        )
        await self._pool.open(wait=True, timeout=self._publish_timeout_s)

    async def on_stop(self) -> None:
        runner, self._runner = self._runner, None
        try:
            if runner is not None:
                # Stops listening and lets handlers in flight finish (shutdown_timeout):
                # they still need the producer and the pool, released only afterwards.
                await runner.cleanup()
        finally:
            producer, self._producer = self._producer, None
            pool, self._pool = self._pool, None
            try:
                if producer is not None:
                    await stop_producer(
                        producer, self._publish_timeout_s, what="the webhook intake"
                    )
            finally:
                if pool is not None:
                    await pool.close()

    def summary(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.stats.items())

    def readiness(self) -> tuple[bool, str]:
        """Callbacks can be published to Kafka: the producer runs."""
        if self._producer is None or not self.running:
            return False, "not ready: starting or stopping"
        return True, "ready"

    # --- request path -------------------------------------------------------------------

    def _handler(self, gateway: GatewayKind) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return await self._callback(request, gateway)

        return handle

    async def _health(self, request: web.Request) -> web.Response:
        return _json({"ok": True}, 200)

    def _labels(self, gateway: GatewayKind) -> Mapping[str, str]:
        g = self.settings.gateway
        if gateway is GatewayKind.META:
            return g.meta_labels
        return g.zapapi_labels if gateway is GatewayKind.ZAPAPI else g.stackzap_labels

    async def _callback(self, request: web.Request, gateway: GatewayKind) -> web.Response:
        raw = await request.read()
        header = request.headers.get(self.settings.signature_header)
        check = check_signature(
            self.settings.secret.get_secret_value(),
            raw,
            header,
            gateway=gateway.value,
            window_s=self.settings.replay_window_s,
            skew_s=self.settings.clock_skew_s,
        )
        if check is not SignatureCheck.VALID:
            self.stats["unauthorized"] += 1
            if check in (SignatureCheck.EXPIRED, SignatureCheck.FUTURE):
                self.stats["stale"] += 1
            self._refused(
                gateway,
                "unauthorized",
                f"{check.value} ({self.settings.signature_header}, from {request.remote}, "
                f"{len(raw)} bytes)",
            )
            return _json({"error": "invalid signature"}, 401)
        try:
            body, gateway_job_id, label, reference, event_id = _callback_fields(raw)
        except MalformedCallback as exc:
            self.stats["malformed"] += 1
            self._refused(gateway, "malformed", f"{exc} ({len(raw)} bytes)")
            return _json({"error": str(exc)}, 400)
        event_id = event_id or receipt_event_id(gateway.value, gateway_job_id, label)
        try:
            await self._receive(
                gateway,
                gateway_job_id=gateway_job_id,
                label=label,
                reference=reference,
                event_id=event_id,
                dead_record=dead_letter_record(gateway.value, body),
            )
        except _Unavailable as exc:
            self.stats["unavailable"] += 1
            log.warning("%s callback for gateway job %s: %s", gateway.value, gateway_job_id, exc)
            return _json({"error": "temporarily unavailable"}, 503)
        return _json({"accepted": True}, 202)

    async def _receive(
        self,
        gateway: GatewayKind,
        *,
        gateway_job_id: str,
        label: str,
        reference: str | None,
        event_id: str,
        dead_record: Mapping[str, Any],
        reason: str | None = None,
        phone_number_id: str | None = None,
    ) -> None:
        """Publish one verified status as a receipt, or to the dead letters when no job
        matches or it does not bind to its job (:func:`unbound_because`); counted. Raises
        :class:`_Unavailable` when PostgreSQL or Kafka fail."""
        job = await self._lookup(gateway_job_id, parse_reference(reference))
        if job is None or job.conversation_key is None:
            await self._publish_dead(gateway, dead_record, gateway_job_id, reference, job)
            self.stats["unknown_job"] += 1
            return
        assert self._references is not None, "on_start loads the key before listening"
        unbound = unbound_because(gateway, job, reference, phone_number_id, self._references)
        if unbound is not None:
            await self._publish_unbound(gateway, dead_record, gateway_job_id, job, *unbound)
            return
        receipt = ReceiptReceived(
            event_id=event_id,
            job_id=job.id,
            idempotency_key=job.idempotency_key,
            instance_id=job.instance_id,
            conversation_key=job.conversation_key,
            gateway=gateway.value,
            gateway_job_id=gateway_job_id,
            label=label,
            status=map_label(label, self._labels(gateway)).value,
            received_at=_now_iso(),
            reference=reference,
            reason=reason,
            phone_number_id=phone_number_id,
        )
        await self._publish(self._names.intents, receipt, key=receipt.partition_key, job_id=job.id)
        self.stats["accepted"] += 1
        log.debug(
            "receipt %s for job %d: %s -> %s%s",
            event_id,
            receipt.job_id,
            label,
            receipt.status,
            f" ({reason})" if reason else "",
        )

    # --- Meta (WhatsApp Cloud API) --------------------------------------------------------

    async def _meta_handshake(self, request: web.Request) -> web.Response:
        """The subscription handshake: echo ``hub.challenge`` when the verify token matches."""
        offered, challenge = handshake_challenge(request.query)
        configured = self.settings.gateway.meta_verify_token.get_secret_value()
        if challenge is None or not check_verify_token(configured, offered):
            self.stats["unauthorized"] += 1
            log.warning(
                "refused Meta subscription handshake from %s (%s)",
                request.remote,
                "no verify token configured" if not configured else "mode or token mismatch",
            )
            return _json({"error": "verification failed"}, 403)
        log.info("Meta webhook subscription verified")
        return web.Response(text=challenge, content_type="text/plain")

    async def _meta_callback(self, request: web.Request) -> web.Response:
        """A Cloud API notification: verify, then one receipt per status (200 when all are in
        Kafka; 503 makes Meta send the whole body again, duplicates dropped by event id)."""
        raw = await request.read()
        check = check_hub_signature(
            self.settings.gateway.meta_app_secret.get_secret_value(),
            raw,
            request.headers.get(HUB_SIGNATURE_HEADER),
        )
        if check is not HubSignatureCheck.VALID:
            self.stats["unauthorized"] += 1
            self._refused(
                GatewayKind.META,
                "unauthorized",
                f"{check.value} (from {request.remote}, {len(raw)} bytes)",
            )
            return _json({"error": "invalid signature"}, 401)
        try:
            notification = parse_notification(raw)
        except MalformedMetaCallback as exc:
            self.stats["malformed"] += 1
            self._refused(GatewayKind.META, "malformed", f"{exc} ({len(raw)} bytes)")
            return _json({"error": str(exc)}, 400)
        self.stats["ignored"] += notification.ignored
        try:
            for status in notification.statuses:
                await self._receive_meta(status)
        except _Unavailable as exc:
            self.stats["unavailable"] += 1
            log.warning("meta callback: %s", exc)
            return _json({"error": "temporarily unavailable"}, 503)
        # Meta wants a 200; anything else is retried and, repeated, disables the webhook.
        return _json({"accepted": len(notification.statuses)}, 200)

    async def _receive_meta(self, status: MetaStatus) -> None:
        """One Meta status, unless it was published recently: Meta's signature has no
        timestamp, so a captured notification verifies for ever; a replay of a status
        already in Kafka is counted and answered without publishing it again."""
        seen = (status.phone_number_id, status.wamid, status.status.lower())
        if seen in self._meta_seen:
            self._meta_seen.move_to_end(seen)
            self.stats["replayed"] += 1
            META_REPLAYS.inc()
            return
        await self._receive(
            GatewayKind.META,
            gateway_job_id=status.wamid,
            label=status.status,
            reference=status.reference,
            event_id=receipt_event_id(GatewayKind.META.value, status.wamid, status.status),
            dead_record=status.dead_letter_record(),
            reason=status.reason,
            phone_number_id=status.phone_number_id,
        )
        self._meta_seen[seen] = None
        if len(self._meta_seen) > META_SEEN_MAX:
            self._meta_seen.popitem(last=False)

    def _refused(self, gateway: GatewayKind, reason: str, detail: str) -> None:
        """A request refused before anything was published: counted, logged rate-limited."""
        REJECTED.labels(gateway.value, reason).inc()
        self._rejections.note(
            (gateway.value, reason), f"refused {gateway.value} callback: {reason}: {detail}"
        )

    async def _lookup(self, gateway_job_id: str, job_id: int | None) -> _Job | None:
        """The job by ``job_id`` (from our reference), else by ``gateway_job_id``."""
        pool = self._pool
        if pool is None:
            raise _Unavailable("intake is stopping")
        try:
            async with pool.connection() as conn:
                row: tuple[Any, ...] | None = None
                if job_id is not None:
                    row = await (await conn.execute(_BY_ID, (job_id,))).fetchone()
                if row is None:
                    cur = await conn.execute(_BY_GATEWAY_JOB_ID, (gateway_job_id,))
                    row = await cur.fetchone()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise _Unavailable(f"PostgreSQL: {type(exc).__name__}") from exc
        if row is None:
            return None
        return _Job(int(row[0]), str(row[1]), str(row[2]), row[3])

    async def _publish_dead(
        self,
        gateway: GatewayKind,
        record: Mapping[str, Any],
        gateway_job_id: str,
        reference: str | None,
        job: _Job | None,
    ) -> None:
        if job is None:
            reason = (
                f"receipt for unknown job: {gateway.value} job {gateway_job_id!r}, "
                f"reference {reference!r}"
            )
            dead = JobDead(job_id=None, idempotency_key=None, reason=reason, record=dict(record))
        else:
            # The relay never sent it (its payload has no recipient), yet the gateway knows it.
            reason = (
                f"receipt for job {job.id} without a conversation key: "
                f"{gateway.value} job {gateway_job_id!r}"
            )
            dead = JobDead(
                job_id=job.id,
                idempotency_key=job.idempotency_key,
                reason=reason,
                record=dict(record),
            )
        self._rejections.note(
            (gateway.value, "unknown_job"),
            f"refused {gateway.value} callback: unknown_job: {reason} (to {self._names.dead})",
        )
        await self._publish(self._names.dead, dead, key=gateway_job_id.encode(), job_id=dead.job_id)

    async def _publish_unbound(
        self,
        gateway: GatewayKind,
        record: Mapping[str, Any],
        gateway_job_id: str,
        job: _Job,
        why: str,
        detail: str,
    ) -> None:
        """A verified callback that does not bind to its job: dead-lettered with the reason,
        counted, logged rate-limited; the job is not touched."""
        reason = f"receipt does not bind to job {job.id} ({why}): {detail}"
        dead = JobDead(
            job_id=job.id, idempotency_key=job.idempotency_key, reason=reason, record=dict(record)
        )
        await self._publish(self._names.dead, dead, key=gateway_job_id.encode(), job_id=job.id)
        self.stats["unbound"] += 1
        UNBOUND.labels(gateway.value, why).inc()
        self._rejections.note(
            (gateway.value, f"unbound {why}"),
            f"refused {gateway.value} callback: unbound {why}: {reason} (to {self._names.dead})",
        )

    async def _publish(self, topic: str, record: Record, *, key: bytes, job_id: int | None) -> None:
        """Send one record and wait for Kafka's acknowledgement; :class:`_Unavailable` if not."""
        producer = self._producer
        if producer is None:
            raise _Unavailable("intake is stopping")
        headers = [(HEADER_SCHEMA, record.SCHEMA.encode())]
        if job_id is not None:
            headers.append((HEADER_JOB_ID, str(job_id).encode()))
        try:
            async with asyncio.timeout(self._publish_timeout_s):
                await producer.send_and_wait(topic, record.dumps(), key=key, headers=headers)
        except (KafkaError, TimeoutError) as exc:
            # Maybe written, maybe not: the gateway retries with the same event id and the
            # worker drops whichever copy comes second.
            raise _Unavailable(f"Kafka: {type(exc).__name__}") from exc
