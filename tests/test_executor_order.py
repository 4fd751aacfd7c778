"""The one executor (``ring.node.executor.carry_out``) carries a Ready out in the order ``ready.py``
states, whatever the effects: files, then persists, then sends (each given the Ready's persist handle),
then the links' changes and flushes, then releases, then the rest. The broker's pump and the simulation
both carry their Readys out through it, so this order is the one both run."""

from __future__ import annotations

from typing import Any

from ring.node import executor
from ring.node.ready import Ready


class _Rep:
    def __init__(self, durable: int) -> None:
        self.durable = durable


class _Recorded:
    """Effects that write down every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        def effect(*args: Any) -> Any:
            self.calls.append((name, args))
            return f"handle-{len(self.calls)}" if name == "persist" else None
        return effect


def test_every_field_is_carried_out_in_the_stated_order() -> None:
    synced, behind = _Rep(10), _Rep(3)
    ready = Ready()
    ready.write = [("state", b"{}")]
    ready.persist = [(synced, 10), (behind, 7)]  # the first is durable to 10 already: no persist asked
    ready.sends = [("b", "frame-1"), ("c", "frame-2")]
    ready.links = {"b", "c"}
    ready.flush = {"b"}
    ready.releases = [("token", None)]
    ready.changed = [synced]
    ready.damaged = [(synced, 4)]
    ready.after_idle = [(synced, "message")]
    ready.reconcile = True
    ready.clock = "verdict"
    ready.announce = True
    ready.next_tick_at = 12.5
    fx = _Recorded()
    executor.carry_out(ready, fx)
    assert [name for name, _ in fx.calls] == [
        "write", "persist", "send", "send", "sent", "relink", "flush", "release", "changed", "damaged",
        "after_idle", "reconcile", "clock", "announce", "tick_at"]
    calls = dict((name, args) for name, args in fx.calls)
    assert calls["persist"] == (behind, 7)
    # every send waits for what the Ready persisted: the handle the persist returned
    assert [args for name, args in fx.calls if name == "send"] == [("b", "frame-1", "handle-2"),
                                                                    ("c", "frame-2", "handle-2")]


def test_an_empty_ready_asks_nothing_but_that_its_sends_are_handed_over() -> None:
    fx = _Recorded()
    executor.carry_out(Ready(), fx)
    assert [name for name, _ in fx.calls] == ["sent"]
