"""A progress line on stderr for long work, shown only when stderr is a terminal.

``Progress(label, total)`` redraws one line in place at most ten times a
second: a bar and a percentage when the total is known (records to read, or
bytes of a file on stdin), the count and the rate always. In a pipe, a log
file or a test it prints nothing at all, so stdout and stderr stay clean for
whoever reads them.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_REDRAW_S = 0.1
_BAR_WIDTH = 24


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    def __init__(self, label: str, total: int | None = None, *, by_bytes: bool = False,
                 stream: TextIO | None = None, enabled: bool | None = None) -> None:
        """``total`` counts records, or bytes when ``by_bytes`` (a file on stdin)."""
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.total = total
        self.by_bytes = by_bytes
        self.records = 0
        self.bytes = 0
        self.t0 = time.monotonic()
        self._drawn_at = 0.0
        self._width = 0

    def update(self, records: int = 0, nbytes: int = 0) -> None:
        self.records += records
        self.bytes += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn_at >= _REDRAW_S:
            self._drawn_at = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self.t0, 1e-6)
        parts = [self.label]
        if self.total:
            done = self.bytes if self.by_bytes else self.records
            frac = min(done / self.total, 1.0)
            filled = int(frac * _BAR_WIDTH)
            parts.append(f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {frac * 100:3.0f}%")
        parts.append(f"{self.records:,} records")
        if self.bytes:
            parts.append(_human_bytes(self.bytes))
        parts.append(f"{self.records / elapsed:,.0f}/s")
        text = "  ".join(parts)
        pad = max(self._width - len(text), 0)
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def finish(self) -> float:
        """Erase the line; the seconds since the start."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        return time.monotonic() - self.t0
