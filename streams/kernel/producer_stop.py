"""Stop an aiokafka producer within a deadline, even while Kafka is down.

``AIOKafkaProducer.stop()`` flushes first: it waits until every record sent so far is
acknowledged or has failed. An idempotent producer (``enable_idempotence``, what
zapstream's clients use on Apache Kafka) never lets a batch expire: it retries it until
the broker answers, ``request_timeout_ms`` notwithstanding (aiokafka's
``Sender._can_retry``; aio-libs/aiokafka#1101). With the broker down, ``stop()`` then
never returns, and a service asked to stop during a Kafka outage hangs until it is
killed. (Tansu's clients are not idempotent: their batches expire and ``stop()`` returns.)

:func:`stop_producer` gives the flush ``timeout_s``; past it, it ends the producer's
sender (whoever sent the records still unacknowledged has given up on them by then), and
``stop()`` goes on to close the connections.

The one place zapstream reaches into aiokafka's producer (:func:`_sender`, checked against
aiokafka 0.14.0; ``tests/unit/streams/kernel/test_producer_hooks.py`` fails first when an
upgrade moves it); the worker's Faust and aiokafka hooks are in :mod:`streams.faust_adapter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

log = logging.getLogger(__name__)


def _sender(producer: AIOKafkaProducer) -> Any:
    """aiokafka's private ``Sender`` of ``producer`` (``AIOKafkaProducer._sender``, checked
    against aiokafka 0.14.0: its ``sender_task`` property and ``close()`` coroutine), or None."""
    return getattr(producer, "_sender", None)


async def abandon_sender(producer: AIOKafkaProducer) -> None:
    """End ``producer``'s sender: it stops retrying what Kafka never acknowledged."""
    sender = _sender(producer)
    if sender is not None:
        with contextlib.suppress(Exception):
            await sender.close()


async def stop_producer(producer: AIOKafkaProducer, timeout_s: float, *, what: str) -> bool:
    """Stop ``producer``, waiting at most ``timeout_s`` for its unacknowledged records.

    True if it stopped with everything flushed; False if records were still unacknowledged
    after ``timeout_s`` (one WARNING naming ``what``, e.g. "the webhook intake"): the
    producer is closed all the same, without them.
    """
    stopping = asyncio.ensure_future(producer.stop())
    done, _ = await asyncio.wait({stopping}, timeout=timeout_s)
    if done:
        stopping.result()
        return True
    log.warning(
        "%s: Kafka did not acknowledge its last records within %.0f s of stopping; "
        "closing without them (maybe written, maybe not)",
        what,
        timeout_s,
    )
    # stop() waits for the flush or for the sender task to end, whichever comes first:
    # end the sender (it finishes the requests in flight, then returns), and stop() goes
    # on to close the connections.
    sender = getattr(_sender(producer), "sender_task", None)
    if sender is not None:
        sender.cancel()
    done, _ = await asyncio.wait({stopping}, timeout=timeout_s)
    if done:
        stopping.result()
    else:  # aiokafka changed under us: give up on a clean close rather than hang
        stopping.cancel()
        log.warning("%s: the Kafka producer did not close; abandoned", what)
    # The records never acknowledged stay unresolved: whoever sent them gave up on them
    # (the intake answered 503). Not failed through the accumulator's fail_all: a batch
    # queued again for a retry is then removed twice (a KeyError logged by asyncio).
    return False
