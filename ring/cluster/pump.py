"""The node core's async driver: it steps the core and carries out each Ready, nothing else.

``NodePump.step`` hands the core one message (with the clock's ``now``) and
carries out the Ready it returns through ``ring.node.executor`` (the one
executor, which holds the order ``ring.node.ready`` writes down), with this
module's ``BrokerEffects``. Where each thing goes:

* files to write go to the broker's data directory first;
* gossip messages go to membership's exchanges (``ring.cluster.membership``);
* vote requests and transfers go out through the peer client, and their
  answers (or the lack of one) are stepped back in; the vote requests of one
  event-loop turn to one peer go together, ``VOTES_PER_MESSAGE_MAX`` to a
  message, and a message's answers are stepped together (a broker that lost
  the leader of a thousand partitions asks each voter in a few messages);
* frames for a follower go to that follower's replication link
  (``ring.cluster.leader.LinkDriver``), which steps ``Flush`` for its
  link when a Ready names it and sends what comes back;
* a follower's persist starts the fsync of its log (``sync_soon``), and its
  answers to a leader go, with that fsync's future, to the leader's answer
  link (``answer_links``, registered by ``ring.cluster.follower`` while
  that leader's websocket is served), which sends them in order, each after
  its fsync;
* releases resolve the produces' futures (their tokens);
* changed replicas wake what waits for leadership to move (``changed``);
  damaged batches, a new placement and a new verdict on the clock go to the
  broker's callbacks;
* ``announce`` asks every live peer for an exchange a moment later, so the
  partitions won in one burst ride along in one announcement;
* ``next_tick_at`` arms the one timer that ticks the core.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Coroutine

import msgpack

from ring.clock import Clock
from ring.cluster.peers import PeerClient
from ring import limits
from ring.cluster.follower import AnswerLink
from ring.cluster.leader import LinkDriver
from ring.errors import BadRequest
from ring.gossip.core import Ack, Ack2, Syn
from ring.node import executor
from ring.node.core import NodeCore
from ring.node.elections import Transfer
from ring.node.ready import Announce, HandOver, Ready, TransferAnswered, VoteAnswered
from ring.replication import election, protocol
from ring.replication.replica import Replica

log = logging.getLogger("ring.cluster")

_LEADER_FRAMES = (protocol.Sync, protocol.Append, protocol.Hw)
_ANSWERS = (protocol.FollowerAck, protocol.Reject)
_GOSSIP = (Syn, Ack, Ack2)
# After an election is won, the claims are announced this much later, so the other
# partitions won in the same burst ride along.
ANNOUNCE_DELAY_S = 0.02
VOTES_PATH = "/peer/v1/votes"
TRANSFER_PATH = "/peer/v1/transfer"


async def _no_wait(rep: Replica) -> None:
    pass


def _no_sync(rep: Replica) -> asyncio.Future[None]:
    raise AssertionError("a Ready asked for an fsync of a pump given no sync_soon")


class NodePump:
    def __init__(self, core: NodeCore, clock: Clock, peers: PeerClient,
                 on_damaged: Callable[[Replica, int], None] = lambda rep, offset: None,
                 on_sent: Callable[[str, int], None] = lambda follower, nbytes: None,
                 on_write: Callable[[list[tuple[str, bytes]]], None] = lambda files: None,
                 on_gossip: Callable[[str, Any], None] = lambda addr, message: None,
                 on_cluster: Callable[[], None] = lambda: None,
                 on_clock: Callable[[Any], None] = lambda verdict: None,
                 wait_idle: Callable[[Replica], Awaitable[None]] | None = None,
                 sync_soon: Callable[[Replica], asyncio.Future[None]] = _no_sync) -> None:
        self.core = core
        self.on_write = on_write  # files for the data directory
        self.on_gossip = on_gossip  # a gossip message for a peer address
        self.on_cluster = on_cluster  # place partitions anew
        self.on_clock = on_clock  # a new verdict on this broker's wall clock
        self.wait_idle = wait_idle or _no_wait  # until no fsync runs on a replica's log
        self.sync_soon = sync_soon  # start an fsync of a replica's log (group commit); its future
        self.clock = clock
        self.peers = peers
        self.on_damaged = on_damaged
        self.on_sent = on_sent  # stored batch bytes handed to a follower's link (metrics)
        self.links: dict[str, LinkDriver] = {}
        self.answer_links: dict[str, AnswerLink] = {}  # leader -> where its link's answers go (follower.serve's)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle_waits: set[tuple[str, int]] = set()
        self._changed = asyncio.Event()
        self._announcing: asyncio.Task[None] | None = None
        self._votes: dict[str, list[election.VoteRequest]] = {}  # to send at the end of this loop turn
        self.closed = False
        self.effects = BrokerEffects(self)

    def step(self, message: Any) -> Ready:
        """Step the core on ``message`` and carry out what it says."""
        ready = self.core.step(self.clock.monotonic(), message)
        self.carry_out(ready)
        return ready

    def tick(self) -> None:
        self._timer = self._timer_at = None
        if not self.closed:
            try:
                self.carry_out(self.core.tick(self.clock.monotonic(), self.clock.wall_ms()))
            except Exception:  # a bug: say so, and keep ticking
                log.exception("node core tick failed")
                self._arm(self.clock.monotonic() + 0.1)

    def protocol_version(self) -> int:
        return self.core.members.protocol_version()

    def carry_out(self, ready: Ready) -> None:
        executor.carry_out(ready, self.effects)

    def _after_idle(self, rep: Replica, message: Any) -> None:
        """Step ``message`` once no fsync runs on ``rep``'s log (one wait per replica at a time)."""
        key = (rep.topic, rep.index)
        if key in self._idle_waits or self.closed:
            return

        async def wait() -> None:
            try:
                await self.wait_idle(rep)
                if not self.closed:
                    self.step(message)
            finally:
                self._idle_waits.discard(key)

        self._idle_waits.add(key)
        self._spawn(wait())

    # --- leadership moving ------------------------------------------------------------------------

    async def changed(self, timeout_s: float) -> None:
        """Return when leadership of any partition changed here, or after ``timeout_s``."""
        event = self._changed
        try:
            await self.clock.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_leaders(self, topic: str, partitions: int, timeout_s: float) -> None:
        """Return once every partition of ``topic`` has a known leader, or after ``timeout_s``. Where this
        broker holds a replica, the leader is the one that replica follows or is: gossip may still carry
        a claim from a topic of the same name deleted a moment ago."""
        deadline = self.clock.monotonic() + timeout_s
        while any(self._leader_known(topic, p) is None for p in range(partitions)):
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return
            await self.changed(min(remaining, limits.ELECTION_TICK_MS / 1000))

    def _leader_known(self, topic: str, partition: int) -> str | None:
        rep = self.core.replica(topic, partition)
        return rep.leader if rep is not None else self.core.leader_of(topic, partition)

    async def hand_over(self, timeout_s: float) -> list[Replica]:
        """Controlled shutdown: hand every partition led here to a caught-up follower; return once nothing
        more can move (none led here has a follower to take it) or after ``timeout_s``, with the
        partitions still led here (logged)."""
        self.step(HandOver())
        started = self.clock.monotonic()
        while True:
            now = self.clock.monotonic()
            if not self.core.handing_over(now) or now >= started + timeout_s:
                break
            await self.changed(min(started + timeout_s - now, limits.ELECTION_TICK_MS / 1000))
        kept = [r for r in self.core.replicas() if r.is_leader and len(r.voters) > 1]
        name, took = self.core.name, self.clock.monotonic() - started
        if kept:
            log.warning("%s stops still leading %d partitions (no caught-up follower took them within %.1f s): "
                        "they fail over as after a crash", name, len(kept), took)
        else:
            log.info("%s handed every partition it led over in %.2f s", name, took)
        return kept

    async def _announce(self) -> None:
        await self.clock.sleep(ANNOUNCE_DELAY_S)
        self.step(Announce())

    # --- elections' messages -----------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _vote(self, peer: str, req: election.VoteRequest) -> None:
        """Queue ``req`` for ``peer``: the first of a loop turn arranges for the turn's to leave together."""
        if not self._votes:
            asyncio.get_running_loop().call_soon(self._send_votes)
        self._votes.setdefault(peer, []).append(req)

    def _send_votes(self) -> None:
        votes, self._votes = self._votes, {}
        if self.closed:
            return
        for peer, reqs in election.messages(votes):
            self._spawn(self._ask(peer, reqs))

    async def _ask(self, peer: str, reqs: tuple[election.VoteRequest, ...]) -> None:
        body = msgpack.packb([req.to_wire() for req in reqs], use_bin_type=True)
        raw = await self.peers.call(peer, VOTES_PATH, body)
        replies: list[election.VoteReply | None] = [None] * len(reqs)
        if raw is not None:
            try:
                wire = msgpack.unpackb(raw, raw=False)
                if type(wire) is not list or len(wire) != len(reqs):
                    raise BadRequest(f"{len(reqs)} votes asked, the answer is not a list of as many")
                replies = [election.reply_from_wire(w) for w in wire]
            except (BadRequest, ValueError, TypeError, msgpack.UnpackException) as exc:
                log.warning("a malformed vote reply from %s: %s", peer, exc)
        if not self.closed:
            self.step(VoteAnswered(peer, tuple(zip(reqs, replies))))

    async def _transfer(self, peer: str, t: Transfer) -> None:
        params = {"topic": t.topic, "partition": str(t.partition), "epoch": str(t.epoch)}
        raw = await self.peers.call(peer, TRANSFER_PATH, b"", params)
        if not self.closed:
            self.step(TransferAnswered(peer, t, raw is not None))

    def _arm(self, at: float) -> None:
        if self.closed or (self._timer_at is not None and self._timer_at <= at):
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = at
        self._timer = loop.call_later(max(0.0, at - self.clock.monotonic()), self.tick)

    def _relink(self, wanted: set[str]) -> None:
        for name in list(self.links):
            if name not in wanted:
                retiring = self.links.pop(name)
                retiring.stop(retired=True)
                if retiring.task is not None:  # (it says so to the follower as it closes: close waits for it)
                    self._tasks.add(retiring.task)
                    retiring.task.add_done_callback(self._tasks.discard)
        for name in sorted(wanted):
            if name not in self.links:
                self.links[name] = LinkDriver(self, name)

    async def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        links = list(self.links.values())
        self.links.clear()
        for link in links:
            link.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*(link.task for link in links if link.task is not None), *self._tasks,
                             return_exceptions=True)

    def describe(self) -> dict[str, dict[str, object]]:
        doc = self.core.describe_links()
        for name, link in self.links.items():
            doc.setdefault(name, {})["connected"] = link.connected
        return doc


class BrokerEffects:
    """What a Ready asks for, done in a broker (``ring.node.executor.Effects``): see the module's docstring."""

    def __init__(self, pump: NodePump) -> None:
        self.pump = pump

    def write(self, files: list[tuple[str, bytes]]) -> None:
        self.pump.on_write(files)

    def persist(self, rep: Replica, end: int) -> asyncio.Future[None]:
        # (only a follower's Ready persists: its answers wait for this fsync, see ``send``)
        return self.pump.sync_soon(rep)

    def send(self, dst: str, frame: Any, persisted: Any) -> None:
        pump = self.pump
        if isinstance(frame, _LEADER_FRAMES):
            link = pump.links.get(dst)
            if link is not None:
                link.put(frame)
        elif isinstance(frame, _ANSWERS):
            answers = pump.answer_links.get(dst)
            if answers is not None:  # (else the link closed: the leader hears nothing, as on a lost link)
                answers.put(persisted, frame)
        elif isinstance(frame, election.VoteRequest):
            pump._vote(dst, frame)
        elif isinstance(frame, Transfer):
            pump._spawn(pump._transfer(dst, frame))
        elif isinstance(frame, _GOSSIP):
            pump.on_gossip(dst, frame)

    def sent(self) -> None:
        pass

    def relink(self, wanted: set[str]) -> None:
        self.pump._relink(wanted)

    def flush(self, names: set[str] | frozenset[str]) -> None:
        # Links before releases: a sender waiting on its wake is scheduled before the answers'
        # callbacks, so the hw frames of this Ready reach the kernel before the produces they commit
        # are answered (a read from a follower right after an acknowledgement sees it); a sender
        # still writing an earlier frame sends them once that write is done. In name order: the order
        # the frames are written is then the same in every process (a set of names iterates in the order
        # of the process's string hashes), so a simulated run replays exactly.
        links = self.pump.links
        for name in sorted(names):
            link = links.get(name)
            if link is not None:
                link.kick()

    def release(self, token: Any, exc: BaseException | None) -> None:
        if not token.done():
            if exc is None:
                token.set_result(None)
            else:
                token.set_exception(exc)

    def changed(self, reps: list[Replica]) -> None:
        self.pump.notify()

    def damaged(self, rep: Replica, offset: int) -> None:
        self.pump.on_damaged(rep, offset)

    def after_idle(self, rep: Replica, message: Any) -> None:
        self.pump._after_idle(rep, message)

    def reconcile(self) -> None:
        self.pump.on_cluster()

    def clock(self, verdict: Any) -> None:
        self.pump.on_clock(verdict)

    def announce(self) -> None:
        pump = self.pump
        if pump._announcing is None or pump._announcing.done():
            pump._announcing = asyncio.create_task(pump._announce(), name="announce leaders")
            pump._tasks.add(pump._announcing)
            pump._announcing.add_done_callback(pump._tasks.discard)

    def tick_at(self, at: float) -> None:
        self.pump._arm(at)
