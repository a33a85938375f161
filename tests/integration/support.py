"""Helpers the integration tests share: polling with a deadline, counting rows, gateway arrivals.

Fixtures live in ``conftest.py``; plain helpers live here so tests import them
from a module, not from pytest's conftest machinery.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
from aiokafka import AIOKafkaProducer

from devtools.stack.delivery_audit import DeliveryReport, audit
from devtools.stack.dev_runner import enqueue_demo
from devtools.stack.local_pipeline import LocalPipeline
from streams.kernel.contract import ContractError, IntentCaptured
from tests.integration.topic_reader import TopicRecord, read_topic

REPO_ROOT = Path(__file__).resolve().parents[2]


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.2
) -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def count_rows(dsn: str, sql: str, params: tuple[object, ...] = ()) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
        return int(row[0]) if row else 0


class Arrivals:
    """What the gateway simulator accepted, fetched incrementally."""

    def __init__(self, pipeline: LocalPipeline) -> None:
        self.pipeline = pipeline
        self.items: list[dict[str, Any]] = []

    def refresh(self) -> list[dict[str, Any]]:
        self.items.extend(self.pipeline.sim_messages(since=len(self.items)))
        return self.items

    def wait_for(self, keys: list[str], timeout_s: float) -> DeliveryReport:
        """Wait until every key arrived at least once; return the audit."""
        report = audit(keys, self.refresh())
        deadline = time.monotonic() + timeout_s
        while report.missing and time.monotonic() < deadline:
            time.sleep(0.25)
            report = audit(keys, self.refresh())
        assert not report.missing, (
            f"{len(report.missing)} of {len(keys)} never reached the gateway, "
            f"e.g. {report.missing[:5]}"
        )
        return report


def enqueue_conversations(
    dsn: str,
    run: str,
    *,
    messages: int,
    conversations: int,
    per_transaction: int = 100,
    instances: int = 5,
    after_transaction: Callable[[int], None] | None = None,
) -> list[str]:
    """Enqueue ``messages`` spread round-robin over ``conversations``, in commit order."""
    keys, _ = enqueue_demo(
        dsn,
        run=run,
        messages=messages,
        instances=instances,
        conversations=conversations,
        batch=per_transaction,
        after_transaction=after_transaction,
    )
    return keys


class PacedWriter(threading.Thread):
    """The application, in the background: :func:`enqueue_conversations`, pausing
    ``pause_s`` after each transaction so a fault lands mid-stream. :attr:`committed` counts
    the rows committed so far; :attr:`keys` holds every key once the writer is done."""

    def __init__(
        self,
        dsn: str,
        run: str,
        *,
        messages: int,
        conversations: int,
        per_transaction: int,
        pause_s: float,
    ) -> None:
        super().__init__(name=f"writer-{run}")
        self._args = (dsn, run)
        self._shape = {
            "messages": messages,
            "conversations": conversations,
            "per_transaction": per_transaction,
        }
        self._pause_s = pause_s
        self.committed = 0
        self.keys: list[str] = []

    def run(self) -> None:
        self.keys.extend(
            enqueue_conversations(*self._args, **self._shape, after_transaction=self._pace)
        )

    def _pace(self, committed: int) -> None:
        self.committed = committed
        time.sleep(self._pause_s)

    def reached(self, rows: int) -> Callable[[], bool]:
        """A :func:`wait_until` predicate: ``rows`` rows committed."""
        return lambda: self.committed >= rows


def wait_for_status(dsn: str, keys: list[str], status: str, timeout_s: float) -> None:
    """Wait until the state sink wrote ``status`` for every key into outbox_jobs."""
    sql = "SELECT count(*) FROM outbox_jobs WHERE idempotency_key = ANY(%s) AND status = %s"
    wait_until(
        lambda: count_rows(dsn, sql, (keys, status)) == len(keys),
        timeout_s,
        f"{len(keys)} jobs {status} in outbox_jobs (have {count_rows(dsn, sql, (keys, status))})",
    )


def zapstream(args: list[str], env: dict[str, str], timeout_s: float = 90) -> tuple[int, str, str]:
    """Run ``zapstream ARGS`` as an operator would (a subprocess); print and return
    (exit code, stdout, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "connectors.cli", "--log-level", "warning", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    print(f"$ zapstream {' '.join(args)} -> exit {proc.returncode}")
    print(proc.stdout.rstrip())
    print(proc.stderr.rstrip())
    return proc.returncode, proc.stdout, proc.stderr


def intents_of(pipeline: LocalPipeline, keys: set[str]) -> list[TopicRecord]:
    """The records on the pipeline's intents topic whose intent has one of ``keys``."""
    found = []
    for record in read_topic(pipeline.kafka.bootstrap, pipeline.topics.intents):
        try:
            intent = IntentCaptured.loads(record.value)
        except ContractError:
            continue  # commands and receipts share the topic
        if intent.idempotency_key in keys:
            found.append(record)
    return found


async def republish(pipeline: LocalPipeline, records: list[TopicRecord]) -> None:
    """Byte for byte, same key and partition: what an offset rewind would deliver again."""
    producer = AIOKafkaProducer(bootstrap_servers=pipeline.kafka.bootstrap, acks="all")
    await producer.start()
    try:
        acks = [
            await producer.send(
                pipeline.topics.intents,
                value=r.value,
                key=r.key,
                partition=r.partition,
                headers=list(r.headers.items()),
            )
            for r in records
        ]
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


def metric_value(port: int, name: str) -> float:
    """An unlabelled sample from a service's ``/metrics`` on ``port`` (0.0 when absent)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0
