"""Values the console writes into its log lines, with control characters escaped.

A request's decoded path, a client address or an operator's name may hold CR/LF (``%0A``
in a URL), ESC/OSC sequences or Unicode line separators: written raw they would forge
log lines or drive the terminal of whoever tails the log. Each such character becomes a
visible escape (``\\x0a``, ``\\u2028``), and a long value is cut.
"""

from __future__ import annotations

import re

__all__ = ["loggable"]

_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\\]")
"""C0 and C1 controls, DEL, the Unicode line and paragraph separators, lone surrogates
(undecodable bytes), and the backslash itself, so an escape in the input stays visible."""


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def loggable(value: object, limit: int = 300) -> str:
    """``value`` as one log-safe line of at most ``limit`` characters (cut with ``...``)."""
    text = _UNSAFE.sub(_escape, str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."
