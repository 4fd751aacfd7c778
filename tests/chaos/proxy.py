"""A fault-injecting TCP proxy between brokers on loopback, for machines without network namespaces.

Broker i listens on its own loopback address and advertises another one, where
this proxy listens on the same ports and forwards every connection to it. All
broker-to-broker traffic therefore crosses the proxy, which knows which
broker opened each connection by looking the connecting socket up in
/proc/net/tcp and finding the broker process that holds it (brokers do not
bind their outgoing connections, so the source address says nothing).
Connections from anyone else (the harness's clients) are never touched.

Faults are per ordered pair ``(src, dst)`` and apply to connections src opens
to dst, existing and new, as an iptables rule in a namespace would:

* ``blackhole``: nothing src sends reaches dst (held until healed, as TCP
  retransmission would deliver it late); what dst sends back still flows.
* ``reset``: such connections are aborted (RST) as soon as they carry data.
* ``delay:<ms>``: each chunk src sends waits that long first.

Everything runs on the caller's event loop; ``block``/``heal`` take effect at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from typing import Callable

log = logging.getLogger("chaos.proxy")

CHUNK_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 5.0
CONNECTIONS_MAX = 512  # per proxy: brokers keep a few pooled connections each; a leak shows up as refusals
BLACKHOLE, RESET = "blackhole", "reset"


def _hex_addr(host: str, port: int) -> str:
    """An IPv4 address as /proc/net/tcp writes it: little-endian hex address, hex port."""
    packed = socket.inet_aton(host)
    return f"{struct.unpack('<I', packed)[0]:08X}:{port:04X}"


def socket_inode(local: tuple[str, int], remote: tuple[str, int], table: str = "/proc/net/tcp") -> int | None:
    """The inode of the TCP socket with that local and remote address, from /proc."""
    want_local, want_remote = _hex_addr(*local), _hex_addr(*remote)
    with open(table) as f:
        next(f, None)
        for line in f:
            cols = line.split()
            if len(cols) > 9 and cols[1] == want_local and cols[2] == want_remote:
                return int(cols[9])
    return None


def pid_holding(inode: int, pids: list[int]) -> int | None:
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return pid
            except OSError:
                continue
    return None


class Proxy:
    """Listens on (listen_host, port) for each given port and forwards to (target_host, port) of broker ``dst``.

    ``brokers()`` returns {pid: broker index} of the brokers running now (PIDs change on restarts).
    """

    def __init__(self, dst: int, listen_host: str, target_host: str, ports: list[int],
                 brokers: Callable[[], dict[int, int]]) -> None:
        self.dst, self.listen_host, self.target_host, self.ports = dst, listen_host, target_host, ports
        self.brokers = brokers
        self.faults: dict[int, str] = {}  # src broker -> fault on connections it opens to dst
        self._healed: dict[int, asyncio.Event] = {}
        self._servers: list[asyncio.base_events.Server] = []
        self._conns: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.refused = 0

    async def start(self) -> None:
        for port in self.ports:
            self._servers.append(await asyncio.start_server(self._accept, self.listen_host, port,
                                                            reuse_address=True))

    async def close(self) -> None:
        """Stop listening and end every connection (aborted, not cancelled: handlers finish on their own)."""
        for s in self._servers:
            s.close()
        for src in list(self.faults):
            self.set_fault(src, None)
        for w in list(self._writers):
            w.transport.abort()
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=5)
        for s in self._servers:
            await s.wait_closed()

    def set_fault(self, src: int, fault: str | None) -> None:
        assert fault in (None, BLACKHOLE, RESET) or fault.startswith("delay:"), fault
        if fault is None:
            self.faults.pop(src, None)
            if src in self._healed:
                self._healed.pop(src).set()
        else:
            self.faults[src] = fault
            self._healed.setdefault(src, asyncio.Event())

    def _source(self, peer: tuple[str, int], local: tuple[str, int]) -> int | None:
        brokers = self.brokers()
        inode = socket_inode(peer, local)
        pid = pid_holding(inode, list(brokers)) if inode is not None else None
        return brokers.get(pid) if pid is not None else None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conns) >= CONNECTIONS_MAX:
            self.refused += 1
            writer.transport.abort()
            return
        self._conns.add(task)
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            peer = writer.get_extra_info("peername")[:2]
            local = writer.get_extra_info("sockname")[:2]
            src = self._source(peer, local)
            await self._gate(src, writer)  # a blocked source does not even reach the broker
            up_reader, upstream = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, local[1]), CONNECT_TIMEOUT_S)
            self._writers.add(upstream)
            await asyncio.gather(self._pump(reader, upstream, src, writer), self._pump(up_reader, writer, None, writer))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.discard(task)
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.transport.abort()

    async def _gate(self, src: int | None, conn: asyncio.StreamWriter) -> None:
        """Wait while ``src`` is blackholed from dst; apply reset and delay."""
        for _ in range(1_000_000):  # bounded: each round waits for a heal or returns
            fault = self.faults.get(src) if src is not None else None
            if fault is None:
                return
            if fault == RESET:
                conn.transport.abort()
                raise ConnectionResetError("reset by the chaos proxy")
            if fault.startswith("delay:"):
                await asyncio.sleep(int(fault.partition(":")[2]) / 1000)
                return
            await self._healed[src].wait()  # type: ignore[index]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, src: int | None,
                    conn: asyncio.StreamWriter) -> None:
        """Copy one direction; ``src`` set means this direction is src's, subject to its faults."""
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                await self._gate(src, conn)
                writer.write(data)
                await writer.drain()
        finally:
            if writer.can_write_eof():
                try:
                    writer.write_eof()
                except OSError:
                    pass
