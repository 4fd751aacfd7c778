"""The leader's links follow a change of a few partitions' leadership (``Links.reassign``) as a pass over
every partition would (``Links.assign``), without touching the other partitions' cursors."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ring.node.links import Links

KEYS = [("t", p) for p in range(6)]
FOLLOWERS = ["b", "c", "d"]

changes = st.lists(st.tuples(st.sampled_from(KEYS), st.lists(st.sampled_from(FOLLOWERS), unique=True)),
                   min_size=1, max_size=30)


def _state(links: Links) -> dict[str, set]:
    return {name: set(link.cursors) for name, link in links.links.items()}


def _wanted(led: dict) -> dict[str, set]:
    wanted: dict[str, set] = {}
    for key, names in led.items():
        for name in names:
            wanted.setdefault(name, set()).add(key)
    return wanted


@settings(max_examples=200, deadline=None)
@given(changes)
def test_reassigning_the_changed_partitions_gives_the_links_a_full_pass_gives(steps) -> None:
    full, part = Links("a", lambda t, p: None), Links("a", lambda t, p: None)
    led: dict = {}
    for i, (key, names) in enumerate(steps):
        now = float(i)
        before = set(part.links)
        led[key] = names
        full.assign(_wanted(led), now)
        assert part.reassign({key: names}, now) == (set(part.links) != before)
        assert _state(part) == _state(full)
        assert {k: set(v) for k, v in part._followers_of.items()} == \
            {k: set(v) for k, v in full._followers_of.items()}


def test_the_partitions_not_named_keep_their_cursors_unmarked() -> None:
    links = Links("a", lambda t, p: None)
    assert links.reassign({KEYS[0]: ["b", "c"], KEYS[1]: ["b"]}, 0.0) is True
    kept = links.links["b"].cursors[KEYS[1]]
    for link in links.links.values():
        link.ready.clear()
    assert links.reassign({KEYS[2]: ["b"], KEYS[0]: ["b"]}, 1.0) is True  # c follows nothing any more
    assert set(links.links) == {"b"}
    b = links.links["b"]
    assert b.cursors[KEYS[1]] is kept and KEYS[1] not in b.ready
    assert set(b.ready) == {KEYS[0], KEYS[2]}
    assert links.reassign({KEYS[1]: []}, 2.0) is False and set(b.cursors) == {KEYS[0], KEYS[2]}


def test_a_partition_dropped_while_its_probe_waits_does_not_hold_the_links_next_probe() -> None:
    """The driver ticks at ``next_probe``: one left in the past by a dropped partition would tick forever
    at the same moment (the simulation's seed 55 did, before flush forgot the dropped partition)."""
    links = Links("a", lambda t, p: None)
    links.reassign({KEYS[0]: ["b"], KEYS[1]: ["b"]}, 0.0)
    b = links.links["b"]
    b.connected = True
    b.ready.clear()
    links.dirty.clear()
    b.timed, b.probe_next = {KEYS[0]}, 0.5  # where a flush leaves a partition waiting for its probe
    links.reassign({KEYS[0]: []}, 1.0)
    links.due(1.0)
    links.flush(1.0, [])
    assert links.next_probe() is None


def test_a_link_whose_partition_moves_to_another_in_the_same_step_keeps_its_connection() -> None:
    """One partition stops going to ``b`` while another starts to, in one step: ``b``'s link is the same,
    still connected (a new one would never be told the connection is up, and nothing would go to ``b``)."""
    links = Links("a", lambda t, p: None)
    links.reassign({KEYS[0]: ["b"]}, 0.0)
    b = links.links["b"]
    b.up(0.5)
    assert links.reassign({KEYS[0]: [], KEYS[1]: ["b"]}, 1.0) is False
    assert links.links["b"] is b and b.connected and set(b.cursors) == {KEYS[1]}
