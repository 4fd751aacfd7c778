"""Durability for the log: the fsync policy and the few primitives that make files survive a crash.

``FsyncPolicy`` says when a partition forces its appends to disk: ``always``
(the broker syncs before it acknowledges, grouping the appends of one event-loop
turn into one fsync), ``interval:<ms>`` (at most that much time of acknowledged
writes at risk on power loss) or ``never`` (the page cache decides; replication
is the durability). The helpers below write small state files atomically
(temporary file, fsync, rename, fsync of the directory), so a checkpoint on disk
is always either the old or the new one, never a torn mix.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from ring import limits

FSYNC_MODES = ("always", "interval", "never")
TMP_SUFFIX = ".tmp"
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait
try:
    _sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int
except (OSError, AttributeError):  # not Linux: there is no such call
    _sync_file_range = None


@dataclass(frozen=True)
class FsyncPolicy:
    mode: str
    interval_ms: int = limits.FSYNC_INTERVAL_MS_DEFAULT

    def __post_init__(self) -> None:
        if self.mode not in FSYNC_MODES:
            raise ValueError(f"fsync mode must be one of {', '.join(FSYNC_MODES)}, not {self.mode!r}")
        if self.mode == "interval" and self.interval_ms <= 0:
            raise ValueError(f"fsync interval must be a positive number of ms, not {self.interval_ms}")
        if self.mode != "interval":
            object.__setattr__(self, "interval_ms", 0)  # so equal policies compare equal

    @classmethod
    def parse(cls, text: str) -> "FsyncPolicy":
        """``always``, ``never``, ``interval`` (the default interval) or ``interval:<ms>``."""
        mode, sep, arg = text.strip().lower().partition(":")
        if mode in ("always", "never") and not sep:
            return cls(mode, 0)
        if mode == "interval":
            if not sep:
                return cls("interval", limits.FSYNC_INTERVAL_MS_DEFAULT)
            if arg.isdigit():
                return cls("interval", int(arg))
        raise ValueError(f"fsync policy must be always, never, interval or interval:<ms>, not {text!r}")

    def __str__(self) -> str:
        return f"interval:{self.interval_ms}" if self.mode == "interval" else self.mode


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and deletions of entries in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_durable(directory: Path) -> None:
    """Create ``directory`` and those of its parents missing, each made durable in its parent (the parent
    synced once the entry is in it): a directory created and not synced in its parent may be gone after a
    power loss, with every file synced inside it."""
    missing = []
    d = directory
    while not d.is_dir():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            pass
        fsync_dir(d.parent)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until every byte is written (a regular file may take fewer at once)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def start_writeback(fd: int) -> bool:
    """Have the kernel start writing ``fd``'s dirty pages to disk, without waiting for them
    (Linux's ``sync_file_range`` with ``SYNC_FILE_RANGE_WRITE``); False where the call is
    missing or failed. Nothing becomes durable by this: only an fsync says so. What it buys is
    that a later fsync finds little left to write, so appends beside it are not held up."""
    if _sync_file_range is None:
        return False
    return _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) == 0
