"""The demo mix's report: a job in the wrong state, or a recipient reached twice, is a problem."""

from __future__ import annotations

from typing import Any

from devtools.stack.demo_mix import DemoMix, MixJob, MixReport, MixResult
from streams.kernel.contract import JobStatus

RETRIED = MixJob("mix-1", "retried: 1 transient 503(s)", JobStatus.ACCEPTED, "5511980000001", 1, 2)
DEAD = MixJob("mix-2", "dead", JobStatus.DEAD, "5511980000002", 0)


def _report(*results: MixResult, arrivals: dict[str, int]) -> MixReport:
    expected = {r.job.recipient: r.job.arrivals for r in results}
    return MixReport(results, arrivals, expected, "inst-paused")


def test_every_job_as_meant_and_each_recipient_reached_as_often_as_meant_is_ok() -> None:
    report = _report(
        MixResult(RETRIED, "ACCEPTED", 2),
        MixResult(DEAD, "DEAD", 2),
        arrivals={RETRIED.recipient: 1},
    )
    assert report.ok and report.unexpected_arrivals == {}
    assert "2/2 jobs as meant" in report.summary() and "none twice" in report.summary()


def test_a_wrong_state_too_few_attempts_or_a_second_arrival_is_a_problem() -> None:
    wrong_state = _report(MixResult(DEAD, "FAILED", 1), arrivals={})
    assert not wrong_state.ok and "PROBLEM: meant DEAD" in wrong_state.summary()
    not_retried = _report(MixResult(RETRIED, "ACCEPTED", 1), arrivals={RETRIED.recipient: 1})
    assert not not_retried.ok
    twice = _report(MixResult(RETRIED, "ACCEPTED", 2), arrivals={RETRIED.recipient: 2})
    assert not twice.ok and twice.unexpected_arrivals == {RETRIED.recipient: (2, 1)}
    missing = _report(MixResult(DEAD, None, 0), arrivals={})
    assert not missing.ok and "missing" in missing.summary()


class _Sim:
    """A pipeline with a simulator that records its configuration and no database."""

    dsn = "postgresql://nobody@127.0.0.1:1/none"

    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []

    def sim_config(self, **config: Any) -> None:
        self.configs.append(config)

    def sim_messages(self, since: int = 0) -> list[dict[str, Any]]:
        return []


def test_mix_recipients_never_collide_with_the_batchs() -> None:
    mix = DemoMix(_Sim(), run="r", worker_metrics_url="http://127.0.0.1:1/metrics")
    numbers = {mix._recipient() for _ in range(50)}
    assert len(numbers) == 50
    # The batch's recipients are +55 11 9<conversation:08d>: 551190... for any conversation
    # count make dev takes (under 10 million).
    assert all(n.startswith("551198") and len(n) == 13 for n in numbers)
