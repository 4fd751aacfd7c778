"""The settings of one broker (``ring serve``'s flags): names, addresses, storage, peers and intervals.

Kept apart from the broker so the command line builds them without loading
it. Defaults and bounds come from ``ring.limits``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from ring import limits
from ring.log.fsync import FsyncPolicy
from ring.tls import PLAINTEXT, TlsConfig


@dataclass(frozen=True)
class BrokerConfig:
    name: str = "ring-0"
    data_dir: Path = Path("./var/ring-0")
    host: str = "127.0.0.1"
    port: int = 9250
    fsync: FsyncPolicy = field(default_factory=lambda: FsyncPolicy.parse("interval:1000"))
    auto_create: bool = True
    # cluster settings (ring.cluster.node); a broker without seeds is a cluster of one
    peer_host: str = "127.0.0.1"
    peer_port: int | None = None  # None: the client port + 1
    seeds: tuple[str, ...] = ()
    cluster_secret: str | None = None
    token: int | None = None  # None: from the name's ordinal suffix
    advertise: str | None = None  # host other brokers and clients use; None: the listen host
    # Failure domains for placement (gossiped): no two replicas of a partition on one host while there are
    # enough hosts, and distinct zones while there are enough zones. None: the machine's hostname; no zone.
    host_label: str | None = None
    zone: str | None = None
    # ``ring serve --members``: the host's one client port, which every member also accepts on (SO_REUSEPORT).
    shared_port: int | None = None
    tls: TlsConfig = PLAINTEXT  # --tls-cert, --tls-key, --peer-ca (ring.tls)
    down_grace_s: float = limits.DOWN_GRACE_S_DEFAULT  # a broker down this long is taken off the ring
    repair_interval_s: float = limits.REPAIR_INTERVAL_S_DEFAULT  # anti-entropy rounds
    auto_partitions_grace_s: float = limits.AUTO_PARTITIONS_GRACE_MS / 1000  # before an auto topic grows
    retention_interval_s: float = limits.RETENTION_CHECK_INTERVAL_MS / 1000  # leaders apply retention this often
    max_clock_offset_ms: float = limits.CLOCK_OFFSET_MS_MAX_DEFAULT  # beyond it the wall clock is not used
    range_interval_s: float = limits.RANGE_INTERVAL_S_DEFAULT  # leaders cut, copy and trim ranges this often
    disk_free_min_bytes: int = limits.DISK_FREE_BYTES_MIN_DEFAULT  # below it this broker takes no new range

    @property
    def failure_host(self) -> str:
        """The host this broker runs on, for placement: ``--host``, or the machine's hostname."""
        return self.host_label or socket.gethostname()
