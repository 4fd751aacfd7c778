"""The segmented append-only log of one partition replica (see partition.py).

The names below load on first use (PEP 562), so a process that needs only
the record batch format (``ring.log.batch``: Spark's Python workers, the
client) does not import the whole log.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["FsyncPolicy", "LogConfig", "PartitionLog"]
_HOMES = {"FsyncPolicy": "ring.log.fsync", "LogConfig": "ring.log.config", "PartitionLog": "ring.log.partition"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(name)
