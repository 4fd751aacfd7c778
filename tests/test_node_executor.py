"""The one executor carries a Ready out in the stated order: files, persists, sends (each given what
the Ready persisted), links, releases, then the rest."""

from __future__ import annotations

from typing import Any

from ring.node import executor
from ring.node.ready import Ready


class _Rep:
    durable = 0


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        def effect(*args: Any) -> Any:
            self.calls.append((name, *args))
            return "fsync-1" if name == "persist" else None
        return effect


def test_a_ready_is_carried_out_in_the_stated_order() -> None:
    rep = _Rep()
    ready = Ready()
    ready.next_tick_at = 5.0
    ready.announce = True
    ready.reconcile = True
    ready.add("releases", ("produce-1", None))
    ready.flush = frozenset({"b"})
    ready.links = {"b"}
    ready.add("sends", ("b", "ack"))
    ready.add("persist", (rep, 10))
    ready.add("write", ("state", b"x"))
    fx = Recording()
    executor.carry_out(ready, fx)
    assert [c[0] for c in fx.calls] == ["write", "persist", "send", "sent", "relink", "flush", "release",
                                        "reconcile", "announce", "tick_at"]
    assert ("send", "b", "ack", "fsync-1") in fx.calls  # the send waits for the Ready's fsync


def test_a_persist_already_durable_is_not_asked_for() -> None:
    rep = _Rep()
    rep.durable = 10
    ready = Ready()
    ready.add("persist", (rep, 10))
    ready.add("sends", ("b", "ack"))
    fx = Recording()
    executor.carry_out(ready, fx)
    assert fx.calls == [("send", "b", "ack", None), ("sent",)]
