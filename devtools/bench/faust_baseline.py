"""``make bench`` baseline: a bare Faust agent that updates one Table per message.

Consumes ``--topic`` from the earliest offset in its own consumer group, adds 1
to a counter per message key in an in-memory Table (changelog
``<app-id>-counts-changelog``, which the bench creates up front with the
topic's partition count: Tansu would auto-create it with 4), and once it has
seen ``--expect`` messages logs one line ``bench-baseline-result {json}`` with
the messages/s and CPU ms per message from its first message to its last.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import faust
import orjson


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devtools.bench.faust_baseline")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--app-id", default="bench-faust-baseline")
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    app = faust.App(
        args.app_id,
        broker=[f"kafka://{b}" for b in args.brokers.split(",")],
        autodiscover=False,
        datadir=args.data_dir,
        store="memory://",
        processing_guarantee="at_least_once",
        topic_partitions=args.partitions,
        topic_allow_declare=True,
        broker_session_timeout=6,
        broker_heartbeat_interval=1,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        table_standby_replicas=0,
        web_enabled=False,
    )
    topic = app.topic(
        args.topic, key_serializer="raw", value_serializer="raw", partitions=args.partitions
    )
    counts = app.Table("counts", default=int, partitions=args.partitions)
    state: dict[str, Any] = {"seen": 0}

    @app.agent(topic)
    async def count(stream: Any) -> None:
        async for key, _value in stream.items():
            counts[key] += 1
            state["seen"] += 1
            if state["seen"] == 1:
                state["t0"], state["cpu0"] = time.monotonic(), sum(os.times()[:2])
            if state["seen"] == args.expect:
                elapsed = time.monotonic() - state["t0"]
                cpu = sum(os.times()[:2]) - state["cpu0"]
                n = args.expect - 1  # intervals between the first and the last message
                result = {
                    "messages": args.expect,
                    "msg_s": n / elapsed if elapsed > 0 else None,
                    "cpu_ms_per_msg": cpu / n * 1000 if n else None,
                }
                print(f"bench-baseline-result {orjson.dumps(result).decode()}", flush=True)

    worker = faust.Worker(app, loglevel=args.log_level.upper(), quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
