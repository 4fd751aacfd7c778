"""The injected clock: the only place ring reads time.

Cores take ``now`` as an argument; drivers get it from a ``Clock``. Tests and
the simulation use ``ManualClock`` and move time by hand, so every run with the
same inputs gives the same outputs.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch (record timestamps, retention)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards (timeouts)."""


class SystemClock:
    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic: float = 0.0) -> None:
        self._wall_ms = wall_ms
        self._monotonic = monotonic

    def wall_ms(self) -> int:
        return self._wall_ms

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "time only moves forward"
        self._monotonic += seconds
        self._wall_ms += int(seconds * 1000)
