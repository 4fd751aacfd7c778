"""What each broker gossips about its partitions, and who leads a partition as far as gossip tells.

Every broker puts three small maps in the ``extra`` of its gossip entry:

* ``leads``: the partitions it leads and the epoch of each;
* ``behind``: the partitions it holds that came back from an unclean shutdown
  and have not caught up with a leader yet: they are not elected before they
  have;
* ``removed``: brokers it has taken off the ring (decommissioned, or down
  longer than the grace period), ``{name: generation}``; a broker is removed
  while any live broker lists its current generation (a later restart of it
  joins afresh).

(Beside them, ``clock`` carries the broker's judgement of its own clock,
``ring.gossip.clocks.to_gossip``.)

Both partition maps are packed the same way: keys ``@0``, ``@1`` ... (no
topic is named with an ``@``), each a string of at most
``GOSSIP_STRING_BYTES_MAX`` bytes of space-separated tokens, where ``@topic``
starts a topic and each ``p.epoch`` (``leads``) or ``p`` (``behind``) after
it names one of its partitions; a topic whose partitions do not fit goes on
in the next key, named again. A gossiped map holds at most
``GOSSIP_MAP_KEYS_MAX`` keys, so the claims of a broker fit in 256 strings of
4 KiB, some 100,000 partitions led; one key per topic would have left every
topic past the 256th unclaimed, and its followers would have deposed its
leader again and again.

``leader_from_claims`` picks, among live brokers claiming a partition, the
one with the newest epoch. Decoding never raises: a peer's malformed entry
is skipped (it is only a hint; replicas learn their leader from the leader).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ring import limits

Key = tuple[str, int]


MARK = "@"  # starts a topic's name in a packed string, and every key (TOPIC_NAME_PATTERN has no "@")


def _pack(per_topic: Mapping[str, list[str]]) -> dict[str, str]:
    """``{"@0": "@topic item item @topic2 item", "@1": ...}``, each string within the gossip limit."""
    budget = limits.GOSSIP_STRING_BYTES_MAX
    out: dict[str, str] = {}
    part: list[str] = []
    size, part_topic = 0, ""
    for topic in sorted(per_topic):
        head = MARK + topic
        for item in per_topic[topic]:
            need = len(item) + 1 + (0 if part and part_topic == topic else len(head) + 1)
            if part and size + need > budget:
                out[f"{MARK}{len(out)}"] = " ".join(part)
                if len(out) >= limits.GOSSIP_MAP_KEYS_MAX:
                    return out  # the rest goes unsaid (far beyond what a broker leads)
                part, size = [], 0
            if not part or part_topic != topic:
                part.append(head)
                size += len(head) + 1
                part_topic = topic
            part.append(item)
            size += len(item) + 1
    if part:
        out[f"{MARK}{len(out)}"] = " ".join(part)
    return out


def _unpack(doc: Any) -> Iterable[tuple[str, str]]:
    """(topic, item) of every item in a packed map; anything malformed is skipped."""
    if not isinstance(doc, dict):
        return
    for key, text in doc.items():
        if not isinstance(key, str) or not key.startswith(MARK) or not isinstance(text, str):
            continue
        topic = None
        for token in text.split():
            if token.startswith(MARK):
                topic = token[1:] or None
            elif topic is not None:
                yield topic, token


def encode_leads(leads: Mapping[Key, int]) -> dict[str, str]:
    per: dict[str, list[str]] = {}
    for (t, p), e in sorted(leads.items()):
        per.setdefault(t, []).append(f"{p}.{e}")
    return _pack(per)


def encode_partitions(keys: Iterable[Key]) -> dict[str, str]:
    per: dict[str, list[str]] = {}
    for t, p in sorted(keys):
        per.setdefault(t, []).append(str(p))
    return _pack(per)


def decode_leads(doc: Any) -> dict[Key, int]:
    out: dict[Key, int] = {}
    for topic, item in _unpack(doc):
        p, _, e = item.partition(".")
        if p.isdigit() and e.isdigit():
            out[(topic, int(p))] = int(e)
    return out


def decode_partitions(doc: Any) -> set[Key]:
    return {(topic, int(item)) for topic, item in _unpack(doc) if item.isdigit()}


def decode_removed(doc: Any) -> dict[str, int]:
    if not isinstance(doc, dict):
        return {}
    return {n: g for n, g in doc.items() if isinstance(n, str) and type(g) is int}


def decode_decommissioned(doc: Any) -> dict[str, str]:
    """A broker's decommissions: {name: the incarnation of the data directory it was decommissioned on}."""
    if not isinstance(doc, dict):
        return {}
    return {n: i for n, i in doc.items() if isinstance(n, str) and isinstance(i, str)}


def leader_from_claims(claims: Mapping[str, Mapping[Key, int]], key: Key,
                       alive: Callable[[str], bool]) -> tuple[str, int] | None:
    """(broker, epoch) of the live broker claiming ``key`` at the newest epoch; None if nobody does."""
    best: tuple[str, int] | None = None
    for broker in sorted(claims):
        epoch = claims[broker].get(key)
        if epoch is not None and alive(broker) and (best is None or epoch > best[1]):
            best = (broker, epoch)
    return best
