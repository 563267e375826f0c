"""``async with`` for the testing tools that start and close: ``__aenter__`` is
``start()``, ``__aexit__`` is ``close()``."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["StartsAndCloses"]

_Self = TypeVar("_Self", bound="StartsAndCloses")


class StartsAndCloses:
    """A base for tools with ``async def start(self) -> Self`` and ``async def close()``."""

    async def start(self: _Self) -> _Self:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: _Self) -> _Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
