"""A broker's data directory: its lock, its topic catalogue file, its clean-shutdown marker and the
trash deleted topics wait in.

Layout: ``<data_dir>/lock`` (held with ``flock`` while a broker runs, so two
brokers never share a directory), ``format`` (the directory's format version,
``FORMAT``: a broker opens every format from ``FORMAT_OLDEST`` on and
refuses a newer one, ``UnsupportedFormat``, rather than misread it; a
directory without the file is the previous release's, ``FORMAT_OLDEST``, and
is marked with this release's once opened), ``incarnation`` (a random id made when the
directory is first used, so an empty or replaced directory is known to be a
new replica, not the one that voted and acknowledged before: see
``ring.replication.steps``), ``catalog.json``, ``clean-shutdown`` (left
by a clean close, removed at open), ``topics/<topic>/<p>/`` (one
``PartitionLog`` each) and ``trash/`` (a deleted topic's files, moved there
at once and removed in the background; emptied at open).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
from pathlib import Path

from ring.catalog import Catalog
from ring.errors import StorageError, UnsupportedFormat
from ring.log.fsync import fsync_dir, mkdir_durable, write_atomically

CATALOG_FILE = "catalog.json"
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
FORMAT_FILE = "format"
# Data directory format versions: 1 the previous release's (no format file, no incarnation file); 2 adds
# ``incarnation`` and the voters' incarnations in each replica's saved state. A release opens its own and
# the previous release's, and raises FORMAT only with a change an older release would misread.
FORMAT = 2
FORMAT_OLDEST = 1
INCARNATION_FILE = "incarnation"
INCARNATION_BYTES = 8  # random bytes of an incarnation id: two directories never share one by chance
LOCK_FILE = "lock"
TOPICS_DIR = "topics"
TRASH_DIR = "trash"  # deleted topics wait here for rmtree; outside the topic namespace


class DataDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None
        self.incarnation = ""  # this directory's id (set by ``open``)
        self.fresh = False  # ``open`` found nothing here: no catalogue, no incarnation (a new or wiped disk)

    def open(self) -> tuple[Catalog | None, bool]:
        """Lock the directory and empty its trash; the saved catalogue (None: none yet) and whether the
        last run ended cleanly (a directory without a catalogue counts as clean)."""
        mkdir_durable(self.path / TOPICS_DIR)
        self._lock_fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StorageError(f"data directory {self.path} is in use by another broker") from None
        try:
            check_format(self.path)  # before anything here is changed
        except StorageError:
            self.close(clean=False)
            raise
        shutil.rmtree(self.path / TRASH_DIR, ignore_errors=True)
        marker = self.path / CLEAN_SHUTDOWN_FILE
        catalog_path = self.path / CATALOG_FILE
        catalog, clean = None, True
        if catalog_path.exists():
            catalog = Catalog.loads(catalog_path.read_bytes())
            clean = marker.exists()
        self.incarnation = self._incarnation(fresh=catalog is None)
        if marker.exists():
            marker.unlink()
            fsync_dir(self.path)
        return catalog, clean

    def _incarnation(self, fresh: bool) -> str:
        made, self.fresh = incarnation(self.path, fresh)
        return made

    def close(self, clean: bool) -> None:
        """Leave the clean-shutdown marker if ``clean``, and unlock."""
        if clean:
            write_atomically(self.path / CLEAN_SHUTDOWN_FILE, b"")
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def partition(self, topic: str, p: int) -> Path:
        return self.path / TOPICS_DIR / topic / str(p)

    def save_catalog(self, catalog: Catalog) -> None:
        write_atomically(self.path / CATALOG_FILE, catalog.dumps())

    def trash_topic(self, name: str, stamp_ms: int) -> Path:
        """Move a topic's files into the trash at once (one rename); where they went, for ``rmtree``."""
        trash = self.path / TRASH_DIR
        mkdir_durable(trash)
        doomed = trash / f"{name}.{stamp_ms}"
        if (self.path / TOPICS_DIR / name).exists():
            os.replace(self.path / TOPICS_DIR / name, doomed)
            fsync_dir(self.path / TOPICS_DIR)
        return doomed


def check_format(path: Path) -> int:
    """The format version of the data directory ``path`` (no file: the previous release's), which it is then
    marked with this release's; UnsupportedFormat for a newer one, or a file that names none."""
    try:
        text = (path / FORMAT_FILE).read_text().strip()
    except FileNotFoundError:
        text = str(FORMAT_OLDEST)
    found = int(text) if text.isdigit() and len(text) <= 9 else None
    if found is None or found > FORMAT:
        named = f"format {found}" if found is not None else f"an unreadable format file ({text[:20]!r})"
        raise UnsupportedFormat(f"data directory {path} is in {named}, newer than this release reads (formats "
                                f"{FORMAT_OLDEST} to {FORMAT}): it was written by a newer ring release; run that "
                                "release on it (see docs/OPERATIONS.md, Upgrading)")
    if found < FORMAT_OLDEST:
        raise UnsupportedFormat(f"data directory {path} is in format {found}, older than this release reads "
                                f"(formats {FORMAT_OLDEST} to {FORMAT})")
    if found != FORMAT:
        write_atomically(path / FORMAT_FILE, f"{FORMAT}\n".encode())
    return found


def incarnation(path: Path, empty: bool) -> tuple[str, bool]:
    """The incarnation id of the data directory ``path``, made (and synced) the first time, and whether the
    directory is fresh: it had no id and held nothing else (``empty``; a directory an older release
    wrote, with data and no id, gets one and is not fresh)."""
    file = path / INCARNATION_FILE
    try:
        found = file.read_text().strip()
    except FileNotFoundError:
        found = ""
    if found:
        return found, False
    made = secrets.token_hex(INCARNATION_BYTES)
    write_atomically(file, made.encode())
    return made, empty


def partition_lost(fresh: bool, topic_created_ms: int, opened_ms: int, clock_offset_ms_max: float) -> bool:
    """Whether a partition's replica opened in a data directory lost what this broker held of it: the
    directory is fresh (made at this start, ``opened_ms``) and the topic is older than it, by more than
    the offset brokers' clocks may have (so a topic created just after this start, on a broker whose
    clock is behind, is not taken for an old one)."""
    return fresh and topic_created_ms < opened_ms - clock_offset_ms_max
