"""The worker's opt-out list: digests per instance, opt-in removes, the skip decision."""

from __future__ import annotations

from streams.kernel.contract import IntentCaptured, OptOutChanged, ReceiptReceived
from streams.optouts import OptOuts, opted_out_by_receipt, skip_reason


def _change(action: str, person: str = "5511987654321", instance: str = "shop-1") -> OptOutChanged:
    return OptOutChanged(
        instance_id=instance,
        person=person,
        action=action,
        source="app",
        reason="STOP",
        at=None,
        optout_id=1,
    )


def _intent(to: str = "5511987654321", priority: str = "bulk", **kw: object) -> IntentCaptured:
    return IntentCaptured(
        job_id=1,
        instance_id="shop-1",
        conversation_key="c",
        idempotency_key="k",
        message_type="text",
        to=to,
        text="hi",
        priority=priority,
        **kw,  # type: ignore[arg-type]
    )


def test_opt_out_then_opt_in_counts_each_person_once_per_instance() -> None:
    optouts = OptOuts()
    optouts.apply(_change("out"))
    optouts.apply(_change("out"))  # a replayed record changes nothing
    optouts.apply(_change("out", instance="shop-2"))
    assert len(optouts) == 2 and optouts.instances() == {"shop-1": 1, "shop-2": 1}
    assert optouts.opted_out("shop-1", "5511987654321")
    optouts.apply(_change("in"))
    optouts.apply(_change("in"))
    assert not optouts.opted_out("shop-1", "5511987654321") and len(optouts) == 1
    assert optouts.opted_out("shop-2", "5511987654321")


def test_the_skip_decision_by_priority_and_the_applications_mark() -> None:
    optouts = OptOuts()
    optouts.add("shop-1", "5511987654321")
    jid = "5511987654321@s.whatsapp.net"
    assert skip_reason(optouts, _intent(to=jid)) is not None  # the same person as a JID
    assert skip_reason(optouts, _intent(priority="operational")) is None
    assert skip_reason(optouts, _intent(priority="operational", respect_opt_out=True))
    assert skip_reason(optouts, _intent(respect_opt_out=False)) is None
    assert skip_reason(optouts, _intent(to="5511900000000")) is None
    reason = skip_reason(optouts, _intent())
    assert reason is not None and "98765" not in reason and "opted out" in reason


def test_only_metas_131050_in_a_failed_receipt_is_an_opt_out() -> None:
    def receipt(gateway: str, reason: str | None) -> ReceiptReceived:
        return ReceiptReceived(
            event_id="e", job_id=1, idempotency_key="k", instance_id="i", conversation_key="c",
            gateway=gateway, gateway_job_id="g", label="failed", status="FAILED", reason=reason,
        )  # fmt: skip

    assert opted_out_by_receipt(receipt("meta", "131050 Unable to deliver the message"))
    assert not opted_out_by_receipt(receipt("meta", "131026 Message undeliverable"))
    assert not opted_out_by_receipt(receipt("meta", "1310500 other"))
    assert not opted_out_by_receipt(receipt("meta", None))
    assert not opted_out_by_receipt(receipt("stackzap", "131050 x"))
