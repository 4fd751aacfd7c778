"""An operator's one-shot unclean election of one partition (``POST .../unclean-election``).

A partition whose only voters holding what was acknowledged are gone stays
without a leader (``no_eligible_leader``) unless its topic allows unclean
elections. An operator who would rather have it writable again, losing what
only those voters held, asks any broker: it tells every live broker holding
a replica of the partition (``POST /peer/v1/unclean``) to stand counting the
votes of voters that lost their state, once (``election.UNCLEAN``), and
answers when a leader is elected, with the partition as its holder
describes it (``unclean_elections`` names the offset from which records
were lost). A partition that has a leader is refused (409): no election is
needed, and none is forced.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ring import limits
from ring.catalog import validate_topic_name
from ring.errors import Conflict, RingError, Unavailable
from ring.node import ready as msg


DESCRIBE_RETRY_S = 0.2  # between asks of the winner for its description of the partition


class ElectionNotNeeded(Conflict):
    code = "election_not_needed"


async def unclean_election(broker: Any, topic: str, partition: int) -> dict[str, Any]:
    """Ask the partition's live replicas for one unclean election; the partition once it has a leader."""
    broker.check_joined()
    cfg = broker.catalog.get(validate_topic_name(topic))
    cfg.check_partition(partition)
    leader = broker.leader_of(topic, partition)
    if leader is not None:
        raise ElectionNotNeeded(f"{topic}/{partition} has a leader ({leader}): no election is needed",
                                topic=topic, partition=partition, leader=leader)
    rep = broker.replica(topic, partition)
    holders = list(dict.fromkeys(broker.preference_list(cfg, partition) + (rep.voters if rep is not None else [])))
    asked = []
    if broker.name in holders and rep is not None and rep.leader is None:
        broker.step(msg.UncleanElection(rep))
        asked.append(broker.name)
    others = [name for name in holders if name != broker.name]
    params = {"topic": topic, "partition": str(partition)}
    answers = await asyncio.gather(*(broker.peers.call(name, "/peer/v1/unclean", params=params,
                                                       timeout_s=limits.VOTE_REQUEST_TIMEOUT_S) for name in others))
    asked += [name for name, answer in zip(others, answers) if answer is not None]
    if not asked:
        raise Unavailable(f"no live broker holding a replica of {topic}/{partition} could be asked to stand",
                          topic=topic, partition=partition, replicas=holders)
    deadline = broker.clock.monotonic() + limits.UNCLEAN_ELECTION_WAIT_S
    while (leader := broker.leader_of(topic, partition)) is None:
        remaining = deadline - broker.clock.monotonic()
        if remaining <= 0:
            raise Unavailable(f"no replica of {topic}/{partition} was elected within "
                              f"{limits.UNCLEAN_ELECTION_WAIT_S:g} s (asked: {', '.join(asked)}); the asked "
                              "replicas go on standing until one wins or they restart",
                              topic=topic, partition=partition, asked=asked)
        await broker.pump.changed(min(remaining, limits.ELECTION_TICK_MS / 1000))
    # The winner's description of the partition: it holds the record of what was lost. A winner just
    # elected may not answer at once (a busy loop, a connection being made): asked again until the
    # deadline, and only then this broker's own view of the partition.
    url = broker.membership.client_url(leader) if leader != broker.name else None
    doc = None
    while url is not None and doc is None:
        try:
            doc = (await broker.peers.json("GET", url, f"/v1/topics/{topic}"))["partitions"][partition]
        except (RingError, KeyError, IndexError, TypeError):
            if broker.clock.monotonic() >= deadline:
                break
            await broker.clock.sleep(DESCRIBE_RETRY_S)
    if doc is None:
        doc = broker.describe_topic(topic)["partitions"][partition]
    return {"topic": topic, "partition": partition, "leader": leader, "asked": asked, "state": doc}
