"""The command line's logging: a dropped connection's orphaned future never adds a traceback
to a one-line failure; any other unretrieved exception still does."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import pytest

from connectors import cli


def _orphan(exc: BaseException) -> None:
    async def leave() -> None:
        asyncio.get_running_loop().create_future().set_exception(exc)

    asyncio.run(leave())
    gc.collect()


@pytest.fixture
def asyncio_errors(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    cli._configure_logging("warning")
    yield caplog  # the asyncio logger propagates to caplog's handler on the root
    logging.getLogger("asyncio").removeFilter(cli._orphaned_connection_errors)


def test_a_reset_connections_unread_error_is_not_printed(
    asyncio_errors: pytest.LogCaptureFixture,
) -> None:
    _orphan(ConnectionResetError(104, "Connection reset by peer"))
    assert [r for r in asyncio_errors.records if r.name == "asyncio"] == []


def test_any_other_unread_error_is_still_printed(
    asyncio_errors: pytest.LogCaptureFixture,
) -> None:
    _orphan(ValueError("a bug"))
    [record] = [r for r in asyncio_errors.records if r.name == "asyncio"]
    assert "never retrieved" in record.getMessage()
