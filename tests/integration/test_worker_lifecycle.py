"""The worker under the runtime's contract, on real processes: ``/readyz`` answers
``readiness()`` (200 ``streaming`` while it runs its streams) and a SIGTERM ends it with
exit 0 and one closing line in the format of ``run_until_signalled``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from devtools.stack.devstack import find_free_port
from devtools.stack.local_pipeline import LocalPipeline
from tests.integration.support import enqueue_conversations, wait_for_status, wait_until

pytestmark = pytest.mark.integration

CLOSING = re.compile(
    r"zapstream worker stopped after \d+\.\ds: (?P<intents>[\d,]+) intents \(.*\d ACCEPTED.*\), "
    r"[\d,]+ receipts, [\d,]+ commands, [\d,]+ poison records"
)


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    with LocalPipeline(partitions=2) as p:
        p.start_relay()
        p.start_sink()
        yield p


def test_ready_while_streaming_and_one_closing_line_on_sigterm(pipeline: LocalPipeline) -> None:
    port = find_free_port()
    worker = pipeline.start_worker("worker", env={"ZAPSTREAM_WORKER_WEB_PORT": str(port)})
    readyz = f"http://127.0.0.1:{port}/readyz"
    wait_until(lambda: httpx.get(readyz, timeout=5).status_code == 200, 60, "/readyz 200")
    assert httpx.get(readyz, timeout=5).text == "streaming\n"
    keys = enqueue_conversations(pipeline.dsn, uuid.uuid4().hex[:8], messages=20, conversations=4)
    wait_for_status(pipeline.dsn, keys, "ACCEPTED", 120)

    assert worker.terminate(timeout_s=60) == 0, worker.log_tail()
    log = worker.log_path.read_text(encoding="utf-8", errors="replace")
    lines = [line for line in log.splitlines() if "zapstream worker stopped after" in line]
    assert len(lines) == 1, worker.log_tail()
    found = CLOSING.search(lines[0])
    assert found is not None, lines[0]
    assert int(found["intents"].replace(",", "")) >= len(keys)
