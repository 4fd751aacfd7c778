"""Small state files of a partition log: offset checkpoints, a log key and the leader-epoch history.

Each is a short text file replaced atomically (``fsync.write_atomically``), so
after a crash it holds either the old or the new content. A file that is
missing or does not parse reads as None and the log falls back to what its
segments say (the slow but safe answer).

The leader-epoch history lists ``(epoch, first offset written in that epoch)``
with both columns strictly increasing. Repair compares two replicas' histories
to find where they diverge (``end_offset_for``, Kafka's OffsetsForLeaderEpoch),
and recovery and reads check every batch's epoch against it: the epoch and the
base offset are the two header fields the batch CRC does not cover.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from ring.log.fsync import write_atomically

_EPOCHS_MAGIC = "ring-leader-epochs 1"


def read_offset(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


def write_offset(path: Path, offset: int) -> None:
    assert offset >= 0
    write_atomically(path, f"{offset}\n".encode())


def read_key(path: Path) -> tuple[int, int] | None:
    """A saved log key ``(last epoch, end offset)``; None if missing or damaged."""
    try:
        parts = path.read_text(encoding="ascii").split()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 and all(p.isdigit() for p in parts) else None


def write_key(path: Path, key: tuple[int, int]) -> None:
    assert key[0] >= 0 and key[1] >= 0
    write_atomically(path, f"{key[0]} {key[1]}\n".encode())


class LeaderEpochCache:
    """The leader-epoch history of one replica, in memory and on disk."""

    def __init__(self, path: Path, entries: list[tuple[int, int]]) -> None:
        self.path = path
        self._epochs = [e for e, _ in entries]
        self._starts = [s for _, s in entries]

    @classmethod
    def load(cls, path: Path) -> "LeaderEpochCache | None":
        """The stored history; None if the file is missing or damaged."""
        try:
            lines = path.read_text(encoding="ascii").splitlines()
            if lines[0] != _EPOCHS_MAGIC or int(lines[1]) != len(lines) - 2:
                return None
            entries = [tuple(int(x) for x in line.split()) for line in lines[2:]]
        except (FileNotFoundError, UnicodeDecodeError, ValueError, IndexError):
            return None
        if any(len(e) != 2 or e[0] < 0 or e[1] < 0 for e in entries):
            return None
        if any(a[0] >= b[0] or a[1] >= b[1] for a, b in zip(entries, entries[1:])):
            return None
        return cls(path, entries)  # type: ignore[arg-type]

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts))

    def persist(self) -> None:
        lines = [_EPOCHS_MAGIC, str(len(self._epochs))]
        lines += [f"{e} {s}" for e, s in zip(self._epochs, self._starts)]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())

    @property
    def latest_epoch(self) -> int:
        """Epoch of the newest entry, -1 when the history is empty."""
        return self._epochs[-1] if self._epochs else -1

    def epoch_at(self, offset: int) -> int | None:
        """Epoch of the batch holding ``offset``; None below the first entry (nothing known)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._epochs[i] if i >= 0 else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` begins at ``start_offset`` if it is new; returns whether it was.

        Entries at or past ``start_offset`` can only describe offsets that are no
        longer in the log (the caller appends at its end), so they give way.
        """
        assert epoch >= self.latest_epoch, "callers refuse epochs older than the latest"
        if epoch == self.latest_epoch:
            return False
        cut = bisect.bisect_left(self._starts, start_offset)
        del self._epochs[cut:], self._starts[cut:]
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self.persist()
        return True

    def truncate_from_end(self, end_offset: int, keep_latest: bool = False) -> None:
        """Forget epochs that begin at or after ``end_offset`` (the log was cut there).

        With ``keep_latest`` (recovery after a crash) the newest epoch survives,
        moved to ``end_offset``: the replica did take part in it, and its
        latest epoch must not go backwards just because unsynced data was lost.
        """
        cut = bisect.bisect_left(self._starts, end_offset)
        if cut == len(self._starts) or (keep_latest and self._starts[cut:] == [end_offset]):
            return
        latest = self._epochs[-1]
        del self._epochs[cut:], self._starts[cut:]
        if keep_latest:
            self._epochs.append(latest)
            self._starts.append(end_offset)
        self.persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: the epoch holding it now starts there."""
        i = bisect.bisect_right(self._starts, start_offset) - 1
        if i < 0 or (i == 0 and self._starts[0] == start_offset):
            return
        del self._epochs[:i], self._starts[:i]
        self._starts[0] = start_offset
        self.persist()

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, the offset where it ended); (-1, -1) if none is known.

        The end of the latest epoch is the log end offset. A follower truncates
        its log to this offset when it diverged from a leader.
        """
        i = bisect.bisect_right(self._epochs, epoch) - 1
        if i < 0:
            return -1, -1
        end = self._starts[i + 1] if i + 1 < len(self._starts) else log_end_offset
        return self._epochs[i], end

    def epoch_end(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's answer to "where did ``epoch`` end" (``LeaderEpochFileCache.endOffsetFor``, KIP-101/320):
        (the largest known epoch <= ``epoch``, the start of the first epoch after it); for the latest
        epoch the log end; for one older than every known epoch (``epoch``, the first epoch's start);
        (-1, -1) for one newer than the latest or for -1.

        ``end_offset_for`` differs where repair wants it to: it answers the latest epoch for a newer
        one, and nothing for an older one.
        """
        if epoch < 0 or not self._epochs or epoch > self._epochs[-1]:
            return -1, -1
        if epoch == self._epochs[-1]:
            return epoch, log_end_offset
        i = bisect.bisect_right(self._epochs, epoch) - 1
        if i < 0:
            return epoch, self._starts[0]
        return self._epochs[i], self._starts[i + 1]
