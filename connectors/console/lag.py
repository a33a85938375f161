"""Consumer lag per partition, read from the lag monitor's Prometheus text.

``zapstream lag-monitor`` exports ``kafka_consumergroup_group_lag{group,topic,
partition}``; the console reads its ``/metrics`` page and parses it with
:mod:`prometheus_client.parser` rather than asking Kafka itself.
"""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["LAG_METRIC", "PartitionLag", "parse_lag"]

LAG_METRIC = "kafka_consumergroup_group_lag"


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionLag:
    """Records of one partition a consumer group has not committed."""

    group: str
    topic: str
    partition: int
    records: float


def parse_lag(text: str) -> list[PartitionLag]:
    """Every ``kafka_consumergroup_group_lag`` sample, by group, topic and partition."""
    lags = []
    for family in text_string_to_metric_families(text):
        if family.name != LAG_METRIC:
            continue
        for sample in family.samples:
            if sample.name != LAG_METRIC:
                continue
            labels = sample.labels
            lags.append(
                PartitionLag(
                    group=labels.get("group", ""),
                    topic=labels.get("topic", ""),
                    partition=int(labels.get("partition", "0")),
                    records=float(sample.value),
                )
            )
    return sorted(lags, key=lambda lag: (lag.group, lag.topic, lag.partition))
