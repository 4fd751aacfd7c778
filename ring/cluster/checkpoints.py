"""The high-watermark checkpoint: every replicated partition's high watermark, saved in the data
directory now and then, so a restarted follower does not show consumers less than it had shown.

A file of msgpack ``{topic: {partition: hw}}``, replaced atomically; an unreadable one reads as empty
(the high watermarks then start from 0 and come back with the leader's next frame).
"""

from __future__ import annotations

import logging
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

    def load(self) -> dict[Key, int]:
        try:
            doc = msgpack.unpackb(self.path.read_bytes(), raw=False)
            self.saved = {(t, int(p)): int(hw) for t, parts in doc.items() for p, hw in parts.items()}
        except (OSError, ValueError, TypeError, AttributeError, msgpack.UnpackException):
            self.saved = {}
        return self.saved

    def save(self, hws: dict[Key, int]) -> None:
        """Write ``hws`` unless the file holds them already; a failure is logged (the next save retries)."""
        if hws == self.saved:
            return
        doc: dict[str, dict[str, int]] = {}
        for (t, p), hw in hws.items():
            doc.setdefault(t, {})[str(p)] = hw
        try:
            write_atomically(self.path, msgpack.packb(doc))
            self.saved = hws
        except OSError as exc:
            log.error("saving high watermarks: %s", exc)
