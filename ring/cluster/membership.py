"""Membership's async side: the gossip exchanges on the peer port, and membership's files.

The rules (joining, statuses, the ring, removals) and the gossip state are
the node core's (``ring.node.members``); the core ticks gossip every
``GOSSIP_INTERVAL_S`` and this driver carries out what it asks for: each
exchange is HTTP on the peer's ``POST /peer/v1/gossip`` (msgpack bodies,
through the peer client): the SYN goes out, the ACK comes back in the
response and is stepped in, and the ACK2 the core answers with goes out in a
second request. Each exchange also measures the peer's wall clock: ours as
the SYN leaves, the peer's in the answer's ``H_WALL_MS`` header, the round
trip on the monotonic clock, all stepped in with the ACK (the core judges
the clock, ``ring.node.clockwatch``). The peer side (``handle``) steps the
core on the message and returns its answer as the response body (the peer
route adds our wall clock). Every exchange is bounded by
``GOSSIP_REQUEST_TIMEOUT_S``; at most one runs per peer address.

Known brokers and the topic catalogue are saved in ``cluster-state.json`` in
the data directory whenever they change (the core's Ready says when), so a
restarted broker places partitions as before from its first moment and
gossips to its old peers at once; a peer loaded from that file counts as
``down`` until it is heard from in this run. Brokers this one removed are in
``removed-brokers.json``, and those it decommissioned (with their data
directories' incarnations) in ``decommissioned-brokers.json``, each saved
before it is gossiped.

Failure detection is the core's phi accrual: with the defaults (threshold 8,
1 s gossip) a stopped broker (SIGKILL or SIGSTOP) is reported ``down`` by
every other broker about 4-13 s after it stopped (``suspect`` about half a
second earlier), and ``up`` again within a gossip round or two of its return.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Callable, TypeVar

import msgpack

from ring import limits
from ring.clock import Clock
from ring.cluster.peers import H_WALL_MS, PeerClient
from ring.errors import BadRequest, StorageError
from ring.gossip import leaders
from ring.gossip.core import Message, Syn, message_from_wire
from ring.gossip.state import ClusterState, EndpointState
from ring.hashing import Ring
from ring.log.fsync import write_atomically
from ring.node.gossip_steps import DECOMMISSIONED_FILE, REMOVED_FILE, STATE_FILE
from ring.node.members import Members
from ring.node.ready import Announce, DeleteTopic, GossipIn, PutTopic, Ready, RemoveBroker
from ring.replication import versions
from ring.tls import PLAINTEXT, TlsConfig

log = logging.getLogger("ring.cluster")

GOSSIP_PATH = "/peer/v1/gossip"


def pack(wire: Any) -> bytes:
    return msgpack.packb(wire, use_bin_type=True)


def _header_ms(value: str | None) -> int | None:
    """A header's milliseconds (non-negative int64), None when absent or malformed."""
    ok = value is not None and 0 < len(value) <= 18 and value.isascii() and value.isdigit()
    return int(value) if ok else None  # type: ignore[arg-type]


def unpack_message(body: bytes) -> Message:
    try:
        wire = msgpack.unpackb(body, raw=False)  # the body was read with GOSSIP_MESSAGE_BYTES_MAX
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadRequest(f"malformed gossip: not msgpack ({exc})") from None
    return message_from_wire(wire)


def header_ms(value: str | None) -> int | None:
    """A header's milliseconds (non-negative int64), None when absent or malformed."""
    ok = value is not None and 0 < len(value) <= 18 and value.isascii() and value.isdigit()
    return int(value) if ok else None  # type: ignore[arg-type]


T = TypeVar("T")


def _load_json(path: Path, decode: Callable[[Any], T]) -> T | None:
    """``decode`` of the JSON file at ``path``; None when there is none or it cannot be read."""
    try:
        return decode(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("ignoring unreadable %s: %s", path, exc)
        return None


def load_files(data_dir: Path) -> tuple[ClusterState | None, dict[str, int] | None,
                                        dict[str, str] | None]:
    """Membership's saved state, our removals and our decommissions, as an earlier run left them (damaged
    ones: none)."""
    saved = None
    try:
        saved = ClusterState.from_wire(msgpack.unpackb((data_dir / STATE_FILE).read_bytes(), raw=False))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, msgpack.UnpackException, BadRequest) as exc:
        log.error("ignoring damaged %s: %s", data_dir / STATE_FILE, exc)
    removed = _load_json(data_dir / REMOVED_FILE, leaders.decode_removed)
    decommissioned = _load_json(data_dir / DECOMMISSIONED_FILE, leaders.decode_decommissioned)
    return saved, removed, decommissioned


class Membership:
    def __init__(self, members: Members, clock: Clock, data_dir: Path, step: Callable[[Any], Ready],
                 tls: TlsConfig = PLAINTEXT) -> None:
        self.members = members
        self.name = members.name
        self.clock = clock
        self.data_dir = Path(data_dir)
        self.step = step  # the node core's, carried out
        self.tls = tls  # every broker of a cluster speaks TLS, or none does: it makes the URLs' scheme
        self._peers: PeerClient | None = None
        self._exchanges: dict[str, asyncio.Task[None]] = {}
        self._acks: set[asyncio.Task[Any]] = set()  # ACK2s on their way
        saved, removed, decommissioned = load_files(self.data_dir)
        members.restore(saved, removed, clock.monotonic(), decommissioned)

    def start(self, client: PeerClient) -> None:
        self._peers = client

    async def close(self) -> None:
        tasks = [*self._exchanges.values(), *self._acks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            self.write([(STATE_FILE, pack(self.members.gossip.state.to_wire()))])
        except StorageError as exc:
            log.error("%s", exc)

    def now(self) -> float:
        return self.clock.monotonic()

    # --- what the core's Readies ask for ------------------------------------------------

    def write(self, files: list[tuple[str, bytes]]) -> None:
        for name, data in files:
            try:
                write_atomically(self.data_dir / name, data)
            except OSError as exc:
                raise StorageError(f"saving {self.data_dir / name}: {exc}") from exc

    def send(self, addr: str, message: Message) -> None:
        """A SYN starts an exchange (unless one with that address runs); an ACK2 is posted alone."""
        if self._peers is None:
            return
        if isinstance(message, Syn):
            running = self._exchanges.get(addr)
            if running is None or running.done():
                task = asyncio.create_task(self._exchange(addr, message), name=f"gossip {addr}")
                self._exchanges[addr] = task
                task.add_done_callback(
                    lambda t: self._exchanges.pop(addr, None) if self._exchanges.get(addr) is t else None)
        else:
            task = asyncio.create_task(self._post(addr, message))
            self._acks.add(task)
            task.add_done_callback(self._acks.discard)

    async def _post(self, addr: str, msg: Message) -> tuple[bytes | None, str | None]:
        """The answer's body (None: none came), and the peer's wall clock as it answered."""
        assert self._peers is not None
        return await self._peers.call_url(self._peers.addr_url(addr), GOSSIP_PATH, pack(msg.to_wire()),
                                          timeout_s=limits.GOSSIP_REQUEST_TIMEOUT_S, answer_header=H_WALL_MS)

    async def _exchange(self, addr: str, syn: Message) -> None:
        sent_s, sent_wall_ms = self.now(), self.clock.wall_ms()
        body, peer_wall = await self._post(addr, syn)
        if not body:
            return
        try:
            message = unpack_message(body)
        except BadRequest as exc:
            log.debug("gossip with %s failed: %s", addr, exc)
            return
        peer_wall_ms = header_ms(peer_wall)
        self.step(GossipIn(addr, message, None if peer_wall_ms is None else (sent_s, sent_wall_ms, peer_wall_ms)))

    def handle(self, body: bytes) -> bytes | None:
        """The peer side: step on a message from a peer; the answer goes back in the response (with our
        wall clock in its ``H_WALL_MS`` header)."""
        msg = unpack_message(body)
        peer = self.members.endpoint(msg.sender)
        answer = self.step(GossipIn(peer.peer_addr if peer is not None else "", msg)).reply
        return pack(answer.to_wire()) if answer is not None else None

    async def announce(self, timeout_s: float = limits.CLUSTER_ANNOUNCE_TIMEOUT_S) -> None:
        """Exchange with every live peer now (after a local catalogue change), waiting up to ``timeout_s``."""
        if self._peers is None:
            return
        ready = self.step(Announce())
        tasks = [self._exchanges[addr] for addr, m in ready.sends if isinstance(m, Syn) and addr in self._exchanges]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    # --- what the core knows --------------------------------------------------------------

    @property
    def joined(self) -> bool:
        return self.members.joined

    @property
    def ring(self) -> Ring:
        return self.members.ring

    def status(self, name: str) -> str:
        """up, suspect, down, joining, leaving or removed, as this broker sees it."""
        return self.members.status(name, self.now())

    def alive(self, name: str) -> bool:
        return self.members.alive(name, self.now())

    def endpoint(self, name: str) -> EndpointState | None:
        return self.members.endpoint(name)

    def client_url(self, name: str) -> str | None:
        ep = self.endpoint(name)
        return f"{self.tls.scheme}://{ep.client_addr}" if ep is not None else None

    def peer_url(self, name: str) -> str | None:
        ep = self.endpoint(name)
        return f"{self.tls.scheme}://{ep.peer_addr}" if ep is not None else None

    def brokers(self) -> list[dict[str, Any]]:
        now = self.now()
        out = []
        for name, ep in sorted(self.members.gossip.state.endpoints.items(), key=lambda kv: kv[1].token):
            out.append({"name": name, "token": ep.token, "status": self.members.status(name, now),
                        "phi": round(self.members.gossip.phi(name, now), 3),
                        "clock": self.members.clock_of(name, now),
                        "client_url": f"{self.tls.scheme}://{ep.client_addr}",
                        "peer_url": f"{self.tls.scheme}://{ep.peer_addr}", "generation": ep.generation,
                        "host": ep.extra.get("host"), "zone": ep.extra.get("zone"),
                        "incarnation": ep.extra.get("incarnation"), "load": dict(ep.load),
                        "protocol": list(versions.parse_range(ep.extra.get(versions.EXTRA_KEY)))})
        return out

    def gossiped(self, key: str) -> dict[str, Any]:
        """Name -> what each live broker gossips under ``key`` in its entry's extra (those that do)."""
        now = self.now()
        return {name: ep.extra[key] for name, ep in self.members.gossip.state.endpoints.items()
                if ep.extra.get(key) is not None and self.members.alive(name, now)}

    def describe(self) -> dict[str, Any]:
        """The brokers, and the peer-protocol version the cluster speaks (``ring.replication.versions``)."""
        return {"brokers": self.brokers(), "protocol_version": self.members.protocol_version()}

    def removed(self) -> set[str]:
        return self.members.removed()

    def clock_usable(self, name: str) -> bool:
        return self.members.clock_usable(name)

    def remove(self, name: str) -> None:
        """Take ``name`` (at its current generation) off the ring; saved and gossiped."""
        self.step(RemoveBroker(name))

    # --- the topic catalogue -----------------------------------------------------------

    def topics(self) -> dict[str, dict[str, Any]]:
        return self.members.gossip.topics()

    def put_topic(self, name: str, config: dict[str, Any], wall_ms: int | None = None) -> None:
        """Gossip a topic's config, stamped ``wall_ms`` (default: now; last writer wins)."""
        config = versions.topic_wire(config, self.members.protocol_version())  # (an older broker reads no id)
        self.step(PutTopic(name, config, self.clock.wall_ms() if wall_ms is None else wall_ms))

    def delete_topic(self, name: str) -> None:
        self.step(DeleteTopic(name, self.clock.wall_ms()))
