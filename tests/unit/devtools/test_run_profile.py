"""``make dev``'s explanation of what its demo batch waited on, from CPU samples."""

from __future__ import annotations

import os

from devtools.stack.run_profile import RunProfile, Sample, process_cpu_s, sample


def _profile(
    *,
    enqueue_s: float,
    drain_s: float,
    worker_cpu_s: float,
    machine_busy: float,
    cores: int = 2,
) -> RunProfile:
    span = enqueue_s + drain_s
    start = Sample(1000.0, {"worker": 10.0, "relay": 5.0}, (100.0, 1000.0))
    middle = Sample(1000.0 + enqueue_s, {"worker": 10.0, "relay": 5.0}, (100.0, 1000.0))
    end = Sample(
        1000.0 + span,
        {"worker": 10.0 + worker_cpu_s, "relay": 5.0 + 0.1 * span},
        (100.0 + machine_busy * cores * span, 1000.0 + cores * span),
    )
    return RunProfile(10_000, start, middle, end, cores=cores)


def test_a_batch_drained_right_after_its_enqueue_waited_on_the_enqueue() -> None:
    profile = _profile(enqueue_s=5.0, drain_s=0.3, worker_cpu_s=2.0, machine_busy=0.5)
    assert profile.explain().startswith("the enqueue: the pipeline kept up with it")
    lines = profile.lines()
    assert lines[0].startswith("enqueue (application API): 10,000 in 5.0 s (2,000/s")
    assert "worker 38%" in lines[2] and "machine busy 50% of 2 cores" in lines[2]


def test_a_worker_using_a_whole_core_is_what_the_batch_waited_on() -> None:
    profile = _profile(enqueue_s=2.0, drain_s=4.0, worker_cpu_s=5.8, machine_busy=0.7)
    assert profile.explain() == "worker: it used 97% of a core (one Python process, one core)"


def test_a_busy_machine_comes_before_any_one_process() -> None:
    profile = _profile(enqueue_s=2.0, drain_s=4.0, worker_cpu_s=5.8, machine_busy=0.95)
    assert profile.explain().startswith("the machine: its 2 cores were 95% busy")


def test_nothing_busy_and_a_long_drain_is_said_plainly() -> None:
    profile = _profile(enqueue_s=2.0, drain_s=6.0, worker_cpu_s=1.0, machine_busy=0.3)
    assert profile.explain().startswith("none measured: no process was busy")


def test_samples_read_this_process_and_postgres_and_skip_the_gone() -> None:
    taken = sample({"me": os.getpid(), "gone": 2**22 + 12345})
    assert "me" in taken.processes and "gone" not in taken.processes
    assert "postgres" in taken.processes  # 0.0 when no PostgreSQL runs
    assert process_cpu_s(os.getpid()) is not None
    busy, total = taken.machine
    assert 0 <= busy <= total
