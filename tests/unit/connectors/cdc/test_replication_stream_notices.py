"""Which server notices end a replication stream: PostgreSQL 18's skipped publication only.

The stream itself runs against real servers in tests/integration/test_replication_stream.py
(on 15 and 18); here, the notice filter alone, fed results shaped like libpq's."""

from __future__ import annotations

from typing import cast

from psycopg import pq
from psycopg.pq.abc import PGresult

from connectors.cdc.replication_stream import ReplicationStream

PUBLICATION = "zapstream_outbox"


class _Notice:
    """What the filter reads of a libpq notice: its SQLSTATE and primary message."""

    def __init__(self, sqlstate: str, message: str) -> None:
        self._fields = {
            pq.DiagnosticField.SQLSTATE: sqlstate.encode(),
            pq.DiagnosticField.MESSAGE_PRIMARY: message.encode(),
        }

    def error_field(self, field: pq.DiagnosticField) -> bytes | None:
        return self._fields.get(field)


def _after(*notices: _Notice) -> ReplicationStream:
    stream = ReplicationStream("postgresql://localhost/db", slot="s", publication=PUBLICATION)
    for notice in notices:
        stream._on_notice(cast(PGresult, notice))
    return stream


def test_the_skipped_publication_warning_ends_the_stream_for_good_as_on_15() -> None:
    stream = _after(_Notice("55000", 'skipped loading publication "zapstream_outbox"'))
    error = stream._skipped_publication
    assert error is not None
    assert (error.sqlstate, error.retriable) == ("42704", False)
    assert 'publication "zapstream_outbox"' in str(error)


def test_a_translated_message_is_recognised_by_its_code_and_the_quoted_name() -> None:
    stream = _after(_Notice("55000", 'Publikation "zapstream_outbox" beim Laden übersprungen'))
    assert stream._skipped_publication is not None


def test_other_notices_do_not_end_the_stream() -> None:
    stream = _after(
        _Notice("55000", 'skipped loading publication "someone_elses"'),
        _Notice("01000", 'something about "zapstream_outbox"'),
    )
    assert stream._skipped_publication is None
