"""The deployables' contract with their supervisor, on real processes (issue 17, item 1).

Every deployable (relay, worker, sink, webhook, lag monitor, console) runs on the one
service runtime (:func:`streams.kernel.runtime.run.run_until_signalled`, the worker on
Faust with the same closing line), so each answers the same two questions the same way:

- a refused start (a setting no retry fixes, a port it cannot serve) is exactly one
  line on stderr and exit status 2, no traceback;
- SIGTERM once it is up drains it and ends it with exactly one closing summary line
  (``zapstream <name> stopped after <s>s: <summary>``) and exit status 0.

One PostgreSQL and one Kafka topic namespace serve the whole module (the processes only
need them to come up); the gateway is a closed port (the worker's start probe says so in
a line and the worker runs on). Readiness is polled on each deployable's HTTP port.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.stack import shared_broker
from devtools.stack.devstack import ManagedProcess, PostgresCluster, TansuBroker, find_free_port
from devtools.stack.local_pipeline import default_broker
from tests.integration.support import wait_until, zapstream

REPO_ROOT = Path(__file__).resolve().parents[2]
BROKER = default_broker()
UP_S = 60.0
"""The worker (Faust) takes longest to come up: a group join on a fresh namespace."""
CONSOLE_TOKENS = '{"contract-token-0123456789abcdefgh": {"operator": "ci", "role": "viewer"}}'


@dataclasses.dataclass(frozen=True)
class Deployable:
    command: str
    name: str
    """The service's name in its closing line."""
    port_env: str
    """The setting of the port its /healthz answers on."""
    health_path: str = "/healthz"


DEPLOYABLES = [
    Deployable("relay", "relay", "ZAPSTREAM_RELAY_METRICS_PORT"),
    Deployable("worker", "worker", "ZAPSTREAM_WORKER_WEB_PORT"),
    Deployable("sink", "state sink", "ZAPSTREAM_SINK_METRICS_PORT"),
    Deployable("webhook", "webhook", "ZAPSTREAM_WEBHOOK_PORT"),
    Deployable("lag-monitor", "lag monitor", "ZAPSTREAM_LAG_METRICS_PORT"),
    Deployable("console", "console", "ZAPSTREAM_CONSOLE_PORT", "/login"),
]


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, str]]:
    """A migrated database with the relay's slot and every topic, shared by the module."""
    with PostgresCluster() as cluster, _namespace() as (bootstrap, prefix):
        dsn = cluster.create_database("contract")
        closed = find_free_port()
        base = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
        base.update(
            {
                "PYTHONPATH": str(REPO_ROOT),
                "ZAPSTREAM_DATABASE_URL": dsn,
                "ZAPSTREAM_RELAY_SLOT": "contract_slot",
                "ZAPSTREAM_KAFKA_BROKERS": bootstrap,
                "ZAPSTREAM_KAFKA_FLAVOR": BROKER,
                "ZAPSTREAM_KAFKA_TOPIC_PREFIX": prefix,
                "ZAPSTREAM_KAFKA_PARTITIONS": "2",
                "ZAPSTREAM_GATEWAY": "stackzap",
                "STACKZAP_API_URL": f"http://127.0.0.1:{closed}",
                "STACKZAP_API_KEY": "contract-key",
                "ZAPSTREAM_WEBHOOK_SECRET": "contract-secret-0123456789abcdef01",
                "ZAPSTREAM_REFERENCE_KEY": "contract-reference-key-0123456789ab",
                "ZAPSTREAM_WEBHOOK_HOST": "127.0.0.1",
                "ZAPSTREAM_CONSOLE_TOKENS": CONSOLE_TOKENS,
            }
        )
        assert zapstream(["db", "migrate"], base)[0] == 0
        assert zapstream(["topics", "ensure"], base)[0] == 0
        yield base


class _namespace:  # noqa: N801 - a context manager read as a function
    """A topic namespace of the module's own: a prefix on the shared Apache Kafka broker,
    or a fresh Tansu (which the tests run without prefixes)."""

    def __enter__(self) -> tuple[str, str]:
        if BROKER == "tansu":
            self._tansu: TansuBroker | None = TansuBroker()
            return self._tansu.__enter__().bootstrap, ""
        self._tansu = None
        self._broker = shared_broker.shared_broker()
        self._prefix = shared_broker.next_prefix()
        return self._broker.bootstrap, self._prefix

    def __exit__(self, *exc: object) -> None:
        if self._tansu is not None:
            self._tansu.__exit__(None, None, None)
        else:
            shared_broker.delete_namespace(self._broker.bootstrap, self._prefix)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _answers(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as reply:
            return int(reply.status) == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


# A cheap refusal each: an invalid setting where the deployable has no port of its own to
# lose (relay, worker), else the port it must serve already taken (the runtime's path).
REFUSALS = {
    "relay": ("ZAPSTREAM_RELAY_MAX_IN_FLIGHT", "many", "zapstream: ZAPSTREAM_RELAY_MAX_IN_FLIGHT"),
    "worker": ("ZAPSTREAM_KAFKA_PARTITIONS", "0", "zapstream: ZAPSTREAM_KAFKA_PARTITIONS: must be"),
    "sink": (
        "ZAPSTREAM_SINK_METRICS_PORT",
        None,
        "zapstream: state sink cannot start: cannot serve metrics on",
    ),
    "webhook": ("ZAPSTREAM_WEBHOOK_PORT", None, "zapstream: webhook cannot start: cannot listen"),
    "lag-monitor": (
        "ZAPSTREAM_LAG_METRICS_PORT",
        None,
        "zapstream: lag monitor cannot start: cannot serve metrics on",
    ),
    "console": ("ZAPSTREAM_CONSOLE_PORT", None, "zapstream: console cannot start: cannot listen"),
}


@pytest.mark.parametrize("deployable", DEPLOYABLES, ids=lambda d: d.command)
def test_a_refused_start_is_one_line_and_exit_2(
    deployable: Deployable, env: dict[str, str], taken_port: int
) -> None:
    name, value, expected = REFUSALS[deployable.command]
    code, _, err = zapstream(
        [deployable.command], {**env, name: str(taken_port) if value is None else value}
    )
    assert code == 2, err
    assert len(_lines(err)) == 1, err
    assert _lines(err)[0].startswith(expected), err
    assert "Traceback" not in err


@pytest.mark.parametrize("deployable", DEPLOYABLES, ids=lambda d: d.command)
def test_sigterm_gives_one_closing_line_and_exit_0(
    deployable: Deployable, env: dict[str, str], tmp_path: Path
) -> None:
    port = find_free_port()
    proc = ManagedProcess(
        [sys.executable, "-m", "connectors.cli", "--log-level", "info", deployable.command],
        env={**env, deployable.port_env: str(port)},
        log_path=tmp_path / f"{deployable.command}.log",
        name=deployable.command,
        cwd=REPO_ROOT,
    )
    with proc:
        wait_until(
            lambda: _answers(port, deployable.health_path) or not proc.is_running,
            UP_S,
            f"{deployable.command} to answer on {deployable.health_path}",
        )
        assert proc.is_running, proc.log_tail()
        proc.kill(signal.SIGTERM)
        code = proc.wait(timeout_s=60)
        log = proc.log_tail(400)
    assert code == 0, log
    closing = re.compile(rf"zapstream {re.escape(deployable.name)} stopped after \d+\.\ds: \S")
    lines = [line for line in _lines(log) if closing.search(line)]
    assert len(lines) == 1, log
    assert "Traceback" not in log, log
