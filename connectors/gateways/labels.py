"""Translate a gateway's job-state label into our :class:`~streams.kernel.contract.JobStatus`.

Each gateway has its own vocabulary (``queued``, ``server_ack``, ``played``...),
configured in :class:`~streams.kernel.settings.GatewaySettings`. A label we do not know,
or no label at all, becomes ``REVIEW``: a person looks at it, it never counts as
success.
"""

from __future__ import annotations

from collections.abc import Mapping

from streams.kernel.contract import JobStatus


def map_label(label: str | None, labels: Mapping[str, str]) -> JobStatus:
    """Our status for a gateway ``label`` (case-insensitive); unknown or missing -> REVIEW."""
    if not label:
        return JobStatus.REVIEW
    key = label.strip().lower()
    status = labels.get(key)
    if status is None:
        # Settings lower-case their keys; a hand-built mapping may not.
        for known, mapped in labels.items():
            if known.lower() == key:
                status = mapped
                break
    if status is None:
        return JobStatus.REVIEW
    member = JobStatus.__members__.get(status.upper())
    return member if member is not None else JobStatus.REVIEW
