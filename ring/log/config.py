"""Settings of one partition log, checked once when the log opens.

Defaults and bounds come from ``ring.limits``; a broker builds one ``LogConfig``
per topic (topics may override retention, segment size and fsync policy).
"""

from __future__ import annotations

from dataclasses import dataclass

from ring import limits
from ring.log.batch import CODECS
from ring.log.fsync import FsyncPolicy


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = limits.SEGMENT_BYTES_DEFAULT
    retention_ms: int = limits.RETENTION_MS_DEFAULT  # -1: keep forever
    retention_bytes: int = limits.RETENTION_BYTES_DEFAULT  # -1: no size limit
    index_interval_bytes: int = limits.INDEX_INTERVAL_BYTES
    fsync: FsyncPolicy = FsyncPolicy("interval", limits.FSYNC_INTERVAL_MS_DEFAULT)
    # Codec the producer side (broker) compresses new batches with; stored
    # batches carry their own codec, so changing it never rewrites the log.
    codec: str = "none"

    def __post_init__(self) -> None:
        if not limits.SEGMENT_BYTES_MIN <= self.segment_bytes <= limits.SEGMENT_BYTES_MAX:
            raise ValueError(
                f"segment_bytes must be in [{limits.SEGMENT_BYTES_MIN}, {limits.SEGMENT_BYTES_MAX}],"
                f" not {self.segment_bytes}"
            )
        if self.retention_ms < -1 or self.retention_ms == 0:
            raise ValueError(f"retention_ms must be positive or -1 (forever), not {self.retention_ms}")
        if self.retention_bytes < -1:
            raise ValueError(f"retention_bytes must be >= 0 or -1 (no limit), not {self.retention_bytes}")
        if not 0 <= self.index_interval_bytes <= self.segment_bytes:
            raise ValueError(
                f"index_interval_bytes must be in [0, segment_bytes], not {self.index_interval_bytes}"
            )
        if not isinstance(self.fsync, FsyncPolicy):
            raise ValueError(f"fsync must be an FsyncPolicy, not {self.fsync!r}")
        if self.codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}, not {self.codec!r}")

    @property
    def codec_id(self) -> int:
        """The codec number ``batch.encode(codec=...)`` takes."""
        return CODECS[self.codec]
