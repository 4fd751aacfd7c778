"""Measuring one broker process for the hostile parts of ``ring bench``: a fresh broker of its own on
loopback, and its resident set from ``/proc`` (the peak, ``VmHWM``, reset before what is measured)."""

from __future__ import annotations

from pathlib import Path

from ring.localcluster import LocalBroker, free_port


def vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak(pid: int) -> None:
    """Make VmHWM start again from the current RSS (Linux 4.0 on; our own child process)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def start_broker(root: Path, fsync: str) -> LocalBroker:
    broker = LocalBroker("ring-0", root / "ring-0", free_port(), args=["--fsync", fsync, "--log-level", "warning"],
                         log_path=root / "ring-0.log")
    return broker.start()
