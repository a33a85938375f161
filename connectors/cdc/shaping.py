"""Record shaping: everything the relay does to a row between pgoutput and Kafka, in one place.

A row's way to the wire, all of it here (the row rules and the rejection builders
themselves are :mod:`connectors.cdc.outbox_rows`):

1. **conversion**: the table's converter turns the row into its record
   (:meth:`RecordShaper.convert`), or a row with a value too large to parse into
   its rejection on size (:meth:`RecordShaper.oversized`);
2. **reduction**: a record over ``max_record_bytes`` becomes a reduced
   ``IntentRejected`` (:meth:`RecordShaper.producible`), encoded once;
3. **refusal**: a record Kafka will not take becomes its minimal rejection
   (:meth:`RecordShaper.minimal`);
4. **routing** and **headers**: the topic (under the configured prefix) and key
   from the contract's key functions (:meth:`RecordShaper.route`), and the
   ``zapstream-schema``/``zapstream-lsn``/``zapstream-job-id`` headers
   (:meth:`RecordShaper.headers`).

Pure: no I/O, no asyncio. The counters of what was rejected or reduced
(:class:`~connectors.cdc.metrics.RelayStats`, ``zapstream_relay_invalid_rows_total``)
are kept here because this is where it is decided.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeAlias

from connectors.cdc.metrics import INVALID_ROWS, RelayStats
from connectors.cdc.outbox_rows import (
    CapturedIntent,
    command_row_to_record,
    control_row_to_record,
    minimal_rejection,
    optout_row_to_record,
    oversized_rejection,
    reduced_rejection,
    replay_row_to_record,
    row_to_intent,
    with_cut_values,
)
from connectors.cdc.pgoutput import Insert
from connectors.cdc.provisioning import (
    COMMANDS_TABLE,
    CONTROLS_TABLE,
    OPTOUTS_TABLE,
    OUTBOX_TABLE,
    REPLAYS_TABLE,
)
from connectors.cdc.settings import RelaySettings
from streams.kernel.contract import (
    CONTROLS,
    HEADER_JOB_ID,
    HEADER_LSN,
    HEADER_SCHEMA,
    INTENTS,
    INVALID,
    CommandRequested,
    ControlChanged,
    IntentCaptured,
    IntentRejected,
    OptOutChanged,
    Record,
    intents_topic,
    job_state_key,
)

# The relay's log lines keep the logger name they always had: operators filter on it.
log = logging.getLogger("connectors.cdc.relay")

Outgoing: TypeAlias = Record | CapturedIntent
"""What the relay produces: a contract record, or an intent already in its JSON form."""
Converted: TypeAlias = (
    CapturedIntent
    | IntentCaptured
    | CommandRequested
    | ControlChanged
    | OptOutChanged
    | IntentRejected
)
Row: TypeAlias = dict[str, str | None]

CONVERTERS: dict[str, Callable[..., Converted]] = {
    OUTBOX_TABLE: row_to_intent,
    COMMANDS_TABLE: command_row_to_record,
    REPLAYS_TABLE: replay_row_to_record,
    CONTROLS_TABLE: control_row_to_record,
    OPTOUTS_TABLE: optout_row_to_record,
}
"""Each published table's converter: a row (pgoutput's text values) to its record."""

JOB_ID_COLUMNS: dict[str, str] = {
    OUTBOX_TABLE: "id",
    COMMANDS_TABLE: "job_id",
    REPLAYS_TABLE: "job_id",
}
"""The column naming a row's job, for a rejection built without converting the row."""

SCHEMA_HEADERS: dict[type, bytes] = {
    cls: cls.SCHEMA.encode()
    for cls in (
        IntentCaptured,
        CommandRequested,
        ControlChanged,
        OptOutChanged,
        IntentRejected,
        CapturedIntent,
    )
}
"""The ``zapstream-schema`` header value of each record type the relay produces."""

_INTENT_SCHEMA_HEADER = (HEADER_SCHEMA, SCHEMA_HEADERS[CapturedIntent])

MINIMAL: Record = IntentRejected(job_id=None, reason="", row={})
"""Marks a send that already is the minimal form of a refused record (never replaced again)."""

_INVALID_RULE = INVALID_ROWS.labels(reason="rule")
_INVALID_TOO_LARGE = INVALID_ROWS.labels(reason="too_large")
_INVALID_REFUSED = INVALID_ROWS.labels(reason="refused")


class RecordShaper:
    """Converts, reduces, routes and labels the relay's records (see the module docstring)."""

    def __init__(self, settings: RelaySettings, stats: RelayStats) -> None:
        self.max_record_bytes = settings.max_record_bytes
        self._max_value_bytes = settings.rejected_value_max_bytes
        self._stats = stats
        # Records are routed by logical topic (CapturedIntent.topic too); this names them
        # under ZAPSTREAM_KAFKA_TOPIC_PREFIX.
        self.topic_name = settings.kafka.names.by_logical()
        # The LSN header of the transaction being produced, encoded once for all its records.
        self._lsn_text = ""
        self._lsn_header = b""
        self._intent_lsn = (HEADER_LSN, b"")

    # --- conversion and reduction -----------------------------------------------------

    @staticmethod
    def convert(table: str, row: Row, lsn: str, committed_at: str | None) -> Converted:
        """The table's record for ``row``, or its rejection with the rule it broke."""
        return CONVERTERS[table](row, lsn=lsn, committed_at=committed_at)

    def oversized(
        self, table: str, insert: Insert, lsn: str, committed_at: str | None
    ) -> tuple[IntentRejected, Row]:
        """The rejection of a row with a value over ``max_record_bytes``, unparsed; and the row.

        The decoder left those values undecoded (``insert.oversized``); the rejection names
        their sizes and the setting and carries their heads (see ``oversized_rejection``).
        """
        assert insert.oversized
        rejection = oversized_rejection(
            row=insert.new,
            oversized=insert.oversized,
            job_id_column=JOB_ID_COLUMNS.get(table),
            limit_bytes=self.max_record_bytes,
            lsn=lsn,
            committed_at=committed_at,
            max_record_bytes=self.max_record_bytes,
            max_value_bytes=self._max_value_bytes,
        )
        return rejection, with_cut_values(insert.new, insert.oversized)

    def producible(self, record: Converted, row: Row) -> tuple[Converted, bytes]:
        """The record and its encoding, or a reduced rejection if it is over ``max_record_bytes``.

        The record is encoded once, here: the bytes measured are the bytes produced.
        """
        value = record.dumps()
        size = len(value)
        if size <= self.max_record_bytes:
            return record, value
        self._stats.reduced += 1
        if isinstance(record, IntentRejected):
            reason = record.reason
        else:
            reason = f"record too large: {size} bytes over the relay's {self.max_record_bytes}"
        reduced = reduced_rejection(
            job_id=getattr(record, "job_id", None),
            reason=reason,
            row=row,
            lsn=record.lsn,
            committed_at=getattr(record, "committed_at", None),
            max_record_bytes=self.max_record_bytes,
            max_value_bytes=self._max_value_bytes,
        )
        return reduced, reduced.dumps()

    def count(self, table: str, converted: Converted, record: Converted, too_large: bool) -> None:
        """Count one row about to be produced as ``record`` (converted as ``converted``)."""
        if type(record) is not IntentRejected:
            self._stats.intents += 1
            return
        self._stats.rejected += 1
        rule = type(converted) is IntentRejected and not too_large
        (_INVALID_RULE if rule else _INVALID_TOO_LARGE).inc()
        if too_large:
            self._stats.reduced += 1  # reduced before it was converted (oversized())
        log.warning("%s row for job %s rejected: %s", table, record.job_id, record.reason)

    def minimal(self, record: Outgoing, exc: BaseException) -> IntentRejected:
        """What replaces a record Kafka refused: job id, LSN, reason and a reference."""
        self._stats.reduced += 1
        if isinstance(record, CapturedIntent):
            record = record.record()
        if not isinstance(record, IntentRejected):
            _INVALID_REFUSED.inc()
        job_id = getattr(record, "job_id", None)
        log.warning("Kafka refused the record for job %s (%r); sending its reference", job_id, exc)
        return minimal_rejection(
            job_id=job_id if isinstance(job_id, int) else None,
            reason=f"record too large or refused by Kafka: {exc!r}",
            lsn=str(getattr(record, "lsn", "0/0")),
            committed_at=getattr(record, "committed_at", None),
            row=_reference(record),
        )

    # --- routing and headers ----------------------------------------------------------

    def route(self, record: Outgoing) -> tuple[str, bytes]:
        """Topic and key: intents by conversation, controls by target, rejections by job id."""
        topic, key = route_logical(record)
        return self.topic_name[topic], key

    def intent_headers(self, intent: CapturedIntent) -> list[tuple[str, bytes]]:
        """:meth:`headers` of a :class:`CapturedIntent` (the relay's hot path, once per row)."""
        lsn = intent.lsn
        if lsn != self._lsn_text:
            self._lsn_text, self._lsn_header = lsn, lsn.encode()
            self._intent_lsn = (HEADER_LSN, self._lsn_header)
        return [_INTENT_SCHEMA_HEADER, self._intent_lsn, (HEADER_JOB_ID, b"%d" % intent.job_id)]

    def headers(self, record: Outgoing) -> list[tuple[str, bytes]]:
        lsn: str = getattr(record, "lsn", "0/0")
        if lsn != self._lsn_text:
            # Every record of a transaction carries the same LSN: encode it once.
            self._lsn_text, self._lsn_header = lsn, lsn.encode()
            self._intent_lsn = (HEADER_LSN, self._lsn_header)
        return [
            (HEADER_SCHEMA, SCHEMA_HEADERS[type(record)]),
            (HEADER_LSN, self._lsn_header),
            (HEADER_JOB_ID, str(getattr(record, "job_id", None)).encode()),
        ]


def route_logical(record: Outgoing) -> tuple[str, bytes]:
    """The logical topic and the key, by the contract's key functions (streams.kernel.contract)."""
    if isinstance(record, CapturedIntent):
        return record.topic, record.partition_key
    if isinstance(record, IntentCaptured):
        # Operational and bulk intents travel apart (streams.kernel.contract.BULK_INTENTS).
        return intents_topic(record.priority), record.partition_key
    if isinstance(record, CommandRequested):
        return INTENTS, record.partition_key
    if isinstance(record, ControlChanged):
        # One partition, compacted by "<kind>:<target>": every worker reads every control.
        return CONTROLS, record.partition_key
    if isinstance(record, OptOutChanged):
        # Beside the controls, compacted per instance and person: every worker reads them all.
        return CONTROLS, record.partition_key
    assert isinstance(record, IntentRejected)
    if record.job_id is None:
        return INVALID, b"None"  # a rejection naming no job (a control row): keyed as ever
    return INVALID, job_state_key(record.job_id)


def _reference(record: Record) -> dict[str, str | None] | None:
    """The columns that say which row a minimal rejection stands for."""
    if isinstance(record, IntentRejected):
        return record.row
    if isinstance(record, CommandRequested):
        return {
            "id": str(record.command_id),
            "job_id": str(record.job_id),
            "command": str(record.command),
        }
    if isinstance(record, ControlChanged):
        return {"id": str(record.control_id)}
    if isinstance(record, OptOutChanged):
        return {"id": str(record.optout_id)}
    return None
