"""What repair uses of its broker: ``RepairHost``, the one thing ``Repair`` is given.

``ring.cluster.node.ClusterBroker`` is the host that runs; ``ring.repair``
never imports it (nor anything of ``ring.cluster``), so repair reads, tests
and changes without the rest of the node. Each name here is used by
``driver``; nothing else of the broker is reached.
"""

from __future__ import annotations

from typing import Protocol

from ring.clock import Clock
from ring.replication.replica import Replica


class PeerCalls(Protocol):
    async def call(self, peer: str, path: str, body: bytes = ..., params: dict[str, str] | None = None,
                   method: str = ..., timeout_s: float = ...) -> bytes | None:
        """A control request to broker ``peer``'s peer port: the answer's body, or None (no answer)."""


class RepairHost(Protocol):
    name: str
    clock: Clock
    peers: PeerCalls | None  # None until the broker starts

    @property
    def closing(self) -> bool: ...

    def replicas(self) -> list[Replica]: ...

    async def wait_idle(self, part: Replica) -> None:
        """Return once no fsync runs on ``part``'s log (it may be cut)."""

    def damaged(self, rep: Replica, offset: int) -> None:
        """A stored batch of ``rep`` failed its check: the node core marks it, and calls ``Repair.fix``."""

    def repaired(self, rep: Replica) -> None:
        """``rep`` holds no damaged batch any more: it may be served and lead again."""
