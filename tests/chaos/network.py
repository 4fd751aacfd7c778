"""Where the brokers of a chaos run live and how the harness cuts the links between them.

Three interchangeable networks, each giving every broker an address, ports,
the flags that make it listen and advertise there, and a command prefix:

* ``Loopback``: all brokers on 127.0.0.1, no partitions (for the kill, pause,
  torn-tail and bit-flip scenarios, which need none).
* ``NetnsNetwork``: one namespace per broker (``netns.py``); partitions are
  iptables rules. The harness must run in the hub namespace.
* ``ProxyNetwork``: brokers on 127.0.0.{1,2,3}, advertising 127.0.0.{11,12,13}
  where a ``proxy.Proxy`` per broker forwards to them; partitions are proxy
  faults. Needs neither root nor iptables.

``block(src, dst)`` means src can no longer reach dst (connections src opens
to dst go dark, existing and new; dst's connections to src still work);
``partition`` and ``isolate`` are made of it; ``heal`` lifts every rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ring.localcluster import free_port
from tests.chaos import netns, proxy


@dataclass
class Place:
    host: str  # where the broker listens (client and peer port)
    client_port: int
    peer_port: int
    advertise: str | None = None  # what it tells others, when not ``host``
    prefix: list[str] = field(default_factory=list)  # command prefix (a namespace)

    @property
    def reach_host(self) -> str:
        """Where other brokers reach it."""
        return self.advertise or self.host


class Network:
    name = "?"
    partitions = False  # whether block() works

    def __init__(self, size: int) -> None:
        self.size = size
        self.places: list[Place] = []
        self.blocked: set[tuple[int, int]] = set()

    async def start(self, pids: Callable[[], dict[int, int]]) -> None:
        """Before the brokers start; ``pids()`` gives {pid: broker index} of those running."""
        return None

    async def close(self) -> None:
        return None

    def block(self, src: int, dst: int) -> None:
        raise NotImplementedError(f"the {self.name} network cannot partition brokers")

    def heal(self) -> None:
        self.blocked.clear()

    def partition(self, a: int, b: int) -> None:
        self.block(a, b)
        self.block(b, a)

    def isolate(self, i: int) -> None:
        for j in range(self.size):
            if j != i:
                self.partition(i, j)


class Loopback(Network):
    name = "loopback"

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.places = [Place("127.0.0.1", free_port(), free_port()) for _ in range(size)]


class NetnsNetwork(Network):
    name = "netns"
    partitions = True
    CLIENT_PORT, PEER_PORT = 9250, 9251  # every broker has its own address, so the same ports

    def __init__(self, namespaces: netns.Namespaces) -> None:
        super().__init__(len(namespaces.brokers))
        self.ns = namespaces
        self.places = [Place(namespaces.address(i), self.CLIENT_PORT, self.PEER_PORT, prefix=namespaces.prefix(i))
                       for i in range(self.size)]

    def block(self, src: int, dst: int) -> None:
        if (src, dst) not in self.blocked:
            self.ns.block(src, dst)
            self.blocked.add((src, dst))

    def heal(self) -> None:
        self.ns.heal()
        super().heal()


class ProxyNetwork(Network):
    name = "proxy"
    partitions = True

    def __init__(self, size: int, fault: str = proxy.BLACKHOLE) -> None:
        super().__init__(size)
        self.fault = fault
        self.proxies: list[proxy.Proxy] = []
        for i in range(size):
            host = f"127.0.0.{i + 1}"
            self.places.append(Place(host, free_port(host), free_port(host), advertise=f"127.0.0.{i + 11}"))

    async def start(self, pids: Callable[[], dict[int, int]]) -> None:
        for i, place in enumerate(self.places):
            p = proxy.Proxy(i, place.reach_host, place.host, [place.client_port, place.peer_port], pids)
            await p.start()
            self.proxies.append(p)

    async def close(self) -> None:
        for p in self.proxies:
            await p.close()
        self.proxies.clear()

    def block(self, src: int, dst: int) -> None:
        assert src != dst
        self.proxies[dst].set_fault(src, self.fault)
        self.blocked.add((src, dst))

    def heal(self) -> None:
        for p in self.proxies:
            for src in list(p.faults):
                p.set_fault(src, None)
        super().heal()
