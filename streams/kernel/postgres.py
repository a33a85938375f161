"""PostgreSQL connections that never hang a service: a client-side deadline, a reopening
connection for timers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg

log = logging.getLogger(__name__)


class PostgresSilent(psycopg.OperationalError):
    """PostgreSQL did not answer within a client-side deadline: the connection is presumed hung.

    An ``OperationalError`` without a SQLSTATE, so every edge classifies it as a failed
    connection (transient): drop the connection, reconnect with backoff.
    """


_FALLBACK_S = 11.0
"""After the hang-up, how long :func:`postgres_deadline` still waits before cancelling: the
cancel path takes psycopg up to 10 s more (a cancel request, then a wait, 5 s each)."""


@contextlib.asynccontextmanager
async def postgres_deadline(
    timeout_s: float, what: str, conn: psycopg.AsyncConnection[Any] | None = None
) -> AsyncIterator[None]:
    """Bound ``what`` (a query, a write on ``conn``) by ``timeout_s``; past it raise
    :class:`PostgresSilent`.

    The server's ``statement_timeout`` bounds a query it received; this bounds one it
    never answers (a peer that went silent without closing: TCP keepalives and
    ``tcp_user_timeout`` may take longer, or never fire through a proxy that still
    acknowledges). With ``conn`` the deadline hangs up its socket (``shutdown``), so the
    query fails at once with libpq's "server closed the connection" and the connection
    is closed: a hang costs ``timeout_s``. Without it (or if the hang-up did not wake the
    query) the block is cancelled, and psycopg then tries a cancel request and waits for
    the query to end, 5 s each at most (psycopg 3.3, ``AsyncConnection.wait``), before
    closing the connection: ``timeout_s`` + 10 s.
    """
    loop = asyncio.get_running_loop()
    hung_up = False

    def hang_up() -> None:
        nonlocal hung_up
        hung_up = True
        if conn is None or conn.closed:
            return
        with contextlib.suppress(OSError, psycopg.Error):
            # The descriptor stays libpq's: shut the connection down, do not close the fd.
            sock = socket.socket(fileno=conn.pgconn.socket)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()

    timer = loop.call_later(timeout_s, hang_up) if conn is not None else None
    silent = PostgresSilent(
        f"no answer to {what} within {timeout_s:g}s (ZAPSTREAM_DATABASE_QUERY_TIMEOUT_S): "
        "the connection is presumed hung"
    )
    try:
        async with asyncio.timeout(timeout_s + (_FALLBACK_S if conn is not None else 0.0)):
            yield
    except TimeoutError as exc:
        raise silent from exc
    except psycopg.Error as exc:
        if hung_up:
            raise silent from exc
        raise
    finally:
        if timer is not None:
            timer.cancel()


class ReopeningConnection:
    """One PostgreSQL connection that is opened when needed and dropped after a failure.

    For the timers that read PostgreSQL on their own (slot metrics, pipeline gauges,
    late-redelivery lookups): :meth:`get` returns the open connection or opens a new one
    (``connect`` builds it, with the caller's options); :meth:`drop` closes it quietly,
    since after a failure the connection is usually broken already. The next
    :meth:`get` reconnects, so an outage needs no other bookkeeping.
    """

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]) -> None:
        self._connect = connect
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def get(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect()
        return self._conn

    async def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                await conn.close()
            except (psycopg.Error, OSError) as exc:  # broken already: nothing to close
                log.debug("closing a broken PostgreSQL connection: %s", exc)
