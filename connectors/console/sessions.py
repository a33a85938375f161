"""The console's login sessions: a random id in the browser, the operator on the server.

Logging in with a token opens a session (:meth:`SessionStore.open`): the browser's
cookie holds a random id (``secrets.token_urlsafe(32)``, 256 bits), never the token. The
store keeps, under the id's SHA-256 (a lookup's timing says nothing about the ids held),
the operator and role the token stood for, when the session opened and when it was last
used. A session is over when it was idle for ``idle_s`` or opened ``max_s`` ago,
whichever comes first, or when the operator logs out (:meth:`SessionStore.close`).

Sessions live in the console process's memory: the console is one process, and it has
no table of its own to write. A restart therefore logs every operator out, which is also
how a token removed from ``ZAPSTREAM_CONSOLE_TOKENS`` loses its sessions: a session never
outlives the settings it was opened under. The clock is injected (monotonic seconds), so
expiry is tested without waiting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import time
from collections.abc import Callable

from connectors.console.settings import Operator

__all__ = ["MAX_SESSIONS", "Clock", "SessionStore"]

Clock = Callable[[], float]
"""Monotonic seconds (``time.monotonic``; a fake in tests)."""

MAX_SESSIONS = 10_000
"""Open sessions kept at most: past it, expired ones go first, then the least recently used."""


@dataclasses.dataclass(slots=True)
class _Session:
    operator: Operator
    opened: float
    used: float


class SessionStore:
    """Open sessions by id; each ends ``idle_s`` after its last use or ``max_s`` after login."""

    def __init__(
        self,
        *,
        idle_s: float,
        max_s: float,
        clock: Clock = time.monotonic,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self._idle_s = idle_s
        self._max_s = max_s
        self._clock = clock
        self._max_sessions = max_sessions
        self._sessions: dict[bytes, _Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, operator: Operator) -> str:
        """A new session for ``operator``: its id, for the cookie."""
        now = self._clock()
        if len(self._sessions) >= self._max_sessions:
            self._prune(now)
        while len(self._sessions) >= self._max_sessions:
            oldest = min(self._sessions, key=lambda k: self._sessions[k].used)
            del self._sessions[oldest]
        session_id = secrets.token_urlsafe(32)
        self._sessions[_digest(session_id)] = _Session(operator, opened=now, used=now)
        return session_id

    def find(self, session_id: str | None) -> Operator | None:
        """The operator of a live session, which counts as a use; None when there is none
        (unknown, logged out, idle too long, or past its absolute lifetime)."""
        key = _key(session_id)
        if key is None:
            return None
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self._clock()
        if self._expired(session, now):
            del self._sessions[key]
            return None
        session.used = now
        return session.operator

    def close(self, session_id: str | None) -> bool:
        """End a session (logout); whether there was one."""
        key = _key(session_id)
        return key is not None and self._sessions.pop(key, None) is not None

    def _expired(self, session: _Session, now: float) -> bool:
        return now - session.used >= self._idle_s or now - session.opened >= self._max_s

    def _prune(self, now: float) -> None:
        for key in [k for k, s in self._sessions.items() if self._expired(s, now)]:
            del self._sessions[key]


def _key(session_id: str | None) -> bytes | None:
    """The store's key for an id; None for what cannot be one (empty, not ASCII: a cookie
    aiohttp decoded with surrogates)."""
    if not session_id or not session_id.isascii():
        return None
    return _digest(session_id)


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()
