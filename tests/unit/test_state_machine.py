import pytest

from streams.contract import JobStatus as S
from streams.state_machine import ALLOWED, InvalidTransition, JobRef, transition

JOB = JobRef(1, "k", "inst", "conv")


def test_first_transition_starts_from_pending_version_one() -> None:
    state = transition(JOB, None, S.ACCEPTED, attempts=1, gateway_job_id="g1")
    assert (state.previous, state.status, state.version) == ("PENDING", "ACCEPTED", 1)
    assert state.sent_at is not None and state.gateway_job_id == "g1"


def test_versions_increase_and_keep_gateway_id_and_sent_at() -> None:
    accepted = transition(JOB, None, S.ACCEPTED, attempts=1, gateway_job_id="g1")
    delivered = transition(JOB, accepted, S.DELIVERED)
    assert delivered.version == 2
    assert delivered.gateway_job_id == "g1"
    assert delivered.sent_at == accepted.sent_at
    assert delivered.attempts == 1


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (S.READ, S.DELIVERED),
        (S.DELIVERED, S.ACCEPTED),
        (S.EXPIRED, S.ACCEPTED),
        (S.CANCELLED, S.ATTEMPTING),
    ],
)
def test_backwards_or_from_final_states_is_rejected(start: S, to: S) -> None:
    current = transition(JOB, None, start)
    with pytest.raises(InvalidTransition):
        transition(JOB, current, to)


def test_every_state_has_a_row() -> None:
    assert set(ALLOWED) == set(S)
