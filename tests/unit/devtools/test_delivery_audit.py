from devtools.stack.delivery_audit import audit, demo_key, demo_text


def _arrivals(keys: list[str]) -> list[dict[str, object]]:
    return [{"text": demo_text(k), "arrived_at": float(i)} for i, k in enumerate(keys)]


def test_clean_run_is_ok() -> None:
    keys = [demo_key("r", "i", c, s) for s in range(3) for c in range(2)]
    report = audit(keys, _arrivals(keys))
    assert report.ok and report.accepted_unique == 6


def test_duplicate_resend_of_last_message_is_not_an_order_violation() -> None:
    k = [demo_key("r", "i", 1, s) for s in range(3)]
    report = audit(k, _arrivals([k[0], k[1], k[1], k[2]]))
    assert report.duplicate_count == 1
    assert report.order_violations == ()
    assert not report.ok


def test_reordered_first_arrivals_are_violations_and_missing_is_reported() -> None:
    k = [demo_key("r", "i", 1, s) for s in range(4)]
    report = audit(k, _arrivals([k[0], k[2], k[1]]))
    assert report.order_violations == ("r:i:1:1",)
    assert report.missing == (k[3],)


def test_latency_uses_commit_times() -> None:
    k = [demo_key("r", "i", 1, 0)]
    report = audit(k, [{"text": demo_text(k[0]), "arrived_at": 10.5}], committed_at={k[0]: 10.0})
    assert report.latency_p50_s == 0.5
