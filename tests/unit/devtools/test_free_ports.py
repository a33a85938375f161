"""find_free_port: each pytest-xdist worker hands out ports from a slice of its own."""

from __future__ import annotations

import socket

import pytest

from devtools.stack.devstack import find_free_port


@pytest.mark.parametrize(("worker", "low"), [("gw0", 20_000), ("gw1", 23_000), ("gw5", 23_000)])
def test_a_worker_draws_from_its_own_slice(
    monkeypatch: pytest.MonkeyPatch, worker: str, low: int
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    ports = {find_free_port() for _ in range(50)}
    assert all(low <= port < low + 3_000 for port in ports)
    assert len(ports) > 10  # drawn at random, not one port over and over
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))  # and free


def test_outside_xdist_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert find_free_port() >= 1024


def test_a_worker_never_hands_out_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Picked ports are bound later (a pipeline picks the simulator's before its brokers
    pick theirs): a port handed out and not bound yet must not be handed out again."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    ports = [find_free_port() for _ in range(1_000)]  # 1,000 of a 3,000-port slice
    assert len(set(ports)) == len(ports)
