"""The cases of a bench run, and the interleaved order they run in.

A case is one load shape. Produce cases cross records per request (1, 100),
keyed or not, and ring's consistency level (one, quorum, all); the peers have
one acknowledgement rule each (a quorum of their three replicas), so they run
the quorum cases only and every ratio compares like with like. Latency cases
keep one request in flight, or pace requests at half of the system's own
maximum measured in the same run. Consume reads a freshly filled topic from
offset 0; e2e measures produce-to-long-poll delivery at a fixed modest rate.

Runs interleave systems within a repetition (ring, nats, rabbitmq, kafka, ring, ...)
so a slow spell of the shared machine hits every system alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GROUPS = ("produce", "latency", "consume", "e2e", "ceiling", "cpu", "single", "hostile", "members", "overload",
          "spark")
PEERS = ("nats", "rabbitmq", "kafka")
E2E_RATE_PER_S = 200  # a steady trickle: delivery latency, not throughput


@dataclass(frozen=True)
class Case:
    id: str
    group: str
    label: str
    op: str  # produce | consume | e2e
    records_per_request: int = 1
    keyed: bool = False
    consistency: str = "quorum"
    in_flight: str = "window"  # window | one | half (paced at half the max of `max_of`)
    max_of: str = ""
    peers: bool = True
    metric: str = "rec_s"  # what the comparison table shows: rec_s or latency
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def produce_cases() -> list[Case]:
    out = []
    for rpr in (1, 100):
        for keyed in (False, True):
            for c in ("one", "quorum", "all"):
                kind = "keyed" if keyed else "unkeyed"
                out.append(Case(
                    id=f"produce-{rpr}-{kind}-{c}", group="produce",
                    label=f"produce {rpr}/req, {kind}, {c}", op="produce", records_per_request=rpr,
                    keyed=keyed, consistency=c, peers=c == "quorum"))
    return out


def latency_cases() -> list[Case]:
    out = []
    for rpr in (1, 100):
        out.append(Case(id=f"latency-one-{rpr}", group="latency", op="produce", records_per_request=rpr,
                        label=f"latency, one in flight, {rpr}/req, quorum", in_flight="one", metric="latency"))
        out.append(Case(id=f"latency-half-{rpr}", group="latency", op="produce", records_per_request=rpr,
                        label=f"latency at half max load, {rpr}/req, quorum", in_flight="half",
                        max_of=f"produce-{rpr}-unkeyed-quorum", metric="latency"))
    return out


def all_cases() -> list[Case]:
    return [
        *produce_cases(),
        *latency_cases(),
        Case(id="consume-fetch", group="consume", label="consume from offset 0 (fetch)", op="consume"),
        Case(id="consume-group", group="consume", label="consume from offset 0 (group poll, ring only)",
             op="consume_group", peers=False),
        Case(id="e2e", group="e2e", label=f"end-to-end, produce to long-poll delivery, {E2E_RATE_PER_S} rec/s",
             op="e2e", metric="latency"),
    ]


def select(groups: list[str], cases: list[Case] | None = None) -> list[Case]:
    """Cases whose group or id is named (``produce``, ``produce-1-unkeyed-quorum``, ...).
    A half-load case also needs the case its rate comes from; it is added."""
    cases = all_cases() if cases is None else cases
    by_id = {c.id: c for c in cases}
    unknown = [g for g in groups if g not in GROUPS and g not in by_id]
    if unknown:
        raise ValueError(f"unknown cases: {', '.join(unknown)} (groups: {', '.join(GROUPS)})")
    chosen = {c.id for c in cases if c.group in groups or c.id in groups}
    for c in cases:
        if c.id in chosen and c.max_of:
            chosen.add(c.max_of)
    return [c for c in cases if c.id in chosen]  # in definition order: a max comes before its half


def plan(cases: list[Case], systems: list[str], reps: int) -> list[tuple[Case, int, str]]:
    """(case, repetition, system) in run order: per case, repetitions of
    ring then each peer."""
    out = []
    for case in cases:
        who = [s for s in systems if s == "ring" or case.peers]
        for rep in range(reps):
            for s in who:
                out.append((case, rep, s))
    return out


def parse_peers(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["none"] or not names:
        return []
    bad = [p for p in names if p not in PEERS]
    if bad:
        raise ValueError(f"unknown peers: {', '.join(bad)} (choose from {', '.join(PEERS)} or none)")
    return list(dict.fromkeys(names))
