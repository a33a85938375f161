"""``make bench`` relay section: the client ceiling, librdkafka producing the relay's rows.

The relay drains the outbox through aiokafka. How close is that to what a Kafka
client can do on this machine and broker? This module reads the same outbox rows
the relay bench drained (the first ``rows`` of ``outbox_jobs``, set-based fill
of :func:`devtools.bench.support.fill_outbox`) from PostgreSQL with psycopg,
turns each into the relay's own record (:func:`connectors.cdc.outbox_rows.row_to_intent`:
the same JSON value, the same key, the same three headers; the LSN is the fill's
end LSN and ``committed_at`` the row's ``created_at``), then produces them with
confluent-kafka (librdkafka) to a topic of their own with the same partition count
on the same broker: ``acks=all``, ``enable.idempotence=true``, the murmur2
partitioner (the relay's), no compression (as the relay), librdkafka's defaults
otherwise (``linger.ms`` 5 as the relay).

Timed: from the first ``produce()`` to ``flush()`` returning with every delivery
report in (Kafka acknowledged them all), after one warm-up record (metadata and
the idempotent producer's id) and with the rows read and encoded beforehand. So it
is the producer alone: the relay's figure also decodes the WAL and confirms the
slot, which is why this is a ceiling, not a like-for-like rival. The bench
process's CPU (all librdkafka threads) over the same span gives CPU per row.

If the broker refuses the idempotent producer (Tansu may: the relay turns its own
off there), the run is repeated without idempotence and the figure says so.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from connectors.cdc.outbox_rows import INTENT_COLUMNS, CapturedIntent, row_to_intent
from devtools.bench.support import Figure
from streams.kernel.contract import HEADER_JOB_ID, HEADER_LSN, HEADER_SCHEMA

TOPIC = "bench.librdkafka"
Record = tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]
"""key, value, headers: what the relay hands its producer for one intent."""


class IdempotenceRefused(RuntimeError):
    """The broker did not let the idempotent producer start (or deliver its first record)."""


def load_records(dsn: str, *, rows: int, lsn: str) -> list[Record]:
    """The first ``rows`` outbox rows (by id) as the relay's records."""
    columns = sorted(INTENT_COLUMNS)
    select = ", ".join(f"{c}::text" for c in columns)
    records: list[Record] = []
    lsn_header = lsn.encode()
    schema_header = CapturedIntent.SCHEMA.encode()
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(
            f"SELECT {select} FROM outbox_jobs ORDER BY id LIMIT %s",  # noqa: S608 (our columns)
            (rows,),
        )
        for values in cur:
            row = dict(zip(columns, values, strict=True))
            intent = row_to_intent(row, lsn=lsn, committed_at=row["created_at"])
            if not isinstance(intent, CapturedIntent):
                raise RuntimeError(f"bench: outbox row {row.get('id')} is not a valid intent")
            headers: list[tuple[str, str | bytes | None]] = [
                (HEADER_SCHEMA, schema_header),
                (HEADER_LSN, lsn_header),
                (HEADER_JOB_ID, str(intent.job_id).encode()),
            ]
            records.append((intent.partition_key, intent.dumps(), headers))
    if len(records) != rows:
        raise RuntimeError(f"bench: {len(records)} outbox rows found, {rows} expected")
    return records


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)], request_timeout=30
    )
    for future in futures.values():
        future.result(timeout=60)


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[Record],
    *,
    idempotence: bool,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Produce ``records`` to ``topic``; rows/s and CPU from the first send to the last ack."""
    from confluent_kafka import KafkaError, Producer

    lock = threading.Lock()
    failures: list[str] = []
    fatal: list[str] = []
    delivered = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is not None:
            with lock:
                failures.append(str(err))
        else:
            delivered += 1

    def on_error(err: Any) -> None:
        # Broker-level errors: a fatal one (the idempotent producer was refused) ends the run.
        if err.fatal() or err.code() == KafkaError._UNSUPPORTED_FEATURE:
            fatal.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "bench-librdkafka",
            "acks": "all",
            "enable.idempotence": idempotence,
            "partitioner": "murmur2_random",
            "compression.type": "none",
            "linger.ms": 5,
            "error_cb": on_error,
            "log_level": 3,  # errors only: a retried producer-id request is not news
        }
    )
    try:
        # Warm-up: metadata, connections and (idempotent) the producer id, before the clock.
        key, value, headers = records[0]
        producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
        remaining = producer.flush(30)
        if fatal or failures or remaining:
            why = "; ".join(fatal + failures) or f"{remaining} record(s) not delivered in 30 s"
            if idempotence:
                raise IdempotenceRefused(why)
            raise RuntimeError(f"bench: librdkafka warm-up failed: {why}")
        delivered = 0
        cpu0 = sum(os.times()[:2])
        started = time.monotonic()
        for i, (key, value, headers) in enumerate(records):
            while True:
                try:
                    producer.produce(
                        topic, value=value, key=key, headers=headers, on_delivery=on_delivery
                    )
                    break
                except BufferError:  # the local queue is full: serve delivery reports
                    producer.poll(0.01)
            if i % 1000 == 999:
                producer.poll(0)
            if fatal:
                break
        remaining = producer.flush(timeout_s)
        elapsed = time.monotonic() - started
        cpu = sum(os.times()[:2]) - cpu0
    finally:
        producer.flush(5)
    if fatal or failures or remaining or delivered != len(records):
        problems = fatal + failures[:3]
        if idempotence and fatal:
            raise IdempotenceRefused("; ".join(problems))
        raise RuntimeError(
            f"bench: librdkafka delivered {delivered}/{len(records)} "
            f"({remaining} still queued): {'; '.join(problems)}"
        )
    n = len(records)
    return {
        "rows": n,
        "rows_s": n / elapsed if elapsed > 0 else float("nan"),
        "seconds": elapsed,
        "cpu_us_row": cpu / n * 1e6,
        "idempotence": idempotence,
    }


def librdkafka_ceiling(
    dsn: str, bootstrap: str, *, rows: int, partitions: int, lsn: str
) -> dict[str, Any]:
    """Read the relay bench's rows, produce them with librdkafka; see the module docstring."""
    import confluent_kafka

    started = time.monotonic()
    records = load_records(dsn, rows=rows, lsn=lsn)
    load_s = time.monotonic() - started
    create_topic(bootstrap, TOPIC, partitions)
    refused = ""
    try:
        result = produce(bootstrap, TOPIC, records, idempotence=True)
    except IdempotenceRefused as exc:
        refused = str(exc)
        result = produce(bootstrap, TOPIC, records, idempotence=False)
    result.update(
        {
            "load_s": load_s,
            "idempotence_refused": refused,
            "value_bytes_mean": sum(len(r[1]) for r in records) / len(records),
            "confluent_kafka": confluent_kafka.__version__,
            "librdkafka": confluent_kafka.libversion()[0],
        }
    )
    return result


def librdkafka_figures(lib: Mapping[str, Any], relays: Mapping[str, float]) -> list[Figure]:
    """The librdkafka row and each relay variant's rate as a fraction of it.

    ``relays``: label -> rows/s, e.g. ``{"relay": 57_000}``; a transactional relay
    variant adds its own entry and gets its own fraction row.
    """
    rate = float(lib["rows_s"])
    idem = "idempotent" if lib["idempotence"] else "NOT idempotent (broker refused it)"
    figures = [
        Figure(
            "relay",
            f"librdkafka producer rows/s, the same {lib['rows']:,} rows (acks=all, {idem})",
            f"{rate:,.0f}",
            f"confluent-kafka {lib['confluent_kafka']} (librdkafka {lib['librdkafka']}), "
            f"producer alone: rows read and encoded beforehand ({lib['load_s']:.1f} s), "
            f"{lib['value_bytes_mean']:.0f} B/value; {lib['cpu_us_row']:.1f} us CPU/row",
            raw=dict(lib),
        )
    ]
    for label, relay_rate in relays.items():
        figures.append(
            Figure(
                "relay",
                f"{label} / librdkafka producer",
                f"{relay_rate / rate:.2f}",
                f"{label} {relay_rate:,.0f} rows/s (WAL decoding and slot confirmation "
                f"included); librdkafka {rate:,.0f} rows/s",
                raw={"relay_rows_s": relay_rate, "librdkafka_rows_s": rate},
            )
        )
    return figures
