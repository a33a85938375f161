"""``with thing:`` for the development stack's start/stop objects."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class StartStop:
    """``__enter__`` starts, ``__exit__`` stops; subclasses define ``start`` and ``stop``."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
