"""An in-memory network on the virtual loop: real bytes between simulated hosts, with seeded delays.

``Network(loop)`` makes the ``VirtualLoop``'s ``create_server`` and
``create_connection`` (and aiohttp's client, whose ``TCPConnector`` connects
through ``aiohappyeyeballs`` then ``loop.create_connection(sock=...)``) use
this network: a connection to (host, port) of a simulated server pairs two
``Transport``s. What one side writes reaches the other's ``data_received``
after a delay drawn from the loop's seeded random source, in order per
direction, as one TCP stream would. Each side's callbacks run as its own
host's code (``tests.sim.vloop.HOST``), so a killed host's protocols get
nothing more.

Faults: ``cut(a, b)`` resets every connection between two hosts and refuses
new ones until ``heal(a, b)``; a host killed on the loop (``loop.kill``) has
every connection reset and its servers gone.

``digest()`` hashes every delivery (virtual time, from, to, the bytes) in
order: two runs of one seed are the same run exactly when their digests
agree. ``log``, when set to a list, keeps each delivery (and each dropped one).

What aiohttp itself reads or draws goes, while a virtual loop runs, to the
loop: the Date header's ``time.time()``, a websocket handshake's key
(``os.urandom``), a client frame's mask and the connector's shuffle of its
waiters (``random``).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import functools
import hashlib
import os
import random
import socket
import time as _time
from typing import Any, Callable

from tests.sim.vloop import HOST, VirtualLoop, running

Addr = tuple[str, int]


class SimSocket:
    """Stands for a socket where asyncio wants one: holds addresses, does no I/O."""

    def __init__(self, local: Addr | None = None, remote: Addr | None = None) -> None:
        self.local = local
        self.remote = remote
        self.family = socket.AF_INET
        self.type = socket.SOCK_STREAM

    def getsockname(self) -> Addr | None:
        return self.local

    def getpeername(self) -> Addr | None:
        return self.remote

    def setsockopt(self, *args: Any) -> None:
        pass

    def setblocking(self, flag: bool) -> None:
        pass

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        pass


class SimTransport(asyncio.Transport):
    """One end of a simulated TCP connection."""

    def __init__(self, net: "Network", host: str, local: Addr, remote: Addr) -> None:
        super().__init__()
        self.net = net
        self.host = host  # whose code runs this end's protocol
        self.local = local
        self.remote = remote
        self.peer: SimTransport | None = None
        self.protocol: asyncio.BaseProtocol | None = None
        self._closing = False
        self._lost = False
        self._reading = True
        self._held: list[bytes | None] = []  # arrived while reading was paused (None: the EOF)
        self.arrive_at = 0.0  # when the last byte written towards the peer arrives there
        self.in_flight: collections.deque[bytes | None] = collections.deque()  # written, not yet arrived
        self.blocked: list[bytes | None] = []  # written while the way to the peer is cut one-way
        self.trace_label = f" {local} {remote} ".encode()  # how the digest names this direction

    # --- asyncio.Transport ---------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.remote, "sockname": self.local, "socket": None}.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        if self._held:  # what arrived meanwhile goes first: later bytes queue behind it (``_arrive``)
            self.net.loop.call_in(self.host, 0, self._drain)

    def _drain(self) -> None:
        while self._held and self._reading and not self._lost:
            self._take(self._held.pop(0))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self.net.send(self, bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if not self._closing:
            self.net.send(self, None)

    def close(self) -> None:
        """Sends what was written, then the EOF; this end's protocol learns at once that it is closed."""
        if self._closing:
            return
        self._closing = True
        self.net.send(self, None)
        self.net.loop.call_in(self.host, 0, self._lose, None)

    def abort(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.net.reset(self)
        self.net.loop.call_in(self.host, 0, self._lose, None)

    # --- what the network calls, as this end's host ---------------------------------------

    def _arrive(self, data: bytes | None) -> None:
        if self._lost:
            return
        if not self._reading or self._held:  # (reading with bytes held: a drain is due, they go first)
            self._held.append(data)
            return
        self._take(data)

    def _take(self, data: bytes | None) -> None:
        assert self.protocol is not None
        if data is None:
            keep_open = self.protocol.eof_received()  # type: ignore[attr-defined]
            if not keep_open:
                self.close()
            return
        self.protocol.data_received(data)  # type: ignore[attr-defined]

    def _lose(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self.net.forget(self)
        if self.protocol is not None:
            self.protocol.connection_lost(exc)


class SimServer(asyncio.AbstractServer):
    """A listening address of a simulated host: what ``loop.create_server`` returns."""

    def __init__(self, net: "Network", host: str, port: int, factory: Callable[[], asyncio.BaseProtocol]) -> None:
        self.net = net
        self.host = host
        self.port = port
        self.factory = factory
        self.sockets = [SimSocket((host, port))]
        self._serving = True

    def close(self) -> None:
        if self._serving:
            self._serving = False
            self.net.servers.pop((self.host, self.port), None)

    async def wait_closed(self) -> None:
        pass

    def is_serving(self) -> bool:
        return self._serving

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.net.loop

    async def start_serving(self) -> None:
        pass

    async def serve_forever(self) -> None:
        await self.net.loop.create_future()

    def close_clients(self) -> None:
        pass

    def abort_clients(self) -> None:
        pass


class Network:
    """The simulated hosts' connections, the faults between them, and the trace of what crossed."""

    def __init__(self, loop: VirtualLoop, delay_s: tuple[float, float] = (0.0005, 0.005)) -> None:
        self.loop = loop
        self.delay_s = delay_s
        self.servers: dict[Addr, SimServer] = {}
        self.open: dict[SimTransport, None] = {}  # (ordered: faults visit connections in the order they opened)
        self.cuts: set[frozenset[str]] = set()
        self.one_way: set[tuple[str, str]] = set()  # (from, to): bytes from one host to the other go nowhere
        self._next_port: dict[str, int] = {}
        self._hash = hashlib.sha256()
        self.deliveries = 0
        self.bytes = 0
        self.log: list[tuple[float, Addr, Addr, bytes | None]] | None = None  # every delivery, when a list
        loop.network = self
        _patch_aiohttp()

    def _delay(self) -> float:
        lo, hi = self.delay_s
        return lo + (hi - lo) * self.loop.rng.random()

    def _ephemeral(self, host: str) -> int:
        port = self._next_port.get(host, 40000)
        self._next_port[host] = port + 1
        return port

    # --- the loop's network calls ----------------------------------------------------------

    def listen(self, factory: Callable[[], asyncio.BaseProtocol], host: str, port: int) -> SimServer:
        if port == 0:
            port = self._ephemeral(host)
        if (host, port) in self.servers:
            raise OSError(errno.EADDRINUSE, f"address already in use: {host}:{port}")
        server = SimServer(self, host, port, factory)
        self.servers[(host, port)] = server
        return server

    async def connect(self, factory: Callable[[], asyncio.BaseProtocol], remote: Addr
                      ) -> tuple[SimTransport, asyncio.BaseProtocol]:
        me = HOST.get()
        assert me is not None, "a connection from code that runs as no simulated host"
        await asyncio.sleep(2 * self._delay())  # the handshake's round trip
        while (me, remote[0]) in self.one_way or (remote[0], me) in self.one_way:
            await asyncio.sleep(1.0)  # the handshake is lost one way: retried until the caller gives up
        server = self.servers.get(remote)
        if server is None or server.host in self.loop.dead or frozenset((me, server.host)) in self.cuts:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connection refused: {remote[0]}:{remote[1]}")
        local = (me, self._ephemeral(me))
        mine = SimTransport(self, me, local, remote)
        theirs = SimTransport(self, server.host, remote, local)
        mine.peer, theirs.peer = theirs, mine
        self.open.update({mine: None, theirs: None})

        def accept() -> None:
            proto = server.factory()
            theirs.protocol = proto
            proto.connection_made(theirs)

        self.loop.call_in(server.host, 0, accept)
        proto = factory()
        mine.protocol = proto
        proto.connection_made(mine)
        return mine, proto

    # --- carrying bytes ------------------------------------------------------------------------

    def send(self, src: SimTransport, data: bytes | None) -> None:
        dst = src.peer
        if dst is None or dst._lost:
            return
        if src.blocked or (src.host, dst.host) in self.one_way:
            src.blocked.append(data)  # resent once the way is open again, as TCP retransmits
            return
        at = max(self.loop.time() + self._delay(), src.arrive_at)  # one stream: in order
        src.arrive_at = at
        # Each delivery takes the oldest bytes in flight: timers due in the same instant may fire in any
        # order, the stream's bytes may not.
        src.in_flight.append(data)
        self.loop.call_in(dst.host, at - self.loop.time(), self._deliver, src, dst)

    def _deliver(self, src: SimTransport, dst: SimTransport) -> None:
        data = src.in_flight.popleft()
        if dst._lost:
            if self.log is not None:
                self.log.append((self.loop.time(), src.local, dst.local, b"DROPPED"))
            return
        self.deliveries += 1
        update = self._hash.update
        update(b"%.9f" % self.loop._now)
        update(src.trace_label)  # " {src.local} {dst.local} "
        if data is None:
            update(b"EOF")
        else:
            update(data)
            self.bytes += len(data)
        if self.log is not None:
            self.log.append((self.loop.time(), src.local, dst.local, data))
        dst._arrive(data)

    def reset(self, end: SimTransport) -> None:
        """The connection of ``end`` is gone at once (a RST): its peer learns after a delay."""
        dst = end.peer
        if dst is not None and not dst._lost:
            self.loop.call_in(dst.host, self._delay(), dst._lose, ConnectionResetError(errno.ECONNRESET,
                                                                                       "connection reset"))

    def forget(self, end: SimTransport) -> None:
        self.open.pop(end, None)

    def digest(self) -> str:
        return self._hash.hexdigest()

    # --- faults ---------------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """No connection between hosts ``a`` and ``b`` until ``heal``: open ones are reset."""
        self.cuts.add(frozenset((a, b)))
        for end in list(self.open):
            if {end.host, end.remote[0]} == {a, b} and not end._lost:
                end._closing = True
                end._lost = True  # (dropped without callbacks from this side's view of the reset below)
                self.open.pop(end, None)
                self.loop.call_in(end.host, 0, self._reset_local, end)

    def _reset_local(self, end: SimTransport) -> None:
        if end.protocol is not None:
            end.protocol.connection_lost(ConnectionResetError(errno.ECONNRESET, "connection reset"))

    def heal(self, a: str, b: str) -> None:
        self.cuts.discard(frozenset((a, b)))

    def cut_one_way(self, a: str, b: str) -> None:
        """Bytes from host ``a`` to host ``b`` go nowhere until ``heal_one_way``: open connections stay open
        and what ``a`` writes on them is held (TCP retransmits it once the way is open, unless an end gives
        up first); no new connection between them completes its handshake."""
        self.one_way.add((a, b))

    def heal_one_way(self, a: str, b: str) -> None:
        self.one_way.discard((a, b))
        for end in list(self.open):
            if end.blocked and (end.host, end.remote[0]) == (a, b):
                held, end.blocked = end.blocked, []
                for data in held:
                    self.send(end, data)

    def host_down(self, host: str) -> None:
        """``host`` crashed: its servers are gone and every connection it had is reset at the other end."""
        for addr in [a for a, s in self.servers.items() if s.host == host]:
            del self.servers[addr]
        for end in list(self.open):
            if end.host == host:
                end._closing = end._lost = True
                self.open.pop(end, None)
                self.reset(end)


_patched: list[Any] = []


def _patch_aiohttp() -> None:
    """aiohttp's ``TCPConnector`` opens a socket through ``aiohappyeyeballs.start_connection`` and hands
    it to ``loop.create_connection(sock=...)``; on a virtual loop, that socket is a ``SimSocket`` naming
    the address. Other loops get the real one."""
    if _patched:
        return
    import aiohappyeyeballs

    real = aiohappyeyeballs.start_connection

    async def start_connection(addr_infos: Any, *args: Any, loop: Any = None, **kwargs: Any) -> Any:
        if isinstance(loop or asyncio.get_running_loop(), VirtualLoop):
            host, port = addr_infos[0][4][:2]
            return SimSocket(remote=(host, port))
        return await real(addr_infos, *args, loop=loop, **kwargs)

    aiohappyeyeballs.start_connection = start_connection
    _patched.append(real)
    # What aiohttp draws or reads itself, on a virtual loop from the loop: the Date header's clock, a
    # websocket handshake's key, a client frame's mask, the connector's shuffle of its waiters.
    import aiohttp.client
    import aiohttp.helpers
    from aiohttp._websocket.writer import WebSocketWriter

    aiohttp.helpers.time = VirtualTimeModule()  # type: ignore[attr-defined]
    aiohttp.client.os = VirtualOsModule()  # type: ignore[attr-defined]
    made = WebSocketWriter.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        loop = running()
        if loop is not None:
            self.get_random_bits = functools.partial(loop.rng.getrandbits, 32)

    WebSocketWriter.__init__ = init  # type: ignore[method-assign]
    import aiohttp.connector

    aiohttp.connector.random = VirtualRandomModule()  # type: ignore[attr-defined]


class VirtualTimeModule:
    """The ``time`` module, whose ``time()`` reads the virtual wall clock while a virtual loop runs."""

    def time(self) -> float:
        loop = running()
        return loop.wall() if loop is not None else _time.time()

    def __getattr__(self, name: str) -> Any:
        return getattr(_time, name)


class VirtualRandomModule:
    """The ``random`` module, drawing from the virtual loop's random source while one runs."""

    def __getattr__(self, name: str) -> Any:
        loop = running()
        return getattr(loop.rng if loop is not None else random, name)


class VirtualOsModule:
    """The ``os`` module, whose ``urandom`` draws from the virtual loop's random source while one runs."""

    def urandom(self, n: int) -> bytes:
        loop = running()
        return loop.rng.randbytes(n) if loop is not None else os.urandom(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

