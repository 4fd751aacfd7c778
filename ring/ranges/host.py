"""What the ranges of a broker use of the broker: ``RangesHost``, the one thing ``Ranges`` is given.

``ring.cluster.node.ClusterBroker`` is the host that runs; the ranges never
import it, so they read, test and change without the rest of the node. Each
name here is used by ``manager``, ``copier``, ``audit`` or ``remote``;
nothing else of the broker is reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import aiohttp

from ring.catalog import Catalog
from ring.clock import Clock
from ring.config import BrokerConfig
from ring.hashing import Ring
from ring.replication.commit import GroupCommit
from ring.replication.replica import Replica


class MembershipView(Protocol):
    """The membership view the ranges ask: who is placed, alive, and where."""

    @property
    def joined(self) -> bool: ...

    @property
    def ring(self) -> Ring: ...

    def alive(self, name: str) -> bool: ...

    def client_url(self, name: str) -> str | None: ...

    def peer_url(self, name: str) -> str | None: ...

    def brokers(self) -> list[dict[str, Any]]: ...


class PeerRequests(Protocol):
    async def request(self, method: str, peer: str, path: str, *, params: dict[str, str] | None = None,
                      body: bytes | None = None, timeout_s: float = ...) -> bytes: ...


class RangesHost(Protocol):
    name: str
    config: BrokerConfig  # disk_free_min_bytes, range_interval_s, repair_interval_s
    clock: Clock
    clock_refusal: str | None  # why the wall clock may not be used now (None: it may)
    data_dir: Path
    catalog: Catalog
    commits: GroupCommit  # idle(part): no fsync of the partition runs
    membership: MembershipView | None  # None until the broker opens
    peers: PeerRequests | None
    session: aiohttp.ClientSession | None  # peer-port session, for streaming a range's bytes

    @property
    def closing(self) -> bool: ...

    def replica(self, topic: str, partition: int) -> Replica | None: ...

    def replicas(self) -> list[Replica]: ...

    def leader_of(self, topic: str, partition: int) -> str | None: ...

    def gossip_load(self, load: dict[str, Any]) -> None:
        """What the ranges add to this broker's load in gossip."""

    def damaged(self, rep: Replica, offset: int) -> None:
        """A stored batch of ``rep`` failed its check: never serve it, repair it."""

    def start_moved(self, part: Replica) -> None:
        """The leader moved ``part``'s log start offset: replication tells the followers."""
