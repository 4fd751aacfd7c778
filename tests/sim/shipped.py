"""Shipped ring brokers in the simulated world: ``ring.cli.serve`` on the virtual loop and network.

Each broker is started the way ``ring serve`` starts it (``serve(config)``)
with its own configuration: a data directory under the run's root, its own
host (127.0.0.N) with the client and peer ports, every broker's peer address
as seeds, one cluster secret. It runs as its host's code on the
``VirtualLoop`` (``tests.sim.vloop``), so ``kill`` is a crash: its code stops
where it is and the network resets its connections. Its clock reads the
loop's virtual time and its random source is drawn from the loop's seeded one.

``Client`` talks to the brokers' client API with aiohttp from its own host,
its bytes on the simulated network (``tests.sim.vnet``) like the brokers'.

Three reads in ``ring/`` escape the injected clock and random source; the world
routes them while a virtual loop runs: ``ring.http_api.server`` reads
``time.time()`` for the Date header of the client API's answers,
``ring.log.datadir`` draws a data directory's incarnation id from
``secrets.token_hex``, and ``ring.ranges`` asks the machine's disk how much is
free (``shutil.disk_usage``, gossiped in each broker's load): the simulated
disk has ``DISK_FREE_BYTES`` free. ``serve``'s ``gc.freeze()`` is skipped: many
brokers start and stop in one test process.
"""

from __future__ import annotations

import asyncio
import gc
import random
import secrets
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from ring.config import BrokerConfig
from ring.log.fsync import FsyncPolicy
from tests.sim.vloop import VirtualClock, VirtualLoop, running
from tests.sim.vnet import Network, VirtualTimeModule

CLIENT_PORT = 9250
PEER_PORT = 9251
SECRET = "simulated-cluster-secret"
CLIENT_HOST = "10.0.0.100"


class _VirtualSecrets:
    """The ``secrets`` module, drawing from the virtual loop's random source while one runs."""

    def token_hex(self, nbytes: int | None = None) -> str:
        loop = running()
        if loop is None:
            return secrets.token_hex(nbytes)
        return loop.rng.randbytes(nbytes or 32).hex()

    def __getattr__(self, name: str) -> Any:
        return getattr(secrets, name)


DISK_FREE_BYTES = 100 << 30


class _VirtualShutil:
    """The ``shutil`` module, whose ``disk_usage`` reports the simulated disk while a virtual loop runs."""

    def disk_usage(self, path: Any) -> Any:
        if running() is None:
            return shutil.disk_usage(path)
        return shutil._ntuple_diskusage(2 * DISK_FREE_BYTES, DISK_FREE_BYTES, DISK_FREE_BYTES)  # type: ignore

    def __getattr__(self, name: str) -> Any:
        return getattr(shutil, name)


class _VirtualGc:
    """The ``gc`` module, whose ``freeze`` does nothing while a virtual loop runs: ``serve`` freezes what
    startup built for the process's life, and a test process runs many brokers that come and go."""

    def freeze(self) -> None:
        if running() is None:
            gc.freeze()

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def _route_escapes() -> None:
    import ring.cli
    import ring.http_api.server
    import ring.log.datadir
    import ring.ranges.copier
    import ring.ranges.manager

    ring.cli.gc = _VirtualGc()  # type: ignore[attr-defined]
    ring.http_api.server.time = VirtualTimeModule()  # type: ignore[attr-defined]
    ring.log.datadir.secrets = _VirtualSecrets()  # type: ignore[attr-defined]
    ring.ranges.manager.shutil = ring.ranges.copier.shutil = _VirtualShutil()  # type: ignore[attr-defined]


class ShippedCluster:
    """``size`` shipped brokers that seed each other, on ``loop`` and a network made here."""

    def __init__(self, loop: VirtualLoop, root: Path, size: int = 3, fsync: str = "always") -> None:
        _route_escapes()
        self.loop = loop
        self.net = Network(loop)
        self.hosts = [f"127.0.0.{i + 1}" for i in range(size)]
        seeds = tuple(f"{h}:{PEER_PORT}" for h in self.hosts)
        self.configs = [BrokerConfig(name=f"ring-{i}", data_dir=root / f"ring-{i}", host=h, port=CLIENT_PORT,
                                     peer_host=h, peer_port=PEER_PORT, seeds=seeds, cluster_secret=SECRET,
                                     host_label=h, fsync=FsyncPolicy.parse(fsync))
                        for i, h in enumerate(self.hosts)]
        self.names = [c.name for c in self.configs]
        self.serving: dict[str, asyncio.Task] = {}

    def start(self) -> None:
        from ring.cli import serve

        for config in self.configs:
            rng = random.Random(self.loop.rng.getrandbits(64))
            self.serving[config.name] = self.loop.spawn(config.host, serve(config, clock=VirtualClock(self.loop),
                                                                           rng=rng))

    def host_of(self, name: str) -> str:
        return self.hosts[self.names.index(name)]

    def kill(self, name: str) -> None:
        """The broker crashes: none of its code runs again, its connections are reset."""
        self.loop.kill(self.host_of(name))

    def alive(self) -> list[str]:
        return [n for n in self.names if self.host_of(n) not in self.loop.dead]

    def check_serving(self) -> None:
        """A broker's ``serve`` that ended (an error at startup) fails the run with its exit code."""
        for name, task in self.serving.items():
            if task.done():
                raise AssertionError(f"{name}'s serve ended: {task.result()!r}")


class Reply:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)


class Client:
    """The client API of the brokers, from host ``CLIENT_HOST`` over the simulated network."""

    def __init__(self, cluster: ShippedCluster) -> None:
        self.cluster = cluster
        self.session: aiohttp.ClientSession | None = None

    async def request(self, name: str, method: str, path: str, timeout_s: float = 10.0, **kwargs: Any) -> Reply:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
        url = f"http://{self.cluster.host_of(name)}:{CLIENT_PORT}{path}"
        async with self.session.request(method, url, **kwargs) as r:
            return Reply(r.status, await r.read())

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
