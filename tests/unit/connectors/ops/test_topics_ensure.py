"""``topics ensure`` waits for the topics it created to show in the metadata (KRaft brokers
answer CreateTopics before their own metadata cache has them), within a bound."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.ops import topics
from connectors.ops.topics import ensure_topics
from streams.kernel.contract import TopicSpec
from streams.kernel.settings import KafkaSettings
from streams.kernel.topics_check import TopicMismatch

SPECS = [TopicSpec("a", 2, {}), TopicSpec("b", 1, {})]


class LaggingAdmin:
    """Creates topics that the metadata shows only after ``hidden_for`` describe calls."""

    def __init__(self, hidden_for: int) -> None:
        self.hidden_for = hidden_for
        self.created: dict[str, int] = {}
        self.describes = 0
        self.closed = False

    async def list_topics(self) -> list[str]:
        return []

    async def create_topics(self, new: list[Any]) -> None:
        self.created.update((t.name, t.num_partitions) for t in new)

    async def describe_topics(self) -> list[dict[str, Any]]:
        self.describes += 1
        if self.describes <= self.hidden_for:
            return []
        return [{"topic": name, "partitions": [{}] * n} for name, n in self.created.items()]

    async def close(self) -> None:
        self.closed = True


def _use(monkeypatch: pytest.MonkeyPatch, admin: LaggingAdmin) -> None:
    async def started_admin(kafka: KafkaSettings) -> LaggingAdmin:
        return admin

    monkeypatch.setattr(topics, "_started_admin", started_admin)


async def test_created_topics_that_show_late_are_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = LaggingAdmin(hidden_for=3)
    _use(monkeypatch, admin)
    assert await ensure_topics(KafkaSettings(), SPECS) == ["a", "b"]
    assert admin.describes == 4 and admin.closed


async def test_a_created_topic_that_never_shows_is_refused_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = LaggingAdmin(hidden_for=10**6)
    _use(monkeypatch, admin)
    monkeypatch.setattr(topics, "CREATED_VISIBLE_S", 0.3)
    with pytest.raises(TopicMismatch, match="topic a was not created"):
        await ensure_topics(KafkaSettings(), SPECS)
    assert 2 <= admin.describes <= 10 and admin.closed
