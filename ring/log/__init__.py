"""The segmented append-only log of one partition replica (see partition.py)."""

from ring.log.config import LogConfig
from ring.log.fsync import FsyncPolicy
from ring.log.partition import PartitionLog

__all__ = ["FsyncPolicy", "LogConfig", "PartitionLog"]
