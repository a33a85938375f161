"""What the relay needs from a replication source, as a Protocol.

:class:`~connectors.cdc.relay.OutboxRelay` reads WAL messages and confirms
positions through :class:`ReplicationSource` rather than through the concrete
:class:`~connectors.cdc.replication_stream.ReplicationStream`, so that

- the relay loop (ack ordering, backpressure, drain on SIGTERM, failure on a
  Kafka nack) is unit-tested with a fake that yields scripted pgoutput
  messages and records every confirmation, without PostgreSQL;
- the streaming source can be swapped for another one (e.g. SQL polling of
  ``pg_logical_slot_peek_binary_changes``) without touching the relay.

A source is single-use: the relay builds a new one for every connection attempt.
"""

from __future__ import annotations

from typing import Protocol

from connectors.cdc.lsn import Lsn
from connectors.cdc.replication_messages import PrimaryKeepalive, XLogData


class ReplicationSource(Protocol):
    """A stream of pgoutput XLogData and keepalives from one slot, and its confirmation channel."""

    async def start(self, start_lsn: Lsn) -> None:
        """Connect and start streaming; ``Lsn.ZERO`` resumes at the slot's confirmed position.

        Raises :class:`~connectors.cdc.replication_stream.SlotInUse` while another
        consumer holds the slot.
        """
        ...

    async def read(self, timeout_s: float) -> XLogData | PrimaryKeepalive | None:
        """The next message, or None if none came within ``timeout_s``.

        Raises :class:`~connectors.cdc.replication_stream.ReplicationStreamClosed`
        once the stream ended.
        """
        ...

    def read_nowait(self) -> XLogData | PrimaryKeepalive | None:
        """The next message if it was already received, else None; never waits.

        What ``read(timeout_s=0)`` returns, without a coroutine per message
        (the relay calls it once per WAL message while batches fill).
        """
        ...

    async def send_status(self, *, flush: Lsn, reply_requested: bool = False) -> None:
        """Confirm that everything up to ``flush`` is durable downstream."""
        ...

    async def close(self) -> None:
        """Hang up. Idempotent."""
        ...
