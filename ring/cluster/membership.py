"""Membership: the async driver around ``GossipCore`` (ring/gossip) on the peer port.

Every ``GOSSIP_INTERVAL_S`` the driver ticks the core and carries out the
exchanges it asks for, each as HTTP on the peer's ``POST /peer/v1/gossip``
(msgpack bodies, the cluster secret in a header): the SYN goes out, the ACK
comes back in the response, and the ACK2 the core answers with goes out in a
second request. The peer side (``handle``) steps the core on the message and
returns its answer as the response body. Every exchange is bounded by
``GOSSIP_REQUEST_TIMEOUT_S``; at most one runs per peer address.

A broker told about its peers only by seeds knows nothing of the ring until
an exchange succeeds, so it reports itself ``joining`` (and the broker turns
client requests away) until ``placement.joined`` says it has seen enough.
Known brokers and the topic catalogue are saved in ``cluster-state.json`` in
the data directory whenever they change, so a restarted broker places
partitions as before from its first moment and gossips to its old peers at
once; a peer loaded from that file counts as ``down`` until it is heard from
in this run.

Every exchange this broker starts also measures the peer's wall clock (the
answer carries it in a header, ``H_WALL_MS``; ``ring.gossip.clocks``), and
every gossip round judges this
broker's clock against its peers': the judgement is gossiped (``clock`` in
the entry's extra), logged when it changes, and handed to the broker
(``on_clock``); live peers without a fresh measurement get an exchange of
their own. A starting broker stays joining until it has compared its clock
with its live peers' (a broker with none has nothing to compare with).

Failure detection is the core's phi accrual: with the defaults (threshold 8,
1 s gossip) a stopped broker (SIGKILL or SIGSTOP) is reported ``down`` by
every other broker about 4-13 s after it stopped (``suspect`` about half a
second earlier), and ``up`` again within a gossip round or two of its return.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from pathlib import Path
from typing import Any, Callable

import aiohttp
import msgpack

from ring import limits
from ring.clock import Clock
from ring.cluster import leaders, peers, placement
from ring.errors import BadRequest, NotFound, StorageError
from ring.gossip import clocks
from ring.gossip.core import GOSSIP_INTERVAL_S, Ack, Ack2, GossipCore, Message, Syn, message_from_wire
from ring.gossip.state import ClusterState, EndpointState
from ring.hashing import Ring
from ring.log.fsync import write_atomically
from ring.replication.protocol import ALIVE_STATUSES
from ring.tls import PLAINTEXT, TlsConfig
from ring.cluster.peers import H_BROKER, H_SECRET, H_WALL_MS

log = logging.getLogger("ring.cluster")

STATE_FILE = "cluster-state.json"
REMOVED_FILE = "removed-brokers.json"
CT_MSGPACK = "application/msgpack"
GOSSIP_PATH = "/peer/v1/gossip"
# A seed that never answers holds a starting broker back this long after its
# first successful exchange (the others may simply know nothing of it yet).
JOIN_SETTLE_S = 5.0


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


class Membership:
    def __init__(self, self_state: EndpointState, seeds: list[str], secret: str | None, clock: Clock,
                 rng: random.Random, data_dir: Path,
                 on_change: Callable[[bool, bool], None] = lambda ring, topics: None,
                 load: Callable[[], dict[str, Any]] = dict,
                 down_grace_s: float = limits.DOWN_GRACE_S_DEFAULT, tls: TlsConfig = PLAINTEXT,
                 max_clock_offset_ms: float = limits.CLOCK_OFFSET_MS_MAX_DEFAULT,
                 on_clock: Callable[[clocks.Verdict], None] = lambda verdict: None) -> None:
        self.name = self_state.name
        warn_ms = max_clock_offset_ms * limits.CLOCK_OFFSET_WARN_PERCENT / 100
        self.clocks = clocks.ClockOffsets(max_clock_offset_ms, warn_ms, limits.CLOCK_SAMPLE_RTT_MS_MAX,
                                          limits.CLOCK_SAMPLE_TTL_S)
        self.clock_verdict = clocks.Verdict(clocks.UNKNOWN, reason="not judged yet")
        self.on_clock = on_clock
        self.tls = tls  # every broker of a cluster speaks TLS, or none does: it makes the URLs' scheme
        self.down_grace_s = down_grace_s
        self._extra: dict[str, Any] = {}
        self._down_since: dict[str, float] = {}
        self._removed: set[str] = set()
        self.removed_path = Path(data_dir) / REMOVED_FILE
        self.clock = clock
        self.secret = secret
        self.core = GossipCore(self_state, seeds, rng)
        self.path = Path(data_dir) / STATE_FILE
        self.on_change = on_change
        self._load = load
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._exchanges: dict[str, asyncio.Task[None]] = {}
        self._first_exchange_s: float | None = None
        self._joined = False
        self._announcing: asyncio.Task[None] | None = None
        self._dirty = False
        self.ring: Ring = Ring()
        self._ring_key: tuple = ()
        self._restore()
        self._restore_removed()
        self._ring_changed()
        self.check_clock()
        self._check_joined()

    # --- persistence -----------------------------------------------------------------

    def _restore(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            saved = ClusterState.from_wire(msgpack.unpackb(raw, raw=False))
        except (ValueError, TypeError, msgpack.UnpackException, BadRequest) as exc:
            log.error("ignoring damaged %s: %s", self.path, exc)
            return
        saved.endpoints.pop(self.name, None)  # ours is this run's
        # Straight into the state, not through the core: these are not heartbeats.
        self.core.state.absorb(saved)

    def _restore_removed(self) -> None:
        try:
            doc = json.loads(self.removed_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("ignoring unreadable %s: %s", self.removed_path, exc)
            return
        removed = leaders.decode_removed(doc)
        if removed:
            self.set_extra("removed", removed)

    def save_if_dirty(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        try:
            write_atomically(self.path, pack(self.core.state.to_wire()))
        except OSError as exc:
            self._dirty = True
            raise StorageError(f"saving {self.path}: {exc}") from exc

    # --- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        self._session = peers.make_session(self.secret, self.tls, limits.GOSSIP_REQUEST_TIMEOUT_S)
        self._task = asyncio.create_task(self._loop(), name="gossip")

    async def close(self) -> None:
        tasks = [t for t in (self._task, self._announcing, *self._exchanges.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        try:
            self.save_if_dirty()
        except StorageError as exc:
            log.error("%s", exc)

    async def _loop(self) -> None:
        while True:
            self.tick()
            try:
                self.save_if_dirty()
            except StorageError as exc:
                log.error("%s", exc)
            await asyncio.sleep(GOSSIP_INTERVAL_S)

    def tick(self) -> None:
        load = self._load()
        if load != self.core.self_state.load:  # gossiped with this round's heartbeat
            self.core.set_load(load)
        for out in self.core.tick(self.now()):
            self._spawn_exchange(out.to_addr, out.message)
        self.check_clock()
        self._measure_clocks()
        self._check_joined()
        self._check_grace()
        if self._ring_changed():
            self._dirty = True
            self.on_change(True, False)

    def now(self) -> float:
        return self.clock.monotonic()

    # --- exchanges -------------------------------------------------------------------

    def _spawn_exchange(self, addr: str, syn: Message) -> asyncio.Task[None] | None:
        running = self._exchanges.get(addr)
        if running is not None and not running.done():
            return running
        task = asyncio.create_task(self._exchange(addr, syn), name=f"gossip {addr}")
        self._exchanges[addr] = task
        task.add_done_callback(lambda t: self._exchanges.pop(addr, None) if self._exchanges.get(addr) is t else None)
        return task

    async def _post(self, addr: str, msg: Message) -> tuple[bytes, str | None]:
        """The answer's body, and the peer's wall clock as it answered (``H_WALL_MS``, None without)."""
        assert self._session is not None
        headers = {H_SECRET: self.secret or "", H_BROKER: self.name, "Content-Type": CT_MSGPACK}
        async with self._session.post(f"{self.tls.scheme}://{addr}{GOSSIP_PATH}", data=pack(msg.to_wire()),
                                      headers=headers) as resp:
            body = await resp.content.read(limits.GOSSIP_MESSAGE_BYTES_MAX + 1)
            if resp.status >= 300:
                raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status,
                                                  message=body[:200].decode(errors="replace"))
            return body, resp.headers.get(H_WALL_MS)

    async def _exchange(self, addr: str, syn: Message) -> None:
        """One push-pull with a peer, which also measures its clock: our wall clock as the SYN leaves,
        the peer's in the ACK's ``H_WALL_MS`` header, the round trip on the monotonic clock
        (``ring.gossip.clocks``)."""
        try:
            sent_s, sent_wall_ms = self.now(), self.clock.wall_ms()
            body, peer_wall = await self._post(addr, syn)
            if not body:
                return
            msg = unpack_message(body)
            peer_wall_ms = _header_ms(peer_wall)
            if isinstance(msg, Ack) and peer_wall_ms is not None:
                now = self.now()
                self.clocks.sample(msg.sender, now, sent_wall_ms, now - sent_s, peer_wall_ms)
            for out in self.step(addr, msg):
                await self._post(out.to_addr, out.message)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, BadRequest) as exc:
            log.debug("gossip with %s failed: %s", addr, exc)

    def handle(self, body: bytes) -> bytes | None:
        """The peer side: step on a message from a peer; the answer goes back in the response (with our
        wall clock in its ``H_WALL_MS`` header)."""
        msg = unpack_message(body)
        peer = self.core.state.endpoints.get(msg.sender)
        outs = self.step(peer.peer_addr if peer is not None else "", msg)
        return pack(outs[0].message.to_wire()) if outs else None

    def step(self, addr: str, msg: Message) -> list:
        outs = self.core.on_message(self.now(), addr, msg)
        # An ACK brings a measurement; an ACK2 (a peer's exchange) may make a peer live that no clock
        # was measured against: judged again before ``_check_joined`` reads the judgement.
        if isinstance(msg, (Ack, Ack2)) and self.check_clock().state == clocks.UNKNOWN:
            self._measure_clocks()  # a joining broker needs the others measured too
        if isinstance(msg, (Ack, Ack2)):
            if self._first_exchange_s is None:
                self._first_exchange_s = self.now()
            topics_changed = any(self.core.state.topics.get(n) is t for n, t in msg.delta.topics.items())
            ring_changed = self._ring_changed()
            if topics_changed or ring_changed:
                self._dirty = True
                self.on_change(ring_changed, topics_changed)
            self._check_joined()
        return outs

    async def announce(self, timeout_s: float = limits.CLUSTER_ANNOUNCE_TIMEOUT_S) -> None:
        """Exchange with every live peer now (after a local catalogue change), waiting up to ``timeout_s``."""
        if self._session is None:
            return
        syn = Syn(self.name, self.core.state.digest())
        tasks = [asyncio.create_task(self._exchange(ep.peer_addr, syn))
                 for n, ep in sorted(self.core.state.endpoints.items())
                 if n != self.name and self.status(n) not in ("down", "removed")]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    # --- joining -----------------------------------------------------------------

    def _check_joined(self) -> None:
        if self._joined:
            return
        known = {ep.peer_addr for ep in self.core.state.endpoints.values()}
        since = 0.0 if self._first_exchange_s is None else self.now() - self._first_exchange_s
        if placement.joined(bool(self.core.seeds), self._first_exchange_s is not None,
                            all(s in known for s in self.core.seeds), since, JOIN_SETTLE_S) \
                and self.clock_verdict.state != clocks.UNKNOWN:  # compared with its peers' clocks first
            self._joined = True
            self.core.set_status("normal")
            log.info("%s joined the cluster: %s", self.name, ", ".join(n for _, n in self.ring.brokers))
            self._ring_changed()
            if self._session is not None:  # tell the others now, not in a round or two
                self._announcing = asyncio.create_task(self.announce(), name="announce joined")

    @property
    def joined(self) -> bool:
        return self._joined

    # --- clocks ----------------------------------------------------------------------------

    def live_peers(self) -> list[str]:
        """Peers whose clocks can be measured: heard from in this run and not down (joining ones too)."""
        return [n for n in sorted(self.core.state.endpoints)
                if n != self.name and self.status(n) not in ("down", "removed")]

    def check_clock(self) -> clocks.Verdict:
        """Judge our clock against the peers measured (``ring.gossip.clocks``); gossip the verdict,
        say when it changes, and tell the broker."""
        self._clock_stepped()
        verdict = self.clocks.judge(self.now(), len(self.live_peers()))
        old, self.clock_verdict = self.clock_verdict, verdict
        self.set_extra("clock", clocks.to_gossip(verdict))
        if verdict.state != old.state:
            self._say_clock(old, verdict)
        if clocks.to_gossip(verdict) != clocks.to_gossip(old):
            self.on_clock(verdict)
        return verdict

    def watch_clock_steps(self) -> None:
        """Between gossip rounds: notice at once that the wall clock was set (cheap: two clock reads)."""
        if self._clock_stepped():
            self.check_clock()

    def _clock_stepped(self) -> bool:
        if not self.clocks.observe(self.now(), self.clock.wall_ms()):
            return False
        log.error("the wall clock of %s was set (it jumped against the monotonic clock): it is not used until "
                  "measured against the peers again", self.name)
        return True

    def _say_clock(self, old: clocks.Verdict, new: clocks.Verdict) -> None:
        if new.state == clocks.OUT_OF_BOUNDS:
            log.error("clock of %s out of bounds (--max-clock-offset %.0f ms): %s. It stops leading partitions, "
                      "stamping records and applying time-based retention until it is back within bounds",
                      self.name, self.clocks.max_offset_ms, new.reason)
        elif new.state == clocks.WARNING:
            log.warning("clock of %s: %s (the hard bound is %.0f ms)", self.name, new.reason,
                        self.clocks.max_offset_ms)
        elif new.state == clocks.OK and old.state != clocks.UNKNOWN:
            log.info("clock of %s back within bounds: %s", self.name, new.reason)

    def _measure_clocks(self) -> None:
        """Exchange with live peers we have no fresh clock measurement of, as many as a judgement needs."""
        live = self.live_peers()
        fresh = self.clocks.fresh(self.now())
        missing = clocks.needed(len(live)) - sum(1 for n in live if n in fresh)
        unmeasured = [n for n in live if n not in fresh]
        self.core.rng.shuffle(unmeasured)
        for name in unmeasured[:max(0, missing)]:
            self._spawn_exchange(self.core.state.endpoints[name].peer_addr, Syn(self.name, self.core.state.digest()))

    def clock_of(self, name: str) -> dict[str, Any]:
        """A broker's clock as this broker knows it: its own judgement (gossiped), and our measurement."""
        if name == self.name:
            v = self.clock_verdict
            return {"state": v.state, "offset_ms": None if v.offset_ms is None else round(v.offset_ms),
                    "measured_offset_ms": 0}
        ep = self.endpoint(name)
        state, offset = clocks.from_gossip(ep.extra.get("clock")) if ep is not None else (None, None)
        seen = self.clocks.fresh(self.now()).get(name)
        return {"state": state, "offset_ms": None if offset is None else round(offset),
                "measured_offset_ms": None if seen is None else round(seen.offset_ms)}

    def clock_usable(self, name: str) -> bool:
        """Whether ``name`` may use its clock (lead, stamp, retain by time): by its own gossiped judgement;
        a broker of a version that gossips none counts as usable."""
        if name == self.name:
            return self.clock_verdict.usable
        ep = self.endpoint(name)
        state = clocks.from_gossip(ep.extra.get("clock"))[0] if ep is not None else None
        return state is None or state in clocks.USABLE

    # --- the ring and statuses -----------------------------------------------------------

    def _ring_changed(self) -> bool:
        eps = self.core.state.endpoints.values()
        self._removed = placement.removed_brokers(
            eps, [leaders.decode_removed(e.extra.get("removed")) for e in eps])
        key = (tuple(sorted((e.name, e.token, e.status) for e in eps)), tuple(sorted(self._removed)))
        if key == self._ring_key:
            return False
        self._ring_key = key
        ring = placement.placement_ring(eps, self._removed)
        changed = ring != self.ring
        self.ring = ring
        self._dirty = True
        return changed

    def status(self, name: str) -> str:
        """up, suspect, down, joining, leaving or removed, as this broker sees it."""
        if name in self._removed:
            return "removed"
        st = self.core.status_of(name, self.now())
        if name != self.name and st not in ("removed", "down") and self.core.detector.detector(name) is None:
            return "down"  # known from the saved state only: not heard from in this run
        return st

    def alive(self, name: str) -> bool:
        return name == self.name or self.status(name) in ALIVE_STATUSES

    def endpoint(self, name: str) -> EndpointState | None:
        return self.core.state.endpoints.get(name)

    def client_url(self, name: str) -> str | None:
        ep = self.endpoint(name)
        return f"{self.tls.scheme}://{ep.client_addr}" if ep is not None else None

    def peer_url(self, name: str) -> str | None:
        ep = self.endpoint(name)
        return f"{self.tls.scheme}://{ep.peer_addr}" if ep is not None else None

    def brokers(self) -> list[dict[str, Any]]:
        now = self.now()
        out = []
        for name, ep in sorted(self.core.state.endpoints.items(), key=lambda kv: kv[1].token):
            out.append({"name": name, "token": ep.token, "status": self.status(name),
                        "phi": round(self.core.phi(name, now), 3), "clock": self.clock_of(name),
                        "client_url": f"{self.tls.scheme}://{ep.client_addr}",
                        "peer_url": f"{self.tls.scheme}://{ep.peer_addr}", "generation": ep.generation,
                        "load": dict(ep.load)})
        return out

    # --- our gossiped extras, removals --------------------------------------------------------

    def set_extra(self, key: str, value: Any) -> None:
        """Gossip ``value`` under ``key`` in our entry's extra (a new version only when it changed)."""
        if self._extra.get(key) == value:
            return
        if value:
            self._extra[key] = value
        else:
            self._extra.pop(key, None)
        self.core.set_extra(dict(self._extra))

    def removed(self) -> set[str]:
        return set(self._removed)

    def remove(self, name: str) -> None:
        """Take ``name`` (at its current generation) off the ring; saved and gossiped."""
        ep = self.endpoint(name)
        if ep is None:
            raise NotFound(f"unknown broker {name!r}")
        mine = dict(leaders.decode_removed(self._extra.get("removed")))
        if mine.get(name) == ep.generation:
            return
        mine[name] = ep.generation
        try:
            write_atomically(self.removed_path, json.dumps(mine, sort_keys=True).encode())
        except OSError as exc:
            raise StorageError(f"saving {self.removed_path}: {exc}") from exc
        self.set_extra("removed", mine)
        log.warning("broker %s (generation %d) is removed from the ring", name, ep.generation)
        if self._ring_changed():
            self._dirty = True
            self.on_change(True, False)

    def _check_grace(self) -> None:
        """Remove brokers down longer than the grace period, while a majority of the ring is up here."""
        now = self.now()
        ring_names = [n for _, n in self.ring.brokers]
        for name in ring_names:
            if name != self.name and self.status(name) == "down":
                self._down_since.setdefault(name, now)
            else:
                self._down_since.pop(name, None)
        up = sum(1 for n in ring_names if self.alive(n))
        if up * 2 <= len(ring_names):
            return
        for name in placement.past_grace(self._down_since, now, self.down_grace_s):
            log.warning("%s has been down for %.0f s (grace %.0f s)", name, now - self._down_since[name],
                        self.down_grace_s)
            self._down_since.pop(name, None)
            self.remove(name)

    # --- the topic catalogue -----------------------------------------------------------

    def topics(self) -> dict[str, dict[str, Any]]:
        return self.core.topics()

    def put_topic(self, name: str, config: dict[str, Any]) -> None:
        self.core.put_topic(name, config, self.clock.wall_ms())
        self._dirty = True

    def delete_topic(self, name: str) -> None:
        self.core.delete_topic(name, self.clock.wall_ms())
        self._dirty = True
