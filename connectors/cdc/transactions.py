"""Exactly-once from PostgreSQL into Kafka (``ZAPSTREAM_RELAY_EXACTLY_ONCE``): the pieces.

Without it the relay is at-least-once: it confirms an LSN to PostgreSQL once Kafka
acknowledged everything before it, and a relay killed between an acknowledgement and
the next confirmation produces those records again (the worker drops them by job id).

With it, as Kafka Connect's exactly-once source connectors do (KIP-618: the source
position is written in the same transaction as the records), the relay

1. takes the slot first (PostgreSQL lets one relay stream it), then starts a
   transactional producer whose ``transactional.id`` is :func:`transactional_id`,
   the same for every relay of the slot: its InitProducerId fences the previous
   relay (a zombie's later writes are refused) and aborts what it left open;
2. produces every record inside a Kafka transaction that begins with the first
   send after the last commit and is committed at a PostgreSQL transaction boundary
   (never inside one), when ``transaction_interval_s`` passed or no more WAL is at
   hand, after every record of it was acknowledged (a record Kafka refuses is
   replaced by its ``zapstream.invalid`` reference in the same transaction);
3. commits with the records the position reached (:class:`KafkaPosition`: the LSN
   and the database's system identifier), as the offset metadata of the consumer
   group of the same name (``send_offsets_to_transaction``), so the records and the
   position become visible together or not at all;
4. confirms that LSN to PostgreSQL only after the commit returned;
5. on start, reads the stored position (:func:`read_position`) and skips every
   PostgreSQL transaction that ends at or before it (:func:`resume_point`): those
   are in Kafka already, even when the relay died between the Kafka commit and the
   confirmation to PostgreSQL.

A failed transaction (a send Kafka did not acknowledge, the brokers away, the
replication connection lost) is never committed: the relay drops its producer,
the next one aborts it on start, and streaming resumes from the last committed
position. ``read_committed`` consumers (the worker, the state sink, the group-less
readers: :attr:`streams.kernel.settings.KafkaSettings.consumer_isolation_level`) never
see an aborted record; ``read_uncommitted`` ones do.

The position's group commits an offset on partition 0 of ``zapstream.controls`` (an
offset commit needs a partition); the offset means nothing, the metadata is the
position. Nothing consumes as that group.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import orjson

from connectors.cdc.lsn import Lsn

if TYPE_CHECKING:
    from aiokafka import TopicPartition

    from connectors.cdc.settings import RelaySettings

log = logging.getLogger(__name__)

_NAME = "zapstream-relay."
_VERSION = 1


def transactional_id(settings: RelaySettings) -> str:
    """The relay's ``transactional.id`` and its position's group: one per slot (and prefix)."""
    return settings.kafka.names.group(_NAME + settings.slot)


def position_partition(settings: RelaySettings) -> TopicPartition:
    """The partition the position's offset is committed on (the offset itself means nothing)."""
    from aiokafka import TopicPartition

    return TopicPartition(settings.kafka.names.controls, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaPosition:
    """Where the relay's committed Kafka transactions reached in the slot's WAL."""

    lsn: Lsn
    """The end LSN of the last PostgreSQL transaction whose records are committed."""
    slot: str
    system_id: str | None
    """PostgreSQL's system identifier (IDENTIFY_SYSTEM): a position read against another
    database (restored, replaced) is not used."""
    timeline: int | None = None
    """The WAL timeline it was written on (IDENTIFY_SYSTEM): after a promotion the new
    primary's WAL may reuse positions past where the standby stopped receiving, so a position
    from another timeline is not used. None: written by a relay before it was kept."""

    def metadata(self) -> str:
        """The offset metadata text (Kafka keeps up to ``offset.metadata.max.bytes``, 4096)."""
        return orjson.dumps(
            {
                "v": _VERSION,
                "lsn": str(self.lsn),
                "slot": self.slot,
                "system": self.system_id,
                "timeline": self.timeline,
            }
        ).decode()

    @classmethod
    def parse(cls, text: str | None) -> KafkaPosition | None:
        """The position in ``text``; None when there is none (or it is not ours)."""
        if not text:
            return None
        try:
            data = orjson.loads(text)
            if not isinstance(data, dict) or data.get("v") != _VERSION:
                return None
            system, timeline = data.get("system"), data.get("timeline")
            return cls(
                Lsn.parse(str(data["lsn"])),
                str(data["slot"]),
                None if system is None else str(system),
                None if timeline is None else int(timeline),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


def resume_point(
    stored: KafkaPosition | None,
    *,
    slot: str,
    system_id: str | None,
    timeline: int | None = None,
) -> Lsn | None:
    """The LSN up to which Kafka already holds the slot's records; None: nothing known.

    A position stored for another slot, by a relay streaming another database (system
    identifiers differ), or on another timeline (a standby was promoted since) says nothing
    certain about this WAL: None, with a warning.
    """
    if stored is None:
        return None
    if stored.slot != slot:
        log.warning(
            "exactly-once: the stored Kafka position is for slot %s, not %s; not used",
            stored.slot,
            slot,
        )
        return None
    if stored.system_id is not None and system_id is not None and stored.system_id != system_id:
        log.warning(
            "exactly-once: the stored Kafka position %s was written against another PostgreSQL "
            "(system %s, now %s); not used: rows produced since the last confirmation may be "
            "produced again",
            stored.lsn,
            stored.system_id,
            system_id,
        )
        return None
    if stored.timeline is not None and timeline is not None and stored.timeline != timeline:
        log.warning(
            "exactly-once: the stored Kafka position %s was written on timeline %s, now %s (a "
            "promotion); not used: rows produced since the last confirmation may be produced "
            "again, and the worker drops them",
            stored.lsn,
            stored.timeline,
            timeline,
        )
        return None
    return stored.lsn


def already_in_kafka(final_lsn: Lsn, resume: Lsn) -> bool:
    """A transaction whose commit record starts before ``resume`` ended at or before it.

    ``resume`` is the end LSN of the last committed transaction; the next transaction's
    commit record (its Begin's ``final_lsn``) starts at or after that end.
    """
    return final_lsn < resume


async def read_position(settings: RelaySettings) -> KafkaPosition | None:
    """The position the relay's last committed transaction stored; None if none is stored.

    Read after the transactional producer started: its InitProducerId aborted whatever
    the previous relay left open, so no offset of this group is pending.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    kafka = settings.kafka
    admin = AIOKafkaAdminClient(
        client_id="zapstream-relay", **kafka.client_options(), **kafka.deadline_options()
    )
    await admin.start()
    try:
        tp = position_partition(settings)
        offsets: dict[Any, Any] = await admin.list_consumer_group_offsets(
            transactional_id(settings), partitions=[tp]
        )
    finally:
        await admin.close()
    meta = offsets.get(tp)
    if meta is None or meta.offset < 0:
        return None
    return KafkaPosition.parse(meta.metadata)
