"""Vote requests to one peer travel together: the node core's driver sends the vote requests of one
event-loop turn to a peer ``VOTES_PER_MESSAGE_MAX`` to a message (``POST /peer/v1/votes``) and steps
each message's answers back in one ``VoteAnswered`` (ring.cluster.pump.NodePump), so a broker that
lost the leader of hundreds of partitions asks each voter in a few messages. The voter here is a
real broker of a running cluster."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import msgpack

from ring import limits
from ring.clock import SystemClock
from ring.cluster.peers import PeerClient
from ring.cluster.pump import NodePump
from ring.node.ready import Ready, VoteAnswered
from ring.replication import election


class _Core:
    """The node core as the driver sees it when stepping answers: it records what it is given."""

    def __init__(self) -> None:
        self.stepped: list[Any] = []

    def step(self, now: float, message: Any) -> Ready:
        self.stepped.append(message)
        return Ready()


def _pre_votes(count: int) -> list[election.VoteRequest]:
    # Pre-votes for partitions the voter does not hold: it answers not_a_voter and saves nothing.
    return [election.VoteRequest("no-such-topic", p, 7, "ring-x", 0, 0, True) for p in range(count)]


async def test_the_vote_requests_of_a_loop_turn_go_to_a_peer_together(shared_cluster) -> None:
    voter = shared_cluster[1]
    peers = PeerClient("ring-x", shared_cluster.secret,
                       peer_url=lambda name: f"http://{voter.local.host}:{voter.peer_port}")
    core = _Core()
    pump = NodePump(core, SystemClock(), peers)  # type: ignore[arg-type]  # stepping answers uses only step
    reqs = _pre_votes(2 * limits.VOTES_PER_MESSAGE_MAX + 44)
    try:
        half = len(reqs) // 2
        for part in (reqs[:half], reqs[half:]):  # two Readies of one loop turn
            ready = Ready()
            ready.sends = [(voter.name, r) for r in part]
            pump.carry_out(ready)

        def answered() -> int:
            return sum(len(m.answers) for m in core.stepped)

        deadline = asyncio.get_running_loop().time() + 20.0
        while answered() < len(reqs) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await pump.close()
        await peers.close()
    assert len(core.stepped) == math.ceil(len(reqs) / limits.VOTES_PER_MESSAGE_MAX)
    assert all(isinstance(m, VoteAnswered) and m.peer == voter.name for m in core.stepped)
    # Each message's answers come in its requests' order; the messages themselves may be answered in any
    # order (they go out together), each a run of the turn's requests.
    runs = sorted(([req for req, _ in m.answers] for m in core.stepped), key=lambda run: reqs.index(run[0]))
    assert [req for run in runs for req in run] == reqs
    pairs = [pair for m in core.stepped for pair in m.answers]
    for req, reply in pairs:
        assert reply is not None and (reply.topic, reply.partition) == (req.topic, req.partition)
        assert not reply.granted and reply.reason == election.NOT_A_VOTER


def test_a_votes_message_over_the_limit_or_with_a_malformed_request_is_refused(shared_cluster) -> None:
    voter = shared_cluster[1]
    wires = [r.to_wire() for r in _pre_votes(limits.VOTES_PER_MESSAGE_MAX + 1)]
    bad = [*wires[:3], ["vote", "t", -1, 1, "ring-x", 0, 0, 0]]
    for body in (wires, [], bad, {"vote": 1}):
        r = voter.peer.post("/peer/v1/votes", body=msgpack.packb(body), headers=voter.auth)
        assert r.status == 400, (len(body), r.status)
        assert r.json()["error"] == "bad_request"
    r = voter.peer.post("/peer/v1/votes", body=msgpack.packb(wires[:2]), headers=voter.auth)
    assert r.status == 200
    assert [election.reply_from_wire(w).partition for w in msgpack.unpackb(r.body)] == [0, 1]
