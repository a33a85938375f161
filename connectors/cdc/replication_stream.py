"""Streaming a pgoutput logical replication slot over asyncio, with psycopg's libpq wrapper.

psycopg's connection classes have no replication support, so this module drives
``psycopg.pq.PGconn`` (a thin libpq binding) directly in non-blocking mode: it
waits for socket readiness with ``loop.add_reader``/``add_writer`` and only ever
calls libpq functions that return at once. Decoding lives elsewhere and is
sans-IO: :mod:`connectors.cdc.replication_messages` parses the CopyData envelope
and :mod:`connectors.cdc.pgoutput` the payload.

Creating the slot and publication is not this module's job; the relay does it
over an ordinary connection before streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq.abc import PGconn, PGresult

from connectors.cdc.failures import TRANSIENT_SQLSTATE_CLASSES
from connectors.cdc.lsn import Lsn
from connectors.cdc.replication_messages import (
    PrimaryKeepalive,
    XLogData,
    parse_copy_data,
    standby_status_update,
)

logger = logging.getLogger(__name__)

# PostgreSQL's own rule for slot names (ReplicationSlotValidateName).
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
_SQLSTATE_OBJECT_IN_USE = "55006"
_SQLSTATE_UNDEFINED_OBJECT = "42704"
# object_not_in_prerequisite_state: PostgreSQL 18's pgoutput WARNING for a skipped publication.
_SQLSTATE_SKIPPED = "55000"
# Server errors ending a stream that a new stream may not hit: connection
# exceptions, transaction rollback, insufficient resources, operator
# intervention (e.g. pg_terminate_backend, shutdown), system errors.
_TRANSIENT_SQLSTATE_CLASSES = TRANSIENT_SQLSTATE_CLASSES
_COPY_STATUSES = frozenset((pq.ExecStatus.COPY_BOTH, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_IN))


class ReplicationError(Exception):
    """Base of the errors raised by :class:`ReplicationStream`.

    ``retriable`` says whether starting again (a new stream from the last
    confirmed LSN) can succeed; ``sqlstate`` is the server's code when it sent one.
    """

    retriable: bool = False

    def __init__(
        self, message: str, *, sqlstate: str | None = None, retriable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        if retriable is not None:
            self.retriable = retriable


class SlotInUse(ReplicationError):
    """Another consumer holds the slot (PostgreSQL allows one)."""

    retriable = True


class SlotNotFound(ReplicationError):
    """The replication slot does not exist; it must be created before streaming."""

    retriable = False


class ReplicationStreamClosed(ReplicationError):
    """The connection could not be made, dropped, went silent for longer than the
    stream's ``silence_timeout_s``, or the server ended the stream.

    Nothing after the last confirmed LSN is lost: a new stream redelivers it.
    Retriable, except when the server ended the stream with an error that will
    recur (e.g. 42704 for a missing publication, reported only once decoding
    reaches the first change).
    """

    retriable = True


@dataclass(frozen=True, slots=True)
class SystemIdentity:
    """The server's answer to IDENTIFY_SYSTEM."""

    system_id: str
    timeline: int
    xlogpos: Lsn
    """Current WAL flush position when the stream started."""
    dbname: str | None


class _Readiness:
    """Tasks waiting for one socket to become readable or writable.

    The event loop allows one reader and one writer callback per fd, but
    ``read()``, ``send_status()`` and ``close()`` may wait at the same time from
    different tasks; they share a registration instead of replacing each other's.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._loop = loop
        self._fd = fd
        self._readers: set[asyncio.Future[bool]] = set()
        self._writers: set[asyncio.Future[bool]] = set()
        self._detached = False

    async def wait(self, *, write: bool, timeout_s: float | None) -> bool:
        """Wait until the socket is ready (True), the timeout passes or we are woken (False)."""
        if self._detached:
            return False
        waiters = self._writers if write else self._readers
        future: asyncio.Future[bool] = self._loop.create_future()
        if not waiters:
            if write:
                self._loop.add_writer(self._fd, self._fire, self._writers)
            else:
                self._loop.add_reader(self._fd, self._fire, self._readers)
        waiters.add(future)
        # A timer on the future itself: asyncio.wait(timeout=) costs a waiter future,
        # a timeout handle and callbacks per call, once per batch of WAL read.
        timer = None if timeout_s is None else self._loop.call_later(timeout_s, _expire, future)
        try:
            return await future and not self._detached
        finally:
            if timer is not None:
                timer.cancel()
            waiters.discard(future)
            if not waiters and not self._detached:
                if write:
                    self._loop.remove_writer(self._fd)
                else:
                    self._loop.remove_reader(self._fd)

    def wake_readers(self) -> None:
        """Wake tasks waiting to read, e.g. because another task moved input into libpq."""
        self._fire(self._readers)

    def detach(self) -> None:
        """Drop the loop registrations and wake every waiter; called before the fd is closed."""
        if self._detached:
            return
        self._detached = True
        if self._readers:
            self._loop.remove_reader(self._fd)
        if self._writers:
            self._loop.remove_writer(self._fd)
        self._fire(self._readers)
        self._fire(self._writers)

    @staticmethod
    def _fire(waiters: set[asyncio.Future[bool]]) -> None:
        for future in waiters:
            if not future.done():
                future.set_result(True)


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


class ReplicationStream(contextlib.AbstractAsyncContextManager["ReplicationStream"]):
    """Reads a pgoutput logical replication slot and confirms progress to the server.

    Use::

        async with ReplicationStream(dsn, slot="zapstream", publication="zapstream") as stream:
            await stream.start(confirmed_lsn)
            while (message := await stream.read(timeout_s=1.0)) is not None: ...
            await stream.send_status(flush=commit.end_lsn)

    A connection, not a service (psycopg's ``AsyncConnection`` is the model): ``async with``
    only closes it, and ``__aenter__`` does not connect: :meth:`start` needs the LSN to
    resume from. Its owner, the relay's supervisor, is the service.
    A stream is single-use; after :meth:`close` make a new one. At most one task
    may call :meth:`read` at a time; :meth:`send_status` and :meth:`close` may be
    called from other tasks meanwhile.

    ``silence_timeout_s`` is the client side of the replication protocol's deadline
    (what ``wal_receiver_timeout`` is to a PostgreSQL subscriber): a server that sends
    nothing, no XLogData and no keepalive, for that long is presumed hung (a NAT or
    load balancer that dropped the connection, a frozen VM) and :meth:`read` raises
    :class:`ReplicationStreamClosed`, retriable, so the caller reconnects. The server
    sends keepalives only when *it* has not heard from us, and a relay reports its
    position every second, so an idle healthy stream is silent too: after a third of
    the timeout without a message :meth:`read` sends a status update asking for a
    reply (the same position again), which a live server answers at once. The stream is
    declared hung only once two thirds of the timeout passed since that first unanswered
    ping too, and after reading what the socket holds, so a caller that did not read for
    a while (busy elsewhere) is not taken for a silent server.
    ``IDENTIFY_SYSTEM`` and ``START_REPLICATION`` are bounded by the timeout as well.
    """

    _SHUTDOWN_TIMEOUT_S = 2.0
    """How long :meth:`close` waits for the server to end the copy before hanging up."""

    def __init__(
        self,
        dsn: str,
        *,
        slot: str,
        publication: str,
        messages: bool = False,
        connect_timeout_s: float = 30.0,
        silence_timeout_s: float | None = None,
    ) -> None:
        if not _SLOT_NAME.fullmatch(slot):
            raise ValueError(
                f"invalid replication slot name {slot!r}: use 1-63 of [a-z0-9_] (PostgreSQL's rule)"
            )
        if not publication or "\x00" in publication:
            raise ValueError(f"invalid publication name {publication!r}")
        self._dsn = dsn
        self._slot = slot
        self._publication = publication
        self._messages = messages
        self._connect_timeout_s = connect_timeout_s
        if silence_timeout_s is not None and silence_timeout_s <= 0:
            raise ValueError(f"silence_timeout_s must be > 0, not {silence_timeout_s}")
        self._silence_timeout_s = silence_timeout_s
        # When the server was last heard from (a message arrived), and last asked to answer.
        self._heard_at = 0.0
        self._pinged_at = 0.0
        # The first ping the server has not answered yet (None: it answered, or none was sent).
        self._asked_at: float | None = None
        self._pings = 0
        self._pgconn: PGconn | None = None
        self._io: _Readiness | None = None
        self._identity: SystemIdentity | None = None
        self._buffer: deque[XLogData | PrimaryKeepalive] = deque()
        # Set when the copy ended or the connection broke while messages were
        # still buffered: read() returns those first, then raises this.
        self._ended: ReplicationStreamClosed | None = None
        # Set by the notice handler when pgoutput says it skipped a missing publication
        # (PostgreSQL 18+): nothing read after that notice may be handed up.
        self._skipped_publication: ReplicationStreamClosed | None = None
        self._started = False
        self._in_copy = False
        self._closing = False
        self._reading = False
        self._last_flush = Lsn.ZERO
        self._write_lock = asyncio.Lock()

    @property
    def identity(self) -> SystemIdentity | None:
        """What IDENTIFY_SYSTEM reported during :meth:`start` (None before)."""
        return self._identity

    @property
    def slot(self) -> str:
        """The replication slot's name."""
        return self._slot

    @property
    def pings(self) -> int:
        """Status updates sent asking for a reply because the server had been silent."""
        return self._pings

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self, start_lsn: Lsn = Lsn.ZERO) -> None:
        """Connect, IDENTIFY_SYSTEM, and START_REPLICATION from ``start_lsn``.

        With ``Lsn.ZERO`` the server resumes at the slot's confirmed_flush_lsn;
        a later LSN skips transactions that committed before it.
        Raises :class:`SlotInUse`, :class:`SlotNotFound`, :class:`ReplicationStreamClosed`
        (cannot connect) or :class:`ReplicationError` (any other server error).
        """
        if self._started or self._closing:
            raise RuntimeError("ReplicationStream.start() may be called once per stream")
        self._started = True
        try:
            pgconn = await self._connect()
            pgconn.notice_handler = self._on_notice
            self._pgconn = pgconn
            self._io = _Readiness(asyncio.get_running_loop(), pgconn.socket)
            timeout_s = self._silence_timeout_s
            try:
                async with asyncio.timeout(timeout_s):
                    self._identity = await self._identify_system(pgconn)
                    await self._start_replication(pgconn, start_lsn)
            except TimeoutError:
                raise ReplicationStreamClosed(
                    f"PostgreSQL did not answer IDENTIFY_SYSTEM/START_REPLICATION within "
                    f"{timeout_s:g}s: the connection is presumed hung"
                ) from None
            self._heard_at = self._pinged_at = time.monotonic()
        except BaseException:
            # Includes CancelledError: never leave a half-open connection behind.
            await self.close()
            raise
        logger.info(
            "replication started: slot=%s publication=%s from=%s server_wal=%s",
            self._slot,
            self._publication,
            start_lsn,
            self._identity.xlogpos,
        )

    async def read(self, timeout_s: float) -> XLogData | PrimaryKeepalive | None:
        """Return the next message from the server, or None if none came within ``timeout_s``.

        Raises :class:`ReplicationStreamClosed` once the server ended the
        stream or the connection dropped (after returning what was already received).
        """
        if self._buffer:
            return self._buffer.popleft()
        if self._reading:
            raise RuntimeError("another task is already reading this ReplicationStream")
        pgconn, io = self._streaming()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._reading = True
        try:
            while True:
                # libpq may already hold complete messages (read along with an
                # earlier result, or by send_status): drain before waiting.
                self._drain(pgconn)
                if self._buffer:
                    return self._buffer.popleft()
                if self._ended is not None:
                    raise self._ended
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                if self._silence_timeout_s is not None:
                    remaining = min(remaining, await self._mind_silence(pgconn, io))
                await io.wait(write=False, timeout_s=remaining)
                pgconn, io = self._streaming()
                self._consume_input(pgconn)
        finally:
            self._reading = False

    def read_nowait(self) -> XLogData | PrimaryKeepalive | None:
        """The next message libpq already received, or None; never waits (``read(0)``, sync).

        Raises :class:`ReplicationStreamClosed` like :meth:`read` once the stream ended.
        """
        buffer = self._buffer
        if buffer:
            return buffer.popleft()
        if self._reading:
            raise RuntimeError("another task is already reading this ReplicationStream")
        pgconn, _ = self._streaming()
        self._drain(pgconn)
        if buffer:
            return buffer.popleft()
        if self._ended is not None:
            raise self._ended
        return None

    async def send_status(self, *, flush: Lsn, reply_requested: bool = False) -> None:
        """Confirm that everything up to ``flush`` is durable downstream (write=flush=apply).

        Pass a :class:`~connectors.cdc.pgoutput.Commit`'s ``end_lsn``. The server may
        then recycle the WAL before ``flush`` and, after a reconnect from
        ``Lsn.ZERO``, skips every transaction whose commit record lies before it.
        Confirming less than an earlier call is a bug and raises ValueError.
        """
        if flush < self._last_flush:
            raise ValueError(f"confirmed LSN going backwards: {flush} after {self._last_flush}")
        pgconn, io = self._streaming()
        message = standby_status_update(flush, flush, flush, datetime.now(UTC), reply_requested)
        async with self._write_lock:
            await self._put_copy_data(pgconn, io, message)
        self._last_flush = flush

    async def close(self) -> None:
        """End the copy politely if the connection still works, then hang up. Idempotent."""
        if self._closing:
            return
        self._closing = True
        pgconn, io = self._pgconn, self._io
        if io is not None:
            # A task blocked in read() must notice the close now, not at its timeout.
            io.wake_readers()
        try:
            if pgconn is not None and io is not None and self._in_copy:
                try:
                    async with asyncio.timeout(self._SHUTDOWN_TIMEOUT_S):
                        await self._end_copy(pgconn, io)
                except (TimeoutError, psycopg.OperationalError, ReplicationError) as exc:
                    # The connection is being dropped anyway and unconfirmed WAL
                    # is redelivered to the next stream: nothing to recover here.
                    logger.debug("replication stream did not end cleanly: %s", exc)
        finally:
            self._buffer.clear()
            self._pgconn = self._io = None
            if io is not None:
                io.detach()
            if pgconn is not None:
                pgconn.finish()

    # --- internals -----------------------------------------------------------

    def _streaming(self) -> tuple[PGconn, _Readiness]:
        if self._closing:
            raise ReplicationStreamClosed("replication stream was closed")
        if self._pgconn is None or self._io is None:
            raise RuntimeError("ReplicationStream.start() has not completed")
        return self._pgconn, self._io

    async def _mind_silence(self, pgconn: PGconn, io: _Readiness) -> float:
        """Ping a server silent for a third of the timeout; raise once it stayed silent for all
        of it and for two thirds of it since the first unanswered ping (a caller that did not
        read for a while is not taken for a silent server). Returns how long the caller may
        wait before this must be checked again."""
        timeout_s = self._silence_timeout_s
        assert timeout_s is not None
        answer_s = timeout_s * 2 / 3
        now = time.monotonic()
        asked_at = self._asked_at
        if (
            asked_at is not None
            and now - asked_at >= answer_s
            and now - self._heard_at >= timeout_s
        ):
            # What the socket holds counts as heard, even if nobody read it meanwhile.
            self._consume_input(pgconn)
            self._drain(pgconn)
            if self._buffer or self._ended is not None:
                return 0.0
            self._hung(now - self._heard_at)
        ping_every_s = timeout_s / 3
        if now - max(self._heard_at, self._pinged_at) >= ping_every_s:
            self._pinged_at = now
            if asked_at is None:
                self._asked_at = asked_at = now
            self._pings += 1
            flush = self._last_flush
            message = standby_status_update(flush, flush, flush, datetime.now(UTC), True)
            try:
                # A hung peer may not even take our bytes: never wait past the deadline.
                async with asyncio.timeout(
                    max(asked_at + answer_s, self._heard_at + timeout_s) - now
                ):
                    async with self._write_lock:
                        await self._put_copy_data(pgconn, io, message)
            except TimeoutError:
                self._hung(time.monotonic() - self._heard_at)
        next_check = max(self._heard_at, self._pinged_at) + ping_every_s
        if self._asked_at is not None:
            next_check = min(next_check, max(self._asked_at + answer_s, self._heard_at + timeout_s))
        return max(0.0, next_check - time.monotonic())

    def _hung(self, silent_s: float) -> None:
        error = ReplicationStreamClosed(
            f"PostgreSQL sent nothing for {silent_s:.1f}s, not even a keepalive when asked "
            f"(ZAPSTREAM_RELAY_REPLICATION_TIMEOUT_S={self._silence_timeout_s:g}): the "
            "connection is presumed hung"
        )
        self._in_copy = False
        self._ended = error
        raise error

    def _drain(self, pgconn: PGconn) -> None:
        """Move every complete CopyData message libpq has buffered into ``self._buffer``."""
        if not self._in_copy:
            return
        buffer = self._buffer
        get_copy_data = pgconn.get_copy_data
        before = len(buffer)
        try:
            while True:
                try:
                    nbytes, data = get_copy_data(1)
                except psycopg.OperationalError as exc:
                    self._in_copy = False
                    if self._ended is None:  # keep the first, most specific reason
                        self._ended = ReplicationStreamClosed(
                            f"replication connection failed: {exc}"
                        )
                    return
                if self._skipped_publication is not None:
                    # libpq ran the notice handler while it looked for this message: what
                    # follows the skipped change must not be acknowledged past it.
                    self._in_copy = False
                    self._ended = self._skipped_publication
                    return
                if nbytes > 0:
                    buffer.append(parse_copy_data(data))
                elif nbytes == 0:
                    return
                else:
                    # -1: the server sent CopyDone (or an error ended the copy); the
                    # reason follows as a result.
                    self._in_copy = False
                    self._ended = self._copy_end_error(pgconn)
                    return
        finally:
            if len(buffer) != before:
                self._heard_at = time.monotonic()
                self._asked_at = None

    def _on_notice(self, result: PGresult) -> None:
        """Turn PostgreSQL 18's "skipped loading publication" WARNING into the error 15 raises.

        Up to 17, pgoutput ends the stream with ERROR 42704 (undefined object) when
        ``publication_names`` names a publication that does not exist at the WAL position
        being decoded. From 18 on it sends a WARNING instead (SQLSTATE 55000, ``skipped
        loading publication "<name>"``) and carries on without that publication's tables:
        the stream goes quiet while outbox rows are committed, and confirming the
        keepalives' positions would step over rows that were never sent. So the stream
        ends here as it does on 15, permanently and with 42704, before anything received
        after the notice is handed up. The notice is recognised by its SQLSTATE and the
        quoted publication name, which survive a translated server (``lc_messages``).
        """
        if self._skipped_publication is not None or _sqlstate(result) != _SQLSTATE_SKIPPED:
            return
        primary = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
        message = primary.decode(errors="replace") if primary else ""
        if f'"{self._publication}"' not in message:
            return
        self._skipped_publication = ReplicationStreamClosed(
            f"the server ended the replication stream: {message}: publication "
            f'"{self._publication}" does not exist at this point in the WAL '
            "(PostgreSQL 18 skips a missing publication where 15 fails)",
            sqlstate=_SQLSTATE_UNDEFINED_OBJECT,
            retriable=False,
        )

    def _copy_end_error(self, pgconn: PGconn) -> ReplicationStreamClosed:
        # The final result may not have arrived yet; only fetch it if it is
        # already buffered, since PQgetResult would block otherwise.
        reason = "the server ended the replication stream"
        sqlstate = None
        with contextlib.suppress(psycopg.OperationalError):
            pgconn.consume_input()  # the ErrorResponse saying why often follows in this read
        if not pgconn.is_busy():
            result = pgconn.get_result()
            if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
                reason = f"{reason}: {result.get_error_message().strip()}"
                sqlstate = _sqlstate(result)
        retriable = sqlstate is None or sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES
        return ReplicationStreamClosed(reason, sqlstate=sqlstate, retriable=retriable)

    def _consume_input(self, pgconn: PGconn) -> None:
        try:
            pgconn.consume_input()
        except psycopg.OperationalError as exc:
            if self._ended is None:
                self._ended = ReplicationStreamClosed(f"replication connection failed: {exc}")

    async def _connect(self) -> PGconn:
        # client_encoding: pgoutput converts text to it, and the decoder reads UTF-8.
        conninfo = make_conninfo(self._dsn, replication="database", client_encoding="UTF8")
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                conninfo = await _resolve_hosts(conninfo)
                pgconn = pq.PGconn.connect_start(conninfo.encode())
                try:
                    await _poll_connect(pgconn)
                except BaseException:
                    pgconn.finish()
                    raise
        except TimeoutError:
            raise ReplicationStreamClosed(
                f"could not connect within {self._connect_timeout_s}s"
            ) from None
        except OSError as exc:  # name resolution failed
            raise ReplicationStreamClosed(f"could not connect: {exc}") from exc
        pgconn.nonblocking = 1
        return pgconn

    async def _identify_system(self, pgconn: PGconn) -> SystemIdentity:
        result = (await self._command(pgconn, b"IDENTIFY_SYSTEM"))[-1]
        if result.status != pq.ExecStatus.TUPLES_OK or result.ntuples != 1:
            raise ReplicationError(f"IDENTIFY_SYSTEM failed: {result.get_error_message()}")

        def text(column: int) -> str | None:
            value = result.get_value(0, column)
            return None if value is None else value.decode()

        return SystemIdentity(
            system_id=text(0) or "",
            timeline=int(text(1) or 0),
            xlogpos=Lsn.parse(text(2) or "0/0"),
            dbname=text(3),
        )

    async def _start_replication(self, pgconn: PGconn, start_lsn: Lsn) -> None:
        # publication_names is a string literal holding a comma-separated list
        # of identifiers: quote the identifier, then the literal.
        publication = '"' + self._publication.replace('"', '""') + '"'
        # Protocol version 1 on every server from 15 to 18; why no streaming, two_phase,
        # binary or origin: see connectors.cdc.relay's docstring.
        options = [("proto_version", "1"), ("publication_names", publication)]
        if self._messages:
            options.append(("messages", "true"))
        rendered = ", ".join(
            f"\"{name}\" '{value.replace(chr(39), chr(39) * 2)}'" for name, value in options
        )
        command = f'START_REPLICATION SLOT "{self._slot}" LOGICAL {start_lsn} ({rendered})'
        result = (await self._command(pgconn, command.encode()))[-1]
        if result.status == pq.ExecStatus.COPY_BOTH:
            self._in_copy = True
            return
        sqlstate = _sqlstate(result)
        message = result.get_error_message().strip()
        if sqlstate == _SQLSTATE_OBJECT_IN_USE:
            raise SlotInUse(message, sqlstate=sqlstate)
        if sqlstate == _SQLSTATE_UNDEFINED_OBJECT:
            raise SlotNotFound(message, sqlstate=sqlstate)
        raise ReplicationError(f"START_REPLICATION failed: {message}", sqlstate=sqlstate)

    async def _command(self, pgconn: PGconn, command: bytes) -> list[PGresult]:
        """Run one replication command; return its results (the last one matters)."""
        io = self._io
        assert io is not None
        try:
            pgconn.send_query(command)
            while pgconn.flush() == 1:
                await io.wait(write=True, timeout_s=None)
            results: list[PGresult] = []
            while True:
                pgconn.consume_input()
                while not pgconn.is_busy():
                    result = pgconn.get_result()
                    # In copy mode PQgetResult returns the COPY result forever,
                    # never NULL: stop at it.
                    if result is None or result.status in _COPY_STATUSES:
                        if result is not None:
                            results.append(result)
                        if not results:
                            raise ReplicationError(f"no result for {command!r}")
                        return results
                    results.append(result)
                await io.wait(write=False, timeout_s=None)
        except psycopg.OperationalError as exc:
            raise ReplicationStreamClosed(f"replication connection failed: {exc}") from exc

    async def _put_copy_data(self, pgconn: PGconn, io: _Readiness, data: bytes) -> None:
        try:
            # 0 means libpq's output buffer is full in non-blocking mode: wait, retry.
            while pgconn.put_copy_data(data) == 0:
                await io.wait(write=True, timeout_s=None)
                self._streaming()
            while pgconn.flush() == 1:
                await io.wait(write=True, timeout_s=None)
                self._streaming()
                # As libpq advises for a pending flush: read input too, so a
                # server that is itself blocked sending to us can move on.
                self._consume_input(pgconn)
                io.wake_readers()
        except psycopg.OperationalError as exc:
            raise ReplicationStreamClosed(f"replication connection failed: {exc}") from exc

    async def _end_copy(self, pgconn: PGconn, io: _Readiness) -> None:
        """Send CopyDone, discard what the server still sends, and read the final results."""
        self._in_copy = False
        async with self._write_lock:
            while pgconn.put_copy_end() == 0:
                await io.wait(write=True, timeout_s=None)
            while pgconn.flush() == 1:
                await io.wait(write=True, timeout_s=None)
        while True:
            # Unconfirmed messages in flight are dropped: the next stream gets them again.
            nbytes, _ = pgconn.get_copy_data(1)
            if nbytes == -1:
                break
            if nbytes == 0:
                await io.wait(write=False, timeout_s=None)
                pgconn.consume_input()
        while True:
            pgconn.consume_input()
            while not pgconn.is_busy():
                if pgconn.get_result() is None:
                    return
            await io.wait(write=False, timeout_s=None)


def _sqlstate(result: PGresult) -> str | None:
    value = result.error_field(pq.DiagnosticField.SQLSTATE)
    return None if value is None else value.decode()


async def _resolve_hosts(conninfo: str) -> str:
    """Resolve a single host name without blocking the loop (libpq would resolve synchronously).

    Sets ``hostaddr`` to every address found, keeping ``host`` for TLS checks
    and the password file. Unix sockets, literal addresses, an explicit
    hostaddr and multi-host lists are left to libpq.
    """
    params = conninfo_to_dict(conninfo)
    host = str(params.get("host") or "")
    if not host or params.get("hostaddr") or "," in host or host.startswith("/"):
        return conninfo
    try:
        ipaddress.ip_address(host)
        return conninfo
    except ValueError:
        pass
    port = str(params.get("port") or "5432")
    if "," in port:
        return conninfo
    infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    params["host"] = ",".join([host] * len(addresses))
    params["hostaddr"] = ",".join(addresses)
    return make_conninfo("", **params)


async def _poll_connect(pgconn: PGconn) -> None:
    """Drive PQconnectPoll, waiting on the socket between steps (it may change between hosts)."""
    loop = asyncio.get_running_loop()
    while True:
        if pgconn.status == pq.ConnStatus.BAD:
            raise ReplicationStreamClosed(
                f"could not connect: {pgconn.get_error_message().strip()}"
            )
        status = pgconn.connect_poll()
        if status == pq.PollingStatus.OK:
            return
        if status == pq.PollingStatus.FAILED:
            raise ReplicationStreamClosed(
                f"could not connect: {pgconn.get_error_message().strip()}"
            )
        await _Readiness(loop, pgconn.socket).wait(
            write=status == pq.PollingStatus.WRITING, timeout_s=None
        )
