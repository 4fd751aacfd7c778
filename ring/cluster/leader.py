"""The leader's side of replication on the wire: one websocket per follower broker.

What to send and when is the node core's (``ring.node.links``); a
``LinkDriver`` only moves it. It connects to the follower's
``/peer/v1/replicate`` through the peer client (cluster secret and our name
in headers, and as subprotocols every replication protocol version it speaks up
to the cluster's, highest first (``versions.offered``): the follower answers
the first it speaks and both write that version's frames; a link it answers
with none of them is dropped), reconnecting with doubling backoff, and runs two loops on the
connection: the sender, woken when a Ready names the link in ``flush``,
steps ``Flush`` for the link and writes the frames the core returns (new
batches appended in one event-loop turn leave in one frame); the receiver
steps each answer (``FromFollower``). ``LinkUp`` and ``LinkDown`` tell the
core when the connection comes and goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any, Protocol

import aiohttp

from ring import limits
from ring.clock import Clock
from ring.errors import BadRequest
from ring.node.ready import Flush, FromFollower, LinkDown, LinkUp, Ready
from ring.replication import protocol, versions

log = logging.getLogger("ring.replication")

REPLICATE_PATH = "/peer/v1/replicate"
# How long a retired link waits for the follower to answer its close: a follower busy for longer (an
# fsync, a full answer queue) reads the close too late to tell it from a broken link.
RETIRE_CLOSE_S = 3.0


def _unmasked(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Send this link's frames unmasked.

    RFC 6455 has a client mask every frame so that a browser's script cannot
    make a frame look like a request to a proxy's cache in between. Both ends
    here are brokers on the peer port, and aiohttp's server reads unmasked
    frames as they are; masking would copy and XOR every replicated byte on
    the leader and again on the follower (a tenth of a leader's CPU under
    batched produce). If aiohttp's writer ever changes shape, frames stay
    masked: slower, never wrong.
    """
    writer = getattr(ws, "_writer", None)
    if writer is not None and isinstance(getattr(writer, "use_mask", None), bool):
        writer.use_mask = False


class Peers(Protocol):
    """What a link needs of the peer client (``ring.cluster.peers.PeerClient``), the layer above
    that hands it in."""

    def peer_url(self, name: str) -> str | None: ...

    def ws_connect(self, url: str, path: str, protocols: tuple[str, ...]) -> Any: ...


class LinkPump(Protocol):
    """What a link needs from the node core's driver (``ring.cluster.pump.NodePump``)."""

    peers: Peers
    clock: Clock
    closed: bool

    def step(self, message: Any) -> Ready: ...

    def on_sent(self, follower: str, nbytes: int) -> None: ...

    def protocol_version(self) -> int: ...


class LinkDriver:
    def __init__(self, pump: LinkPump, follower: str) -> None:
        self.pump = pump
        self.follower = follower
        self.outbox: deque[Any] = deque()  # frames the core gave this link, not yet written
        self.wake = asyncio.Event()
        self.connected = False
        self.retired = False
        self.task: asyncio.Task[None] | None = asyncio.create_task(self._run(), name=f"replicate to {follower}")

    def kick(self) -> None:
        """The core has something for this link: step Flush on the sender's next turn."""
        self.wake.set()

    def put(self, frame: Any) -> None:
        if self.connected:
            self.outbox.append(frame)
            self.wake.set()

    def stop(self, retired: bool = False) -> None:
        """End the link; ``retired``: on purpose, the follower is told so as the link closes."""
        self.retired = retired
        if self.task is not None:
            self.task.cancel()

    async def _run(self) -> None:
        delay_s = limits.REPLICATION_RECONNECT_MS_MIN / 1000
        while True:
            url = self.pump.peers.peer_url(self.follower)
            if url is not None:
                try:
                    await self._connected(url)
                    delay_s = limits.REPLICATION_RECONNECT_MS_MIN / 1000
                except aiohttp.WSServerHandshakeError as exc:
                    # 400: it refused our link's subprotocol (a broker of another version); else starting, etc.
                    log.log(logging.WARNING if exc.status == 400 else logging.DEBUG,
                            "replication link to %s refused: %s %s", self.follower, exc.status, exc.message)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                    log.debug("replication link to %s: %s", self.follower, exc)
                except BadRequest as exc:
                    log.warning("replication link to %s: %s", self.follower, exc.message)
                except Exception:  # a bug: say so, and keep the link alive
                    log.exception("replication link to %s failed", self.follower)
            await self.pump.clock.sleep(delay_s)
            delay_s = min(delay_s * 2, limits.REPLICATION_RECONNECT_MS_MAX / 1000)

    async def _connected(self, url: str) -> None:
        offer = versions.offered(self.pump.protocol_version())
        async with self.pump.peers.ws_connect(url, REPLICATE_PATH, offer) as ws:
            version = versions.version_of(ws.protocol) if ws.protocol in offer else None
            if version is None:
                raise BadRequest(f"{self.follower} speaks none of the replication protocols {', '.join(offer)} "
                                 f"(it answered {ws.protocol or 'none'}): a broker of another version; "
                                 "not replicating to it")
            _unmasked(ws)
            log.info("replicating to %s (protocol %d)", self.follower, version)
            self.connected = True
            try:
                self.pump.step(LinkUp(self.follower))
                sender = asyncio.create_task(self._send_loop(ws, version))
                receiver = asyncio.create_task(self._receive_loop(ws))
                try:
                    done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        t.result()  # raise what ended it
                finally:
                    for t in (sender, receiver):
                        t.cancel()
                    await asyncio.gather(sender, receiver, return_exceptions=True)
            finally:
                self.connected = False
                self.outbox.clear()
                if not self.pump.closed:
                    self.pump.step(LinkDown(self.follower))
                if self.retired:  # (the cancellation that stopped the link goes on once it is said)
                    with contextlib.suppress(asyncio.TimeoutError, aiohttp.ClientError, OSError):
                        await self.pump.clock.wait_for(ws.close(code=protocol.LINK_RETIRED), RETIRE_CLOSE_S)

    async def _send_loop(self, ws: aiohttp.ClientWebSocketResponse, version: int) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            self.pump.step(Flush(self.follower))
            while self.outbox:
                frame = self.outbox.popleft()
                await ws.send_bytes(versions.encode(frame, version))
                if type(frame) is protocol.Append:
                    self.pump.on_sent(self.follower, len(frame.data))

    async def _receive_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                if msg.type == aiohttp.WSMsgType.ERROR:
                    raise aiohttp.ClientError(f"websocket error: {ws.exception()}")
                continue
            frame = protocol.decode(msg.data, limits.REPLICATION_MESSAGE_BYTES_MAX)
            if not isinstance(frame, (protocol.FollowerAck, protocol.Reject)):
                raise BadRequest(f"{self.follower} sent a leader's frame")
            self.pump.step(FromFollower(self.follower, frame))
        raise aiohttp.ClientError("the follower closed the link")
