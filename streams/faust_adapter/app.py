"""A ``faust.App`` whose transport and agent queues are the worker's own.

Faust has no setting for the worker consumer's fetch wait, fetch size or isolation
level, nor for its agents' queues: :class:`AdaptedApp` overrides the two factories
(``App._new_transport``, private, and ``App.FlowControlQueue``) to hand Faust the
classes of :mod:`streams.faust_adapter.transport`. Checked against faust-streaming
0.15.3 (``faust/app/base.py``).
"""

from __future__ import annotations

from typing import Any

import faust

from streams.faust_adapter.transport import AgentQueue, KafkaTransport


class AdaptedApp(faust.App):
    """``faust.App`` with the worker's transport (fetch wait, isolation, flow control,
    commits) and agent queues that never block a put."""

    def __init__(
        self,
        *args: Any,
        fetch_max_wait_ms: int | None = None,
        isolation_level: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fetch_max_wait_ms = fetch_max_wait_ms
        """The worker consumer's fetch wait (see :mod:`streams.faust_adapter.transport`);
        None: Faust's."""
        self.isolation_level = isolation_level
        """The worker consumer's isolation level (see :mod:`streams.faust_adapter.transport`);
        None: Faust's (``read_uncommitted`` unless its own exactly-once processing is on)."""

    def _new_transport(self) -> Any:
        # Private factory (faust-streaming 0.15.3: App._new_transport() -> TransportT, read
        # once by the ``transport`` property): Faust's own aiokafka transport, but its
        # consumer honours fetch_max_wait_ms and commits only finished prefixes.
        return KafkaTransport(self.conf.broker_consumer, self)

    def FlowControlQueue(  # noqa: N802 (Faust's name)
        self, maxsize: int | None = None, *, clear_on_resume: bool = False
    ) -> AgentQueue:
        """Agents' queues: fetching pauses at ``maxsize``'s mark; a put never waits.

        Faust calls it for every agent's channel with ``stream_buffer_maxsize``
        (checked against faust-streaming 0.15.3: ``Channel.queue``).
        """
        return AgentQueue(
            pause_at=maxsize or self.conf.stream_buffer_maxsize,
            flow_control=self.flow_control,
            clear_on_resume=clear_on_resume,
        )
