"""What each broker gossips about its partitions, and who leads a partition as far as gossip tells.

Every broker puts three small maps in the ``extra`` of its gossip entry:

* ``leads``: the partitions it leads and the epoch of each, as
  ``{topic: "p.epoch p.epoch ..."}`` (strings, since a gossiped list holds at
  most ``GOSSIP_MAP_KEYS_MAX`` items; a long topic spills into keys
  ``topic~1``, ``topic~2`` ...);
* ``behind``: the partitions it holds that came back from an unclean shutdown
  and have not caught up with a leader yet, as ``{topic: "p p ..."}``: they
  are not elected before they have;
* ``removed``: brokers it has taken off the ring (decommissioned, or down
  longer than the grace period), ``{name: generation}``; a broker is removed
  while any live broker lists its current generation (a later restart of it
  joins afresh).

``leader_from_claims`` picks, among live brokers claiming a partition, the
one with the newest epoch. Decoding never raises: a peer's malformed entry
is skipped (it is only a hint; replicas learn their leader from the leader).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ring import limits

Key = tuple[str, int]
SPILL = "~"


def _chunks(topic: str, items: list[str]) -> Iterable[tuple[str, str]]:
    budget = limits.GOSSIP_STRING_BYTES_MAX - 16
    part, size, n = [], 0, 0
    for item in items:
        if part and size + len(item) + 1 > budget:
            yield (topic if n == 0 else f"{topic}{SPILL}{n}"), " ".join(part)
            part, size, n = [], 0, n + 1
        part.append(item)
        size += len(item) + 1
    if part:
        yield (topic if n == 0 else f"{topic}{SPILL}{n}"), " ".join(part)


def _encode(per_topic: Mapping[str, list[str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for topic in sorted(per_topic):
        for key, text in _chunks(topic, per_topic[topic]):
            if len(out) >= limits.GOSSIP_MAP_KEYS_MAX:
                return out  # the rest goes unsaid: replicas and not_leader answers still tell
            out[key] = text
    return out


def encode_leads(leads: Mapping[Key, int]) -> dict[str, str]:
    per: dict[str, list[str]] = {}
    for (t, p), e in sorted(leads.items()):
        per.setdefault(t, []).append(f"{p}.{e}")
    return _encode(per)


def encode_partitions(keys: Iterable[Key]) -> dict[str, str]:
    per: dict[str, list[str]] = {}
    for t, p in sorted(keys):
        per.setdefault(t, []).append(str(p))
    return _encode(per)


def _topic_of(key: str) -> str:
    base, sep, n = key.rpartition(SPILL)
    return base if sep and n.isdigit() else key


def decode_leads(doc: Any) -> dict[Key, int]:
    out: dict[Key, int] = {}
    if not isinstance(doc, dict):
        return out
    for key, text in doc.items():
        if not isinstance(key, str) or not isinstance(text, str):
            continue
        topic = _topic_of(key)
        for item in text.split():
            p, _, e = item.partition(".")
            if p.isdigit() and e.isdigit():
                out[(topic, int(p))] = int(e)
    return out


def decode_partitions(doc: Any) -> set[Key]:
    out: set[Key] = set()
    if not isinstance(doc, dict):
        return out
    for key, text in doc.items():
        if isinstance(key, str) and isinstance(text, str):
            topic = _topic_of(key)
            out.update((topic, int(p)) for p in text.split() if p.isdigit())
    return out


def decode_removed(doc: Any) -> dict[str, int]:
    if not isinstance(doc, dict):
        return {}
    return {n: g for n, g in doc.items() if isinstance(n, str) and type(g) is int}


def leader_from_claims(claims: Mapping[str, Mapping[Key, int]], key: Key,
                       alive: Callable[[str], bool]) -> tuple[str, int] | None:
    """(broker, epoch) of the live broker claiming ``key`` at the newest epoch; None if nobody does."""
    best: tuple[str, int] | None = None
    for broker in sorted(claims):
        epoch = claims[broker].get(key)
        if epoch is not None and alive(broker) and (best is None or epoch > best[1]):
            best = (broker, epoch)
    return best
