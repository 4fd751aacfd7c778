"""The high-watermark checkpoint: every replicated partition's high watermark, saved in the data
directory now and then, so a restarted follower does not show consumers less than it had shown.

A file of msgpack ``{topic: {partition: hw}}``, replaced atomically; an unreadable one reads as empty
(the high watermarks then start from 0 and come back with the leader's next frame). The broker's periodic
save runs in an executor thread, off the event loop (a file's fsync and its directory's, each taking
milliseconds on a busy disk, would hold every request meanwhile), and the last save at its close on the
loop: saves are taken one at a time, and one older than the file's is dropped.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import msgpack

from ring.log.fsync import write_atomically

log = logging.getLogger("ring.cluster")

HW_FILE = "high-watermarks"  # in the data directory

Key = tuple[str, int]


class HighWatermarks:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / HW_FILE
        self.saved: dict[Key, int] = {}  # what the file holds
        self._lock = threading.Lock()  # one writer at a time: the executor thread's save, or the close's
        self._taken = 0  # snapshots handed out (``snapshot``)
        self._written = 0  # the snapshot the file holds

    def load(self) -> dict[Key, int]:
        try:
            doc = msgpack.unpackb(self.path.read_bytes(), raw=False)
            self.saved = {(t, int(p)): int(hw) for t, parts in doc.items() for p, hw in parts.items()}
        except (OSError, ValueError, TypeError, AttributeError, msgpack.UnpackException):
            self.saved = {}
        return self.saved

    def snapshot(self, hws: dict[Key, int]) -> tuple[int, dict[Key, int]]:
        """``hws`` numbered in the order taken, for ``save`` (on the loop: numbers follow the loop's order)."""
        self._taken += 1
        return self._taken, hws

    def save(self, snapshot: tuple[int, dict[Key, int]]) -> None:
        """Write a ``snapshot``'s high watermarks unless the file holds them already or holds a later
        snapshot's; a failure is logged (the next save retries). Safe from any thread."""
        number, hws = snapshot
        with self._lock:
            if number < self._written or hws == self.saved:
                return
            doc: dict[str, dict[str, int]] = {}
            for (t, p), hw in hws.items():
                doc.setdefault(t, {})[str(p)] = hw
            try:
                write_atomically(self.path, msgpack.packb(doc))
                self.saved, self._written = hws, number
            except OSError as exc:
                log.error("saving high watermarks: %s", exc)
