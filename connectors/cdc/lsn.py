"""PostgreSQL write-ahead log positions (LSNs) as a value type.

An LSN is an unsigned 64-bit byte offset into the WAL. PostgreSQL prints it as
two upper-case hexadecimal halves, ``"16/B374D848"`` (high 32 bits, slash, low
32 bits). Passing LSNs around as bare ints or strings invites mixing the two
spellings and comparing strings lexically ("9/0" > "10/0"), so the relay uses
:class:`Lsn` everywhere and converts only at the edges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, overload

_MAX = 2**64 - 1
# pg_lsn_in accepts 1-8 hex digits on each side; anything else (signs, "0x",
# spaces) is rejected here as it is by the server.
_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


@dataclass(frozen=True, slots=True, order=True)
class Lsn:
    """A position in the PostgreSQL WAL: an int in ``[0, 2**64 - 1]``, ordered and hashable."""

    value: int

    ZERO: ClassVar[Lsn]
    """``0/0``: "from wherever the slot's confirmed position is" in START_REPLICATION."""

    def __post_init__(self) -> None:
        # bool is an int subclass; Lsn(True) is always a mistake.
        if not isinstance(self.value, int) or isinstance(self.value, bool):
            raise TypeError(f"Lsn value must be an int, got {type(self.value).__name__}")
        if not 0 <= self.value <= _MAX:
            raise ValueError(f"LSN out of range [0, 2**64-1]: {self.value}")

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse PostgreSQL's ``"X/Y"`` spelling (as printed by ``pg_current_wal_lsn()``)."""
        match = _TEXT.fullmatch(text)
        if match is None:
            raise ValueError(f"malformed LSN {text!r}: expected 'X/Y' with 1-8 hex digits each")
        high, low = match.groups()
        return cls((int(high, 16) << 32) | int(low, 16))

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"

    def __int__(self) -> int:
        return self.value

    def __add__(self, other: int) -> Lsn:
        """Advance by a number of bytes."""
        if isinstance(other, Lsn) or not isinstance(other, int):
            # Adding two positions is meaningless.
            return NotImplemented
        return Lsn(self.value + other)

    @overload
    def __sub__(self, other: Lsn) -> int: ...

    @overload
    def __sub__(self, other: int) -> Lsn: ...

    def __sub__(self, other: Lsn | int) -> Lsn | int:
        """``lsn - lsn`` is a distance in bytes (int); ``lsn - int`` is an earlier Lsn."""
        if isinstance(other, Lsn):
            return self.value - other.value
        if isinstance(other, int):
            return Lsn(self.value - other)
        return NotImplemented


Lsn.ZERO = Lsn(0)

ZERO_LSN = Lsn.ZERO
"""Module-level alias of :attr:`Lsn.ZERO`."""
