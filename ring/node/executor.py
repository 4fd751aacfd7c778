"""The one executor of a ``Ready``: it carries every field out in the order ``ready.py`` states.

A broker's pump (``ring.cluster.pump``) and the simulation (``tests/sim``)
both hand each Ready the node core returns to ``carry_out``, each with its own
``Effects``: the broker's data directory, links, peer client and futures, or
the simulated disk and network. A follower's Readys too: its persist starts
an fsync whose handle ``persist`` returns, and each answer to its leader is
handed with that handle to the link the frame came in on, which sends it
once the fsync is done. Nothing else carries out a Ready's fields. The order
lives here only, so what the
simulation checks is the order the broker ships: files written, then
persists asked for, then sends (each given what the Ready persisted, so an
answer that depends on an fsync waits for it), then the links' changes and
flushes (a flushed link's hw frames leave before the produces they commit are
answered), then releases, then the rest. The order is that of ``carry_out``'s
statements, one after the other, and ``tests/test_executor_order.py`` holds
it; an effect that steps the core again has the nested Ready carried out in
the same order before the outer one goes on.
"""

from __future__ import annotations

from typing import Any, Protocol

from ring.node.ready import Ready, Token
from ring.replication.replica import Replica


class Effects(Protocol):
    """What a Ready asks for, done by the broker (its files, links and futures) or by the simulated world."""

    def write(self, files: list[tuple[str, bytes]]) -> None: ...

    def persist(self, rep: Replica, end: int) -> Any:
        """Start making ``rep`` durable to ``end``; return a handle the sends that depend on it wait for."""

    def send(self, dst: str, message: Any, persisted: Any) -> None:
        """Send ``message``; ``persisted`` is the Ready's last persist handle (None: nothing to wait for)."""

    def sent(self) -> None:
        """Every send of this Ready was handed over (messages that travel together may leave now)."""

    def relink(self, wanted: set[str]) -> None: ...

    def flush(self, names: set[str] | frozenset[str]) -> None: ...

    def release(self, token: Token, exc: BaseException | None) -> None: ...

    def changed(self, reps: list[Replica]) -> None: ...

    def damaged(self, rep: Replica, offset: int) -> None: ...

    def after_idle(self, rep: Replica, message: Any) -> None: ...

    def reconcile(self) -> None: ...

    def clock(self, verdict: Any) -> None: ...

    def announce(self) -> None: ...

    def tick_at(self, at: float) -> None: ...


def carry_out(ready: Ready, fx: Effects) -> None:
    """Carry ``ready`` out through ``fx``, in the stated order (see the module's docstring)."""
    if ready.write:
        fx.write(ready.write)
    persisted = None
    for rep, end in ready.persist:
        if rep.durable < end:
            persisted = fx.persist(rep, end)  # (a follower's Ready persists one log)
    for dst, message in ready.sends:
        fx.send(dst, message, persisted)
    fx.sent()
    if ready.links is not None:
        fx.relink(ready.links)
    if ready.flush:
        fx.flush(ready.flush)
    for token, exc in ready.releases:
        fx.release(token, exc)
    if ready.changed:
        fx.changed(ready.changed)
    for rep, offset in ready.damaged:
        fx.damaged(rep, offset)
    for rep, message in ready.after_idle:
        fx.after_idle(rep, message)
    if ready.reconcile:
        fx.reconcile()
    if ready.clock is not None:
        fx.clock(ready.clock)
    if ready.announce:
        fx.announce()
    if ready.next_tick_at is not None:
        fx.tick_at(ready.next_tick_at)
