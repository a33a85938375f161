import pytest

from streams.kernel.contract import JobStatus as S
from streams.kernel.contract import StatusChanged
from streams.kernel.state_machine import ALLOWED, InvalidTransition, JobRef, transition

JOB = JobRef(1, "k", "inst", "conv")

PATHS = {
    S.ATTEMPTING: [S.ATTEMPTING],
    S.ACCEPTED: [S.ATTEMPTING, S.ACCEPTED],
    S.DELIVERED: [S.ATTEMPTING, S.ACCEPTED, S.DELIVERED],
    S.READ: [S.ATTEMPTING, S.ACCEPTED, S.READ],
    S.EXPIRED: [S.EXPIRED],
    S.CANCELLED: [S.CANCELLED],
    S.DEAD: [S.ATTEMPTING, S.DEAD],
}


def reach(status: S) -> StatusChanged:
    state = None
    for step in PATHS[status]:
        state = transition(JOB, state, step, gateway_job_id="g1" if step is S.ACCEPTED else None)
    assert state is not None
    return state


def test_first_transition_starts_from_pending_version_one() -> None:
    state = transition(JOB, None, S.ATTEMPTING, attempts=1, attempt_seq=1, attempt_id="1-1")
    assert (state.previous, state.status, state.version) == ("PENDING", "ATTEMPTING", 1)
    assert state.attempt_id == "1-1" and state.sent_at is None


def test_sending_requires_the_journal_first() -> None:
    with pytest.raises(InvalidTransition):
        transition(JOB, None, S.ACCEPTED)


def test_versions_increase_and_keep_gateway_id_attempts_and_sent_at() -> None:
    accepted = reach(S.ACCEPTED)
    delivered = transition(JOB, accepted, S.DELIVERED)
    assert delivered.version == accepted.version + 1 == 3
    assert delivered.gateway_job_id == "g1"
    assert delivered.sent_at == accepted.sent_at is not None


def test_a_note_keeps_the_status_and_bumps_the_version() -> None:
    accepted = reach(S.ACCEPTED)
    note = transition(JOB, accepted, S.ACCEPTED, reason="cancel not possible", actor="ops")
    assert (note.status, note.previous, note.version) == ("ACCEPTED", "ACCEPTED", 3)


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (S.READ, S.DELIVERED),
        (S.DELIVERED, S.ACCEPTED),
        (S.EXPIRED, S.ACCEPTED),
        (S.CANCELLED, S.ATTEMPTING),
        (S.DEAD, S.ACCEPTED),
    ],
)
def test_backwards_or_from_final_states_is_rejected(start: S, to: S) -> None:
    with pytest.raises(InvalidTransition):
        transition(JOB, reach(start), to)


def test_operator_reprocess_reenters_attempting_from_dead() -> None:
    assert transition(JOB, reach(S.DEAD), S.ATTEMPTING).status == "ATTEMPTING"


def test_every_state_has_a_row() -> None:
    assert set(ALLOWED) == set(S)


@pytest.mark.parametrize(
    "start", [None, S.RETRY_WAIT, S.ATTEMPTING, S.ACCEPTED, S.DELIVERED, S.DEAD, S.FAILED]
)
def test_an_opt_out_ends_a_job_not_sent_yet_or_refused_by_the_gateway(start: S | None) -> None:
    paths = {S.RETRY_WAIT: [S.ATTEMPTING, S.RETRY_WAIT], S.FAILED: [S.ATTEMPTING, S.FAILED]}
    current = None
    for step in paths.get(start, []) if start is not None else []:
        current = transition(JOB, current, step)
    if start is not None and start not in paths:
        current = reach(start)
    assert transition(JOB, current, S.OPTED_OUT, reason="opted out").status == "OPTED_OUT"


@pytest.mark.parametrize("to", [S.ATTEMPTING, S.ACCEPTED, S.PENDING, S.CANCELLED, S.FAILED])
def test_opted_out_is_final_and_settled(to: S) -> None:
    from streams.kernel.state_machine import REPROCESSABLE, SETTLED

    opted_out = transition(JOB, None, S.OPTED_OUT)
    assert S.OPTED_OUT in SETTLED and S.OPTED_OUT not in REPROCESSABLE
    with pytest.raises(InvalidTransition):
        transition(JOB, opted_out, to)


def test_a_read_message_is_never_opted_out_afterwards() -> None:
    with pytest.raises(InvalidTransition):
        transition(JOB, reach(S.READ), S.OPTED_OUT)
