"""Bounds on what a signed callback may hold: nesting depth and the length of its ids.

A signature proves who sent a body, not that it is sane. A body nested deeper than
:data:`MAX_DEPTH` (orjson encodes at most 254 levels, so such a body once failed every
time it was dead-lettered: 500 for ever) and ids longer than their caps are refused with
400 and the reason, before anything is looked up or published.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32
"""Deepest nesting of arrays and objects accepted: a Meta notification uses about 11."""
MAX_EVENT_ID_CHARS = 128
MAX_LABEL_CHARS = 64
MAX_REFERENCE_CHARS = 128
"""Our references are under 60 characters (:mod:`streams.kernel.attempt_reference`)."""
MAX_GATEWAY_ID_CHARS = 256
"""A gateway's job or message id (Meta's ``wamid`` is about 60 characters)."""
MAX_SCALAR_CHARS = 128
"""Strings copied into a dead-letter record are cut to this."""


class CallbackTooDeep(ValueError):
    """Nested deeper than :data:`MAX_DEPTH`."""


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`CallbackTooDeep` when ``value`` nests arrays/objects beyond ``limit``.

    Iterative (no recursion to exhaust), and it stops at the first level past the limit.
    """
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            raise CallbackTooDeep(f"body nested deeper than {limit} levels")
        pending.extend((child, depth + 1) for child in children)


def too_long(name: str, value: str | None, limit: int) -> str | None:
    """The refusal when ``value`` is longer than ``limit`` characters, else None."""
    if value is not None and len(value) > limit:
        return f"'{name}' longer than {limit} characters"
    return None


def scalar(value: Any) -> str | int | float | bool | None:
    """``value`` if it is a JSON scalar (strings cut to :data:`MAX_SCALAR_CHARS`), else None:
    what a dead-letter record may copy from a body."""
    if isinstance(value, str):
        return value[:MAX_SCALAR_CHARS]
    if value is None or isinstance(value, bool | int | float):
        return value
    return None
