"""The Meta WhatsApp Cloud API as the gateway, end to end on real processes.

PostgreSQL, Kafka, relay, worker (``ZAPSTREAM_GATEWAY=meta``), state sink, webhook
intake and the simulator speaking the Cloud API. Each test sends a handful of jobs
and checks what the simulator really received (arrivals carry our attempt reference
from ``biz_opaque_callback_data``) and what ``outbox_jobs`` / ``outbox_job_events``
say. Faults are deterministic per recipient or lifted by the test once observed, so
no assertion depends on a timing window. The simulator's configuration is put back
after every test by a fixture.

The worker's reaction to :class:`~streams.kernel.errors.RateLimitedError` is being reworked
separately: the rate-limit tests assert only the eventual outcome (sent exactly once).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from connectors.outbox.enqueue import enqueue, enqueue_template
from connectors.outbox.optouts import opt_in, opted_out
from connectors.webhook.signature import sign_hub
from devtools.stack.devstack import find_free_port
from devtools.stack.local_pipeline import (
    META_APP_SECRET,
    META_VERIFY_TOKEN,
    SIM_TOKEN,
    LocalPipeline,
)
from tests.integration.support import (
    Arrivals,
    count_rows,
    metric_value,
    wait_for_status,
    wait_until,
)
from tests.integration.topic_reader import read_topic

pytestmark = pytest.mark.integration

PHONE_NUMBER_ID = "106540352242922"
"""The instance: a business number's phone-number id."""
ENV = {
    "ZAPSTREAM_GATEWAY": "meta",
    "ZAPSTREAM_KAFKA_ONE_RECORD_PER_BATCH": "true",
    "ZAPSTREAM_WORKER_RETRY_SCHEDULE_S": "[0.5, 1, 2]",
    "ZAPSTREAM_WORKER_RETRY_JITTER": "0",
    "ZAPSTREAM_WORKER_RETRY_SCAN_INTERVAL_S": "0.2",
    "ZAPSTREAM_WORKER_COMMIT_INTERVAL_S": "0.5",
    "ZAPSTREAM_WORKER_TEMPLATE_RECHECK_S": "1",
}
SETTLED = {"ACCEPTED", "DELIVERED", "READ"}


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=4, worker_env=ENV) as p:
        p.start_relay()
        p.worker_port = find_free_port()  # type: ignore[attr-defined]
        p.start_worker(env={"ZAPSTREAM_WORKER_WEB_PORT": str(p.worker_port)})  # type: ignore[attr-defined]
        p.webhook_url = p.start_webhook()  # type: ignore[attr-defined]
        yield p


DEFAULT_SIM: dict[str, Any] = {
    "callback_statuses": ["sent", "delivered", "read"],
    "fail_recipients": {},
    "pair_limited_recipients": {},
    "invalid_recipients": [],
    "rate_limit_rate": 0.0,
    "error_rate": 0.0,
    "drop_response_rate": 0.0,
    "meta_templates": [],
    "meta_template_errors": {},
    "meta_window_closed": [],
    "opted_out_recipients": [],
}


@pytest.fixture(autouse=True)
def sim_defaults(pipeline: LocalPipeline) -> Iterator[None]:
    yield
    pipeline.sim_config(**DEFAULT_SIM)


def _run() -> str:
    return uuid.uuid4().hex[:8]


def _enqueue(pipeline: LocalPipeline, key: str, to: str) -> int:
    with psycopg.connect(pipeline.dsn) as conn:
        job_id = enqueue(
            conn, instance_id=PHONE_NUMBER_ID, to=to, text=f"m [{key}:0]", idempotency_key=key
        )
        conn.commit()
    return job_id


def _status(dsn: str, key: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status FROM outbox_jobs WHERE idempotency_key = %s", (key,)
        ).fetchone()
    return str(row[0]) if row else ""


def _job(dsn: str, job_id: int) -> tuple[str, int, str | None]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, attempts, gateway_job_id FROM outbox_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1]), row[2]


def _history(dsn: str, job_id: int) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT to_status FROM outbox_job_events WHERE job_id = %s ORDER BY version",
            (job_id,),
        ).fetchall()
    return [str(r[0]) for r in rows]


def _arrivals(pipeline: LocalPipeline, key: str) -> list[dict[str, Any]]:
    return [m for m in Arrivals(pipeline).refresh() if m["text"] == f"m [{key}:0]"]


def _outcomes(pipeline: LocalPipeline) -> dict[str, int]:
    body = httpx.get(f"{pipeline.sim_url}/_sim/stats", timeout=5).json()
    return {str(k): int(v) for k, v in body["by_outcome"].items()}


def _emit(pipeline: LocalPipeline, wamid: str, status: str, **extra: object) -> str:
    response = httpx.post(
        f"{pipeline.sim_url}/_sim/callbacks/emit",
        json={"id": wamid, "status": status, **extra},
        timeout=10,
    )
    response.raise_for_status()
    return response.headers.get("X-Sim-Callback-Status", "")


def _settled_once(pipeline: LocalPipeline, key: str, job_id: int) -> dict[str, Any]:
    """Wait until the job is accepted (or further); it arrived exactly once, as attempt 1+."""
    wait_until(lambda: _status(pipeline.dsn, key) in SETTLED, 120, f"{key} accepted")
    arrived = _arrivals(pipeline, key)
    assert len(arrived) == 1, f"sent {len(arrived)} times"
    (msg,) = arrived
    assert msg["api"] == "meta"
    assert msg["instance"] == PHONE_NUMBER_ID
    assert str(msg["reference"]).startswith(f"{job_id}-"), "biz_opaque_callback_data"
    assert msg["id"].startswith("wamid.")
    return msg


# --- tests -------------------------------------------------------------------------------------


def test_normal_send_is_accepted_once_and_receipts_end_read(pipeline: LocalPipeline) -> None:
    key = f"{_run()}-normal"
    job_id = _enqueue(pipeline, key, "5511900000701")
    msg = _settled_once(pipeline, key, job_id)
    wait_for_status(pipeline.dsn, [key], "READ", 60)
    status, attempts, wamid = _job(pipeline.dsn, job_id)
    assert (status, attempts, wamid) == ("READ", 1, msg["id"])
    assert str(msg["reference"]).startswith(f"{job_id}-1-"), "the attempt reference, tagged"
    assert _history(pipeline.dsn, job_id)[:2] == ["ATTEMPTING", "ACCEPTED"]


def test_undeliverable_131026_fails_after_one_attempt(pipeline: LocalPipeline) -> None:
    to = "5511900000702"
    pipeline.sim_config(invalid_recipients=[to])
    before = _outcomes(pipeline).get("invalid_recipient", 0)
    key = f"{_run()}-perm"
    job_id = _enqueue(pipeline, key, to)
    wait_for_status(pipeline.dsn, [key], "FAILED", 60)
    status, attempts, _ = _job(pipeline.dsn, job_id)
    assert (status, attempts) == ("FAILED", 1), "a permanent error must not be retried"
    assert _outcomes(pipeline).get("invalid_recipient", 0) == before + 1
    assert _arrivals(pipeline, key) == []


def test_transient_503_before_acceptance_is_retried_and_sent_once(pipeline: LocalPipeline) -> None:
    to = "5511900000703"
    pipeline.sim_config(fail_recipients={to: 2})
    before = _outcomes(pipeline).get("recipient_failed", 0)
    key = f"{_run()}-transient"
    job_id = _enqueue(pipeline, key, to)
    _settled_once(pipeline, key, job_id)
    assert _outcomes(pipeline).get("recipient_failed", 0) == before + 2
    _, attempts, _ = _job(pipeline.dsn, job_id)
    assert attempts == 3


def test_lost_response_ends_uncertain_and_is_never_resent(pipeline: LocalPipeline) -> None:
    pipeline.sim_config(callback_statuses=[], drop_response_rate=1.0)
    before = _outcomes(pipeline).get("dropped", 0)
    to = "5511900000704"
    key = f"{_run()}-lost"
    job_id = _enqueue(pipeline, key, to)
    wait_for_status(pipeline.dsn, [key], "UNCERTAIN", 90)
    pipeline.sim_config(drop_response_rate=0.0)
    assert _outcomes(pipeline).get("dropped", 0) == before + 1
    # A later message of the same conversation goes through: the worker moved past the
    # uncertain one, and it still arrived exactly once.
    marker = f"{key}-marker"
    marker_id = _enqueue(pipeline, marker, to)
    _settled_once(pipeline, marker, marker_id)
    assert len(_arrivals(pipeline, key)) == 1, "an uncertain send must never be resent"
    assert _status(pipeline.dsn, key) == "UNCERTAIN"
    assert _job(pipeline.dsn, job_id)[1] == 1


def test_throughput_limit_130429_is_eventually_sent_exactly_once(pipeline: LocalPipeline) -> None:
    before = _outcomes(pipeline).get("rate_limited", 0)
    pipeline.sim_config(rate_limit_rate=1.0)
    key = f"{_run()}-throughput"
    job_id = _enqueue(pipeline, key, "5511900000705")
    wait_until(lambda: _outcomes(pipeline).get("rate_limited", 0) > before, 60, "a 130429 answer")
    pipeline.sim_config(rate_limit_rate=0.0)
    _settled_once(pipeline, key, job_id)


def test_pair_rate_limit_131056_is_eventually_sent_exactly_once(pipeline: LocalPipeline) -> None:
    to = "5511900000706"
    pipeline.sim_config(pair_limited_recipients={to: 2})
    before = _outcomes(pipeline).get("pair_rate_limited", 0)
    key = f"{_run()}-pair"
    job_id = _enqueue(pipeline, key, to)
    _settled_once(pipeline, key, job_id)
    assert _outcomes(pipeline).get("pair_rate_limited", 0) == before + 2


def test_signed_receipts_apply_and_bad_signatures_get_401(pipeline: LocalPipeline) -> None:
    pipeline.sim_config(callback_statuses=[])
    key = f"{_run()}-receipts"
    job_id = _enqueue(pipeline, key, "5511900000707")
    msg = _settled_once(pipeline, key, job_id)
    wamid = str(msg["id"])

    assert _emit(pipeline, wamid, "read", signed=False) == "401"
    webhook = f"{pipeline.webhook_url}/v1/webhooks/meta"  # type: ignore[attr-defined]
    body = _notification(wamid, "read", biz_opaque_callback_data=f"{job_id}-1")
    forged = httpx.post(
        webhook,
        content=body,
        headers={"X-Hub-Signature-256": sign_hub("wrong-secret", body)},
        timeout=10,
    )
    assert forged.status_code == 401
    # Signed with the right secret, the same body is accepted (200, as Meta wants).
    assert _emit(pipeline, wamid, "delivered") == "200"
    wait_for_status(pipeline.dsn, [key], "DELIVERED", 30)
    assert "READ" not in _history(pipeline.dsn, job_id), "a forged receipt was applied"
    genuine = httpx.post(
        webhook,
        content=body,
        headers={"X-Hub-Signature-256": sign_hub(META_APP_SECRET, body)},
        timeout=10,
    )
    assert genuine.status_code == 200
    wait_for_status(pipeline.dsn, [key], "READ", 30)
    assert _history(pipeline.dsn, job_id) == ["ATTEMPTING", "ACCEPTED", "DELIVERED", "READ"]


def test_failed_status_fails_the_job_with_metas_reason(pipeline: LocalPipeline) -> None:
    pipeline.sim_config(callback_statuses=[])
    key = f"{_run()}-failed"
    job_id = _enqueue(pipeline, key, "5511900000708")
    msg = _settled_once(pipeline, key, job_id)
    assert _emit(pipeline, str(msg["id"]), "failed") == "200"
    wait_for_status(pipeline.dsn, [key], "FAILED", 30)
    receipts = [
        orjson.loads(r.value)
        for r in read_topic(pipeline.kafka.bootstrap, pipeline.topics.intents)
        if r.value.startswith(b"{") and b'"zapstream.receipt.v1"' in r.value
    ]
    mine = [r for r in receipts if r["job_id"] == job_id]
    assert [(r["gateway"], r["label"], r["status"]) for r in mine] == [("meta", "failed", "FAILED")]
    assert str(mine[0]["reason"]).startswith("131026 Message undeliverable")


def _notification(
    wamid: str, status: str, *, phone_number_id: str = PHONE_NUMBER_ID, **extra: object
) -> bytes:
    item = {"id": wamid, "status": status, "timestamp": "1750263773", **extra}
    change = {
        "field": "messages",
        "value": {
            "messaging_product": "whatsapp",
            "metadata": {"phone_number_id": phone_number_id},
            "statuses": [item],
        },
    }
    return orjson.dumps(
        {"object": "whatsapp_business_account", "entry": [{"id": "waba", "changes": [change]}]}
    )


def _post_signed(pipeline: LocalPipeline, body: bytes) -> int:
    answer = httpx.post(
        f"{pipeline.webhook_url}/v1/webhooks/meta",  # type: ignore[attr-defined]
        content=body,
        headers={"X-Hub-Signature-256": sign_hub(META_APP_SECRET, body)},
        timeout=10,
    )
    return answer.status_code


def test_a_status_for_another_phone_number_id_or_replayed_changes_nothing(
    pipeline: LocalPipeline,
) -> None:
    """Issue 18, finding 2: ``metadata.phone_number_id`` was never compared with the job's
    instance, and a captured notification was published again on every replay."""
    pipeline.sim_config(callback_statuses=[])
    key = f"{_run()}-other-number"
    job_id = _enqueue(pipeline, key, "5511900000711")
    msg = _settled_once(pipeline, key, job_id)
    wamid, reference = str(msg["id"]), str(msg["reference"])
    assert len(reference.split("-")) == 3, "the reference carries its HMAC tag"
    # Signed by Meta (the app secret), but about another business number of the app.
    other = _notification(
        wamid, "read", phone_number_id="999999999999999", biz_opaque_callback_data=reference
    )
    assert _post_signed(pipeline, other) == 200
    wait_until(
        lambda: any(
            b"other_phone_number" in r.value and str(job_id).encode() in r.value
            for r in read_topic(pipeline.kafka.bootstrap, pipeline.topics.dead)
        ),
        30,
        "the unbound status dead-lettered",
    )
    # The genuine "delivered", then the same notification replayed: published once.
    genuine = _notification(wamid, "delivered", biz_opaque_callback_data=reference)
    assert _post_signed(pipeline, genuine) == 200
    wait_for_status(pipeline.dsn, [key], "DELIVERED", 30)
    assert _post_signed(pipeline, genuine) == 200
    assert "READ" not in _history(pipeline.dsn, job_id), "a status of another number applied"
    receipts = [
        orjson.loads(r.value)
        for r in read_topic(pipeline.kafka.bootstrap, pipeline.topics.intents)
        if b'"zapstream.receipt.v1"' in r.value and str(job_id).encode() in r.value
    ]
    mine = [r for r in receipts if r["job_id"] == job_id]
    assert [(r["label"], r["phone_number_id"]) for r in mine] == [("delivered", PHONE_NUMBER_ID)]


def test_unknown_status_goes_to_review_never_dropped(pipeline: LocalPipeline) -> None:
    pipeline.sim_config(callback_statuses=[])
    key = f"{_run()}-unknown-label"
    job_id = _enqueue(pipeline, key, "5511900000709")
    msg = _settled_once(pipeline, key, job_id)
    assert _emit(pipeline, str(msg["id"]), "something_new") == "200"
    wait_for_status(pipeline.dsn, [key], "REVIEW", 30)


def test_status_for_an_unknown_message_goes_to_the_dead_letters(pipeline: LocalPipeline) -> None:
    recipient = "5511900000710"
    wamid = f"wamid.{_run()}-unknown"
    body = _notification(wamid, "delivered", recipient_id=recipient)
    answer = httpx.post(
        f"{pipeline.webhook_url}/v1/webhooks/meta",  # type: ignore[attr-defined]
        content=body,
        headers={"X-Hub-Signature-256": sign_hub(META_APP_SECRET, body)},
        timeout=10,
    )
    assert answer.status_code == 200
    dead = [
        orjson.loads(r.value)
        for r in read_topic(pipeline.kafka.bootstrap, pipeline.topics.dead)
        if wamid.encode() in r.value
    ]
    assert len(dead) == 1
    assert "receipt for unknown job: meta job" in dead[0]["reason"]
    assert dead[0]["record"]["id"] == wamid
    assert recipient not in orjson.dumps(dead[0]).decode(), "the recipient must be masked"


def test_subscription_handshake(pipeline: LocalPipeline) -> None:
    webhook = f"{pipeline.webhook_url}/v1/webhooks/meta"  # type: ignore[attr-defined]
    query = {"hub.mode": "subscribe", "hub.verify_token": META_VERIFY_TOKEN, "hub.challenge": "42"}
    ok = httpx.get(webhook, params=query, timeout=10)
    assert (ok.status_code, ok.text) == (200, "42")
    wrong = httpx.get(webhook, params={**query, "hub.verify_token": "nope"}, timeout=10)
    assert wrong.status_code == 403 and "42" not in wrong.text


def test_the_access_token_is_never_logged(pipeline: LocalPipeline) -> None:
    for proc in pipeline.processes:
        text = proc.log_path.read_text("utf-8", "replace")
        assert SIM_TOKEN not in text, proc.log_path.name
        assert META_APP_SECRET not in text, proc.log_path.name
    assert count_rows(pipeline.dsn, "SELECT count(*) FROM outbox_jobs") > 0


# --- templates ------------------------------------------------------------------------------

ORDER_TEMPLATE = {"name": "order_confirmation", "language": "pt_BR", "parameters": {"body": 2}}
"""What the simulator approves: order_confirmation in pt_BR, two body parameters."""


def _order(*texts: str, name: str = "order_confirmation") -> dict[str, Any]:
    parameters = [{"type": "text", "text": t} for t in texts]
    return {
        "name": name,
        "language": {"code": "pt_BR"},
        "components": [{"type": "body", "parameters": parameters}],
    }


def _enqueue_template(pipeline: LocalPipeline, key: str, to: str, template: Any) -> int:
    with psycopg.connect(pipeline.dsn) as conn:
        job_id = enqueue_template(
            conn, instance_id=PHONE_NUMBER_ID, to=to, template=template, idempotency_key=key
        )
        conn.commit()
    return job_id


def _of_job(pipeline: LocalPipeline, job_id: int) -> list[dict[str, Any]]:
    return [m for m in Arrivals(pipeline).refresh() if str(m["reference"]).startswith(f"{job_id}-")]


def _last_error(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT last_error FROM outbox_jobs WHERE id = %s", (job_id,)).fetchone()
    return str(row[0]) if row and row[0] else ""


def test_a_template_job_is_sent_once_with_its_parameters(pipeline: LocalPipeline) -> None:
    pipeline.sim_config(meta_templates=[ORDER_TEMPLATE])
    key = f"{_run()}-template"
    template = {**_order("Ana", "#123"), "language": "pt_BR"}  # the bare code, normalised
    job_id = _enqueue_template(pipeline, key, "5511900000721", template)
    wait_until(lambda: _status(pipeline.dsn, key) in SETTLED, 60, f"{key} accepted")
    (msg,) = _of_job(pipeline, job_id)
    print(f"template job {job_id}: {msg['text']} with {msg['template']['components']}")
    assert msg["template"] == _order("Ana", "#123")
    assert msg["text"] == "[template order_confirmation/pt_BR]"
    assert _job(pipeline.dsn, job_id)[:2] in {(s, 1) for s in SETTLED}


def test_each_template_error_ends_failed_with_the_reason(pipeline: LocalPipeline) -> None:
    pipeline.sim_config(
        meta_templates=[
            ORDER_TEMPLATE,
            {**ORDER_TEMPLATE, "name": "short_note", "max_chars": 5},
            {**ORDER_TEMPLATE, "name": "old_offer", "status": "DISABLED"},
            {**ORDER_TEMPLATE, "name": "flagged"},
            {**ORDER_TEMPLATE, "name": "wrong_format"},
        ],
        meta_template_errors={"flagged": 132007, "wrong_format": 132012},
    )
    run = _run()
    cases = {
        132000: (_order("only one"), "the number of parameters does not match"),
        132001: (_order("a", "b", name="no_such_template"), "does not exist in this language"),
        132005: (_order("a", "far too long", name="short_note"), "too long once filled in"),
        132007: (_order("a", "b", name="flagged"), "violates a WhatsApp policy"),
        132012: (_order("a", "b", name="wrong_format"), "format does not match"),
        132016: (_order("a", "b", name="old_offer"), "the template is disabled"),
    }
    jobs = {
        code: _enqueue_template(pipeline, f"{run}-t{code}", f"55119000007{i:02d}", template)
        for i, (code, (template, _)) in enumerate(cases.items(), start=30)
    }
    wait_for_status(pipeline.dsn, [f"{run}-t{code}" for code in cases], "FAILED", 60)
    for code, job_id in jobs.items():
        error = _last_error(pipeline.dsn, job_id)
        print(f"{code}: job {job_id} FAILED: {error}")
        assert f"code {code}" in error and cases[code][1] in error, error
        assert _job(pipeline.dsn, job_id)[1] == 1, "a template error is never retried"
        assert _of_job(pipeline, job_id) == []
    outcomes = _outcomes(pipeline)
    assert all(outcomes.get(f"template_{code}", 0) >= 1 for code in cases)


def test_a_paused_template_holds_its_job_until_meta_lifts_the_pause(
    pipeline: LocalPipeline,
) -> None:
    pipeline.sim_config(meta_templates=[{**ORDER_TEMPLATE, "status": "PAUSED"}])
    key = f"{_run()}-paused"
    job_id = _enqueue_template(pipeline, key, "5511900000740", _order("Ana", "#9"))
    wait_for_status(pipeline.dsn, [key], "RETRY_WAIT", 60)
    error = _last_error(pipeline.dsn, job_id)
    print(f"held: {error}")
    assert "template order_confirmation/pt_BR paused by Meta" in error and "132015" in error
    # Re-checked every second (ZAPSTREAM_WORKER_TEMPLATE_RECHECK_S): still paused, still held.
    wait_until(lambda: _outcomes(pipeline).get("template_132015", 0) >= 2, 30, "a re-check")
    assert _of_job(pipeline, job_id) == []
    pipeline.sim_config(meta_templates=[ORDER_TEMPLATE])
    wait_until(lambda: _status(pipeline.dsn, key) in SETTLED, 60, f"{key} sent after the pause")
    assert len(_of_job(pipeline, job_id)) == 1
    status, attempts, _ = _job(pipeline.dsn, job_id)
    print(f"sent after the pause: {status}, attempts {attempts}")
    assert attempts == 1, "the paused attempts were given back"


def test_a_text_answered_131047_is_sent_once_as_its_fallback_template(
    pipeline: LocalPipeline,
) -> None:
    to = "5511900000750"
    pipeline.sim_config(meta_templates=[ORDER_TEMPLATE], meta_window_closed=[to])
    before = _outcomes(pipeline).get("window_closed", 0)
    key = f"{_run()}-fallback"
    with psycopg.connect(pipeline.dsn) as conn:
        job_id = enqueue(
            conn,
            instance_id=PHONE_NUMBER_ID,
            to=to,
            text=f"m [{key}:0]",
            idempotency_key=key,
            fallback_template=_order("Ana", "#7"),
        )
        conn.commit()
    wait_until(lambda: _status(pipeline.dsn, key) in SETTLED, 60, f"{key} accepted")
    arrived = _of_job(pipeline, job_id)
    print(f"fallback job {job_id}: {len(arrived)} accepted message(s): {arrived[0]['text']}")
    assert len(arrived) == 1, "sent once, as the template"
    assert arrived[0]["template"] == _order("Ana", "#7")
    assert _arrivals(pipeline, key) == [], "the text never went"
    assert _outcomes(pipeline).get("window_closed", 0) == before + 1
    assert _history(pipeline.dsn, job_id)[:4] == [
        "ATTEMPTING",
        "ATTEMPTING",
        "ATTEMPTING",
        "ACCEPTED",
    ]
    assert _job(pipeline.dsn, job_id)[1] == 1


# --- the simulator's Cloud API, in-process (no pipeline) ------------------------------------


async def test_sim_speaks_the_cloud_api_to_the_client() -> None:
    from pydantic import SecretStr

    from connectors.gateways.meta import MetaCloudClient
    from devtools.simulator.gateway_sim import GatewaySimulator
    from streams.kernel.errors import (
        InstanceUnavailableError,
        PermanentGatewayError,
        RateLimitedError,
        TransientGatewayError,
        UncertainGatewayError,
    )
    from streams.kernel.ports import TextMessage
    from streams.kernel.settings import GatewayKind, GatewaySettings

    token = "t" * 24

    def text(n: int, instance: str = PHONE_NUMBER_ID) -> TextMessage:
        return TextMessage(instance, f"55119{n:08d}", f"message {n}", f"{n}-1")

    async with GatewaySimulator(token=token, seed=5) as sim:
        settings = GatewaySettings(
            kind=GatewayKind.META,
            meta_graph_url=sim.url,
            meta_access_token=SecretStr(token),
            read_timeout_s=2.0,
        )
        async with MetaCloudClient(settings) as client:
            accepted = await client.send_text(text(1))
            assert accepted.gateway_job_id == sim.messages[-1].id
            assert accepted.gateway_job_id is not None
            assert accepted.gateway_job_id.startswith("wamid.")
            assert sim.messages[-1].reference == "1-1"
            assert sim.messages[-1].api == "meta"

            sim.configure(rate_limit_rate=1.0)
            with pytest.raises(RateLimitedError) as limited:
                await client.send_text(text(2))
            assert (limited.value.limit, limited.value.status_code) == ("instance", 400)
            sim.configure(rate_limit_rate=0.0, pair_limited_recipients={"5511900000003": 1})
            with pytest.raises(RateLimitedError) as pair:
                await client.send_text(text(3))
            assert pair.value.limit == "recipient"
            await client.send_text(text(3))

            sim.configure(invalid_recipients=["5511900000004"])
            with pytest.raises(PermanentGatewayError) as permanent:
                await client.send_text(text(4))
            assert "131026" in str(permanent.value)

            sim.configure(error_rate=1.0)
            with pytest.raises(TransientGatewayError) as transient:
                await client.send_text(text(5))
            assert transient.value.status_code == 500
            sim.configure(error_rate=0.0, drop_response_rate=1.0)
            with pytest.raises(UncertainGatewayError):
                await client.send_text(text(6))
            assert sim.messages[-1].reference == "6-1", "recorded before the answer was lost"
            sim.configure(drop_response_rate=0.0, reject_keys_for_instances=["1"])
            with pytest.raises(InstanceUnavailableError):
                await client.send_text(text(7, instance="1"))
            sim.configure(reject_keys_for_instances=[], reject_instances=["2"])
            with pytest.raises(InstanceUnavailableError, match="unknown phone number id"):
                await client.send_text(text(8, instance="2"))
            sim.configure(reject_instances=[], outage_s=30)
            with pytest.raises(TransientGatewayError) as outage:
                await client.send_text(text(9))
            assert outage.value.status_code == 503 and outage.value.retry_after_s is not None
    assert [m.reference for m in sim.messages] == ["1-1", "3-1", "6-1"]


# --- opt-outs (acceptance 5 of issue 19) -------------------------------------------------------


def _send(pipeline: LocalPipeline, key: str, to: str, priority: str = "operational") -> int:
    with psycopg.connect(pipeline.dsn) as conn:
        job_id = enqueue(
            conn,
            instance_id=PHONE_NUMBER_ID,
            to=to,
            text=f"m [{key}:0]",
            idempotency_key=key,
            priority=priority,
        )
        conn.commit()
    return job_id


def _known_optouts(pipeline: LocalPipeline) -> float:
    return metric_value(pipeline.worker_port, "zapstream_optouts_known")  # type: ignore[attr-defined]


def _reason(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT last_error FROM outbox_jobs WHERE id = %s", (job_id,)).fetchone()
    return str(row[0]) if row else ""


def test_opt_outs_by_sql_and_from_131050_stop_bulk_jobs_until_an_opt_in(
    pipeline: LocalPipeline,
) -> None:
    run = _run()
    digits = f"{int(run, 16) % 10**8:08d}"
    by_sql, by_meta = f"55119{digits}", f"55118{digits}"
    known = _known_optouts(pipeline)
    # 1. The application writes an opt-out with plain SQL, in the number's written form.
    written = f"+55 11 9{digits[:4]}-{digits[4:]}"
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO outbox_optouts (instance_id, recipient, reason) "
            "VALUES (%s, %s, 'replied STOP') RETURNING recipient, source",
            (PHONE_NUMBER_ID, written),
        ).fetchone()
    assert row == (by_sql, "app"), "normalised to the person's digits"
    # 2. Meta answers 131050 to an operational job: it ends OPTED_OUT, the opt-out recorded.
    pipeline.sim_config(opted_out_recipients=[by_meta])
    refused_id = _send(pipeline, f"{run}-meta-op", by_meta)
    wait_for_status(pipeline.dsn, [f"{run}-meta-op"], "OPTED_OUT", 60)
    assert _outcomes(pipeline).get("opted_out", 0) >= 1
    assert "131050" in _reason(pipeline.dsn, refused_id)
    sql = "SELECT source, job_id FROM outbox_optouts WHERE recipient = %s"
    counted = sql.replace("source, job_id", "count(*)")
    wait_until(
        lambda: count_rows(pipeline.dsn, counted, (by_meta,)) == 1, 30, "the 131050 opt-out row"
    )
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        assert conn.execute(sql, (by_meta,)).fetchall() == [("meta", refused_id)]
        assert opted_out(conn, PHONE_NUMBER_ID, f"{by_meta}@s.whatsapp.net")
    # Both reached the worker through the relay and zapstream.controls.
    wait_until(lambda: _known_optouts(pipeline) >= known + 2, 60, "the worker knows both")
    # 3. From now on Meta would take anything: bulk jobs to either never reach it.
    pipeline.sim_config(opted_out_recipients=[])
    keys = [f"{run}-bulk-sql", f"{run}-bulk-meta"]
    bulk_ids = [_send(pipeline, keys[0], by_sql, "bulk"), _send(pipeline, keys[1], by_meta, "bulk")]
    wait_for_status(pipeline.dsn, keys, "OPTED_OUT", 60)
    for key, job_id in zip(keys, bulk_ids, strict=True):
        assert _arrivals(pipeline, key) == [], f"{key} reached the gateway"
        assert "opted out" in _reason(pipeline.dsn, job_id)
        assert _history(pipeline.dsn, job_id) == ["OPTED_OUT"]
    # 4. An operational job to an opted-out recipient is still sent.
    operational = f"{run}-op-sql"
    _settled_once(pipeline, operational, _send(pipeline, operational, by_sql))
    # 5. An opt-in sends bulk again.
    with psycopg.connect(pipeline.dsn) as conn:
        opt_in(conn, PHONE_NUMBER_ID, written, reason="replied START")
        conn.commit()
    wait_until(lambda: _known_optouts(pipeline) <= known + 1, 60, "the worker saw the opt-in")
    again = f"{run}-bulk-again"
    _settled_once(pipeline, again, _send(pipeline, again, by_sql, "bulk"))
    print(
        f"opt-outs: sql and meta(131050) bulk jobs OPTED_OUT, 0 arrivals; operational sent; "
        f"opt-in sent; worker knows {_known_optouts(pipeline):.0f}"
    )
