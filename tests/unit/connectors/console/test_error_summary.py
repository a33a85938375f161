"""What of a job's errors a non-admin sees: no part of a gateway's message but allowed ones."""

from __future__ import annotations

import pytest

from connectors.console.error_summary import HIDDEN, error_summary


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("zapapi: HTTP 400: Your code is 482913. Do not share it.", f"zapapi: HTTP 400: {HIDDEN}"),
        (
            "gave up after 3 attempts: stackzap: HTTP 503: Service Unavailable",
            "gave up after 3 attempts: stackzap: HTTP 503: Service Unavailable",
        ),
        (
            "meta: HTTP 400: code 131026/2494010: Message undeliverable (fbtrace_id AbC)",
            "meta: HTTP 400: code 131026/2494010: Message undeliverable",
        ),
        (
            "meta: HTTP 401: code 190: token 12345 expired (gateway refused credentials)",
            f"meta: HTTP 401: code 190: {HIDDEN} (gateway refused credentials)",
        ),
        (
            "stackzap: ServerDisconnectedError: Server disconnected",
            "stackzap: ServerDisconnectedError: Server disconnected",
        ),
        (
            "outcome unknown (read timeout); zapapi: SocketTimeoutError: hi 4711; not resent",
            f"outcome unknown (read timeout); zapapi: SocketTimeoutError: {HIDDEN}",
        ),
        (
            "receipt 'failed': 131026 Message undeliverable: your code meta: 4711",
            "receipt 'failed': 131026: Message undeliverable",
        ),
        ("receipt 'failed'", "receipt 'failed'"),
        ("zapapi: HTTP 404", "zapapi: HTTP 404"),
        ("expired at 2026-01-31T12:00:00+00:00", "expired at 2026-01-31T12:00:00+00:00"),
        (None, None),
        ("", ""),
    ],
)
def test_only_codes_statuses_and_allowed_messages_remain(
    stored: str | None, shown: str | None
) -> None:
    assert error_summary(stored) == shown
