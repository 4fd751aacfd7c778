"""Sampling profile of a broker during a run (``ring bench --profile``):
py-spy records the process for a few seconds in collapsed-stack form, and the
top frames by own time and by inclusive time are summarised for the report.

py-spy is optional: without it the profile is skipped with a line saying so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

OUTER_SHARE = 0.9
_ENTRIES = ("Runner.run ", "BaseEventLoop.run_forever ", "BaseEventLoop.run_until_complete ", "Thread.run ")
RATE_HZ = 100  # samples/s: enough for a 10 s profile, light on a 2-core machine


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def start(pid: int, out: Path, seconds: float) -> subprocess.Popen | None:
    exe = py_spy()
    if exe is None:
        return None
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", str(RATE_HZ),
         "--format", "raw", "--nonblocking", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _short(frame: str) -> str:
    # "fn (path/to/module.py:123)" -> "fn (module.py:123)"
    name, sep, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if sep else frame


def top_frames(collapsed: str, n: int = 12) -> dict[str, list[tuple[str, float]]]:
    """Top frames by own samples and by inclusive samples, as shares of all samples."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = [_short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += k
        own[frames[-1]] += k
        # Frames from the thread's root to its event loop (or thread) entry are under every sample
        # of that thread and say nothing; count what runs inside it.
        start = next((i + 1 for i, f in enumerate(frames) if f.startswith(_ENTRIES)), 1)
        for f in set(frames[start:]):
            incl[f] += k
    if total == 0:
        return {"own": [], "inclusive": [], "samples": 0}  # type: ignore[dict-item]
    return {
        "own": [(f, c / total) for f, c in own.most_common(n)],
        # frames under nearly every sample (the event loop, main) say nothing
        "inclusive": [(f, c / total) for f, c in incl.most_common() if c / total < OUTER_SHARE][:n],
        "samples": total,  # type: ignore[dict-item]
    }
