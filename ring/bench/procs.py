"""What processes cost, read from /proc: CPU seconds and RSS per process
(and its descendants), the machine's busy CPU seconds, and a sampler that
keeps the peak RSS of the brokers while a run goes on.

Linux only, standard library only (the bench must run from a plain install).
A process that disappears between two reads simply stops counting.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
SAMPLE_INTERVAL_S = 0.25


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return raw[raw.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 when it is gone)."""
    f = _stat_fields(pid)
    if f is None:
        return 0.0
    return (int(f[11]) + int(f[12])) / TICKS_PER_S  # utime, stime


def rss_bytes(pid: int) -> int:
    f = _stat_fields(pid)
    return 0 if f is None else int(f[21]) * PAGE_BYTES


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        f = _stat_fields(int(entry.name))
        if f is not None:
            out.setdefault(int(f[1]), []).append(int(entry.name))
    return out


def with_descendants(pids: list[int]) -> list[int]:
    """The processes and everything they started (a shell script's server, an
    Erlang VM's port programs)."""
    kids = children_map()
    out: list[int] = []
    stack = list(pids)
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out.append(pid)
        stack.extend(kids.get(pid, []))
    return out


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    vals = [int(x) for x in fields[:8]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = vals
    return (user + nice + system + irq + softirq + steal) / TICKS_PER_S


def cpu_of(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


class PeakRss(threading.Thread):
    """Samples the RSS of each group of processes every SAMPLE_INTERVAL_S and
    keeps each one's peak, until ``stop()``."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        super().__init__(daemon=True)
        self.groups = groups
        self.peak: dict[str, int] = {name: 0 for name in groups}
        self._done = threading.Event()

    def sample(self) -> None:
        for name, pids in self.groups.items():
            self.peak[name] = max(self.peak[name], sum(rss_bytes(p) for p in pids))

    def run(self) -> None:
        while not self._done.is_set():
            self.sample()
            self._done.wait(SAMPLE_INTERVAL_S)

    def stop(self) -> dict[str, int]:
        self._done.set()
        self.join(5)
        self.sample()
        return self.peak
