"""The simulation's world: one clock, one event queue, and a network that loses, delays and cuts messages.

Everything happens at a simulated time, in the order of a heap of events,
with one seeded random source: the same seed gives the same run. Two kinds
of traffic, as on the real peer port:

* requests (gossip exchanges, votes, transfers, client requests and their
  answers) go alone: each may be dropped (``loss``), delayed by a random
  amount (so they overtake each other) or blocked by a cut between two
  brokers (``cut`` is one way: a cut a->b drops what a sends to b, and the
  answers b would send back on a's connection). ``call`` is a request with
  an answer: the callee's answer travels back the same way, and a caller
  that hears nothing within its timeout gets None, as the peer client does;
* a replication link (a leader's websocket to one follower) is ordered: its
  frames arrive in the order sent, or, once one is lost or the link is cut
  either way, the link is broken and nothing more of it arrives. The sender
  finds out ``LINK_TIMEOUT_S`` later (the websocket heartbeat) and connects
  again; every frame carries its connection's number, so a frame of an old
  connection is never taken for a new one.

A paused broker (SIGSTOP) receives nothing until it resumes, then everything
that was sent to it, in order; a crashed one refuses connections (a call to
it fails at once).
"""

from __future__ import annotations

import heapq
import logging
import random
from typing import Any, Callable

from ring.clock import ManualClock

LINK_TIMEOUT_S = 2.0  # a broken link is noticed after this long (the real websocket heartbeat is 5 s)
REQUEST_DELAY_S = (0.0005, 0.004)  # a request's one-way trip
FRAME_DELAY_S = (0.0003, 0.002)


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = ManualClock()
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.trace: list[str] | None = None  # lines of what happened, when replaying a seed
        self.current = ""  # the broker whose code runs (names ring's own log lines in a trace)

    @property
    def now(self) -> float:
        return self.clock._monotonic

    def at(self, when: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (max(when, self.now), self._seq, fn))

    def after(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.at(self.now + delay_s, fn)

    def run_until(self, until: float) -> None:
        events, clock = self._events, self.clock
        while events and events[0][0] <= until:
            at, _, fn = heapq.heappop(events)
            if at > clock._monotonic:
                clock.advance(at - clock._monotonic)
            fn()
        if until > clock._monotonic:
            clock.advance(until - clock._monotonic)

    def log(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now:9.3f} {text}")


class TraceHandler(logging.Handler):
    """ring's own log lines, in a replayed seed's trace, with the time and the broker they came from."""

    def __init__(self, world: World) -> None:
        super().__init__(logging.DEBUG)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        self.world.log(f"[{self.world.current}] {record.getMessage()}")


class Network:
    def __init__(self, world: World) -> None:
        self.world = world
        self.nodes: dict[str, Any] = {}  # name -> SimBroker (or the client)
        self.loss = 0.0  # probability a request or a frame is lost
        self.blocked: set[tuple[str, str]] = set()  # (from, to): nothing goes that way
        self._link_busy_until: dict[tuple[str, str], float] = {}
        self._broken: set[tuple[str, str, int]] = set()
        self._calls = 0

    # --- faults ----------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        self.blocked.add((a, b))

    def heal(self) -> None:
        self.blocked.clear()

    def reachable(self, a: str, b: str) -> bool:
        return (a, b) not in self.blocked

    # --- requests ----------------------------------------------------------------------------

    def request(self, src: str, dst: str, msg: Any) -> None:
        """One request or answer: maybe lost, maybe late, never in order with others."""
        if not self.reachable(src, dst) or self.world.rng.random() < self.loss:
            return
        delay = self.world.rng.uniform(*REQUEST_DELAY_S)
        self.world.after(delay, lambda: self._deliver(dst, src, msg))

    def _deliver(self, dst: str, src: str, msg: Any) -> None:
        node = self.nodes.get(dst)
        if node is not None:
            node.receive(src, msg)

    def call(self, src: str, dst: str, msg: Any, timeout_s: float, on_answer: Callable[[Any], None]) -> None:
        """A request whose answer (the callee's ``serve`` return value) comes back to ``on_answer``;
        None after ``timeout_s`` without one, or at once if the callee is not running."""
        self._calls += 1
        done = [False]

        def answer(value: Any) -> None:
            if not done[0]:
                done[0] = True
                on_answer(value)

        node = self.nodes.get(dst)
        if node is None or not node.running:
            self.world.after(self.world.rng.uniform(*REQUEST_DELAY_S), lambda: answer(None))  # refused
            return
        self.world.after(timeout_s, lambda: answer(None))
        self.request(src, dst, ("call", msg, lambda value: self.request(dst, src, ("answer", answer, value))))

    # --- ordered links --------------------------------------------------------------------------

    def connectable(self, src: str, dst: str) -> bool:
        node = self.nodes.get(dst)
        return (self.reachable(src, dst) and self.reachable(dst, src) and node is not None and node.running
                and not node.paused)

    def send_frame(self, src: str, dst: str, conn: int, frame: Any) -> bool:
        """A frame on connection ``conn`` of the link src->dst (answers use (dst, src, conn)). False: broken."""
        if (src, dst, conn) in self._broken:
            return False
        if not self.reachable(src, dst) or self.world.rng.random() < self.loss:
            self.break_link(src, dst, conn)
            return False
        key = (src, dst)
        at = max(self._link_busy_until.get(key, 0.0), self.world.now + self.world.rng.uniform(*FRAME_DELAY_S))
        self._link_busy_until[key] = at
        self.world.at(at, lambda: self._deliver_frame(dst, src, conn, frame))
        return True

    def _deliver_frame(self, dst: str, src: str, conn: int, frame: Any) -> None:
        if (src, dst, conn) in self._broken:
            return
        node = self.nodes.get(dst)
        if node is not None:
            node.wire.receive_frame(src, conn, frame)

    def broken(self, src: str, dst: str, conn: int) -> bool:
        return (src, dst, conn) in self._broken

    def break_link(self, a: str, b: str, conn: int) -> None:
        self._broken.add((a, b, conn))
        self._broken.add((b, a, conn))
