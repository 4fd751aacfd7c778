"""Where to read from, as a shell user writes it, and the units of topic settings.

``parse_position`` reads ``--from`` (``ring consume``) and ``--to`` (``ring
groups reset``): ``earliest``, ``latest``, an offset ``N``, ``-N`` (N records
before the end of each partition), ``@MS`` (the first record at or after a
time in milliseconds since the epoch, as kcat's ``s@``), or an ISO 8601 time
(``2024-05-01``, ``2024-05-01T10:00:00+02:00``; UTC when no zone is given).
``parse_duration_ms`` and ``parse_bytes`` read retention and segment sizes
with units (``7d``, ``12h``, ``512MiB``); ``-1`` and ``forever`` mean no limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from ring.commands.base import UsageError

_DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_BYTE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
               "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}
_NO_LIMIT = ("-1", "forever", "none", "unlimited")


@dataclass(frozen=True)
class Position:
    kind: str  # earliest | latest | offset | back | timestamp
    value: int = 0

    def __str__(self) -> str:
        return {"earliest": "earliest", "latest": "latest", "offset": f"offset {self.value}",
                "back": f"{self.value} before the end", "timestamp": f"time {self.value} ms"}[self.kind]


def parse_position(text: str, flag: str = "--from") -> Position:
    raw = text.strip()
    low = raw.lower()
    if low in ("earliest", "beginning", "start"):
        return Position("earliest")
    if low in ("latest", "end"):
        return Position("latest")
    if re.fullmatch(r"\d+", raw):
        return Position("offset", int(raw))
    if re.fullmatch(r"-\d+", raw):
        return Position("back", -int(raw))
    if re.fullmatch(r"@\d+", raw):
        return Position("timestamp", int(raw[1:]))
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(f"{flag} must be earliest, latest, an offset N, -N, @MS or an ISO 8601 time, "
                         f"not {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise UsageError(f"{flag}: {text!r} is before 1970")
    return Position("timestamp", ms)


def parse_duration_ms(text: str, flag: str) -> int:
    raw = text.strip().lower()
    if raw in _NO_LIMIT:
        return -1
    m = re.fullmatch(r"(\d+)\s*(ms|s|m|h|d|w)?", raw)
    if not m:
        raise UsageError(f"{flag} must be a duration such as 86400000, 90s, 12h or 7d (or forever), not {text!r}")
    return int(m.group(1)) * _DURATION_UNITS_MS[m.group(2) or "ms"]


def parse_bytes(text: str, flag: str, no_limit: bool = True) -> int:
    raw = text.strip().lower()
    if no_limit and raw in _NO_LIMIT:
        return -1
    m = re.fullmatch(r"(\d+)\s*([a-z]*)", raw)
    if not m or m.group(2) not in _BYTE_UNITS:
        raise UsageError(f"{flag} must be a size such as 1048576, 64MiB or 1GB, not {text!r}")
    return int(m.group(1)) * _BYTE_UNITS[m.group(2)]


def format_duration_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 0:
        return "forever"
    for unit in ("w", "d", "h", "m", "s"):
        size = _DURATION_UNITS_MS[unit]
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 0:
        return "unlimited"
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = _BYTE_UNITS[unit.lower()]
        if n >= size:
            return f"{n // size}{unit}" if n % size == 0 else f"{n / size:.1f}{unit}"
    return f"{n}B"
