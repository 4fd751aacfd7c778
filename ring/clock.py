"""The injected clock: the only place ring reads time or waits for it to pass.

Cores take ``now`` as an argument; drivers get it from a ``Clock``, and sleep and
bound their waits through it too (``sleep``, ``wait_for``). Tests and the
simulation use ``ManualClock`` and move time by hand: its sleeps end, and its
bounded waits time out, only when ``advance`` passes their deadline, so every run
with the same inputs gives the same outputs.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Awaitable, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch (record timestamps, retention)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards (timeouts)."""

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed (at once, after one turn of the loop, for 0 or less)."""

    async def wait_for(self, aw: Awaitable[T], seconds: float | None) -> T:
        """``aw``'s result, or ``TimeoutError`` (``asyncio.TimeoutError``) with ``aw`` cancelled once
        ``seconds`` have passed first, as ``asyncio.wait_for``; ``None``: no bound."""


class SystemClock:
    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, aw: Awaitable[T], seconds: float | None) -> T:
        return await asyncio.wait_for(aw, seconds)


class ManualClock:
    """A clock that moves only when told to (``advance``)."""

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic: float = 0.0) -> None:
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        self._order = itertools.count()  # sleepers with one deadline wake in the order they slept
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []  # a heap by deadline

    def wall_ms(self) -> int:
        return self._wall_ms

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``; wake every sleep and bounded wait whose deadline that passes."""
        assert seconds >= 0, "time only moves forward"
        self._monotonic += seconds
        self._wall_ms += int(seconds * 1000)
        while self._sleepers and self._sleepers[0][0] <= self._monotonic:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def next_deadline(self) -> float | None:
        """The earliest monotonic time a sleep or bounded wait ends at, if any waits."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)  # cancelled: nobody waits on it any more
        return self._sleepers[0][0] if self._sleepers else None

    def _alarm(self, seconds: float) -> asyncio.Future[None]:
        """A future resolved once time has moved ``seconds`` on (already, for 0 or less)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if seconds <= 0:
            fut.set_result(None)
        else:
            heapq.heappush(self._sleepers, (self._monotonic + seconds, next(self._order), fut))
        return fut

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        alarm = self._alarm(seconds)
        try:
            await alarm
        finally:
            alarm.cancel()  # (cancelled while asleep: the deadline no longer counts)

    async def wait_for(self, aw: Awaitable[T], seconds: float | None) -> T:
        if seconds is None:
            return await aw
        task = asyncio.ensure_future(aw)
        alarm = self._alarm(seconds)
        try:
            await asyncio.wait({task, alarm}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            alarm.cancel()
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            return task.result()  # it finished as it was cancelled: its result stands
        raise TimeoutError(f"not done within {seconds} s")
