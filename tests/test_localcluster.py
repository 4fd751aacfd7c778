"""Ports for local brokers come from below the kernel's ephemeral range: a port taken from
that range may be given to an outgoing connection's local end before the broker binds it."""

from __future__ import annotations

import socket

from ring import localcluster


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = localcluster._ephemeral_low()
    ports = [localcluster.free_port() for _ in range(200)]
    assert all(localcluster.LISTEN_PORT_MIN <= p < low for p in ports), ports
    assert len(set(ports)) == len(ports), "a port was handed out twice"
    for p in ports[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_something_listens_on_is_not_handed_out(monkeypatch) -> None:
    with socket.socket() as taken, socket.socket() as other:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        other.bind(("127.0.0.1", 0))
        busy, free = taken.getsockname()[1], other.getsockname()[1]
        other.close()
        picks = iter([busy, busy, free])
        monkeypatch.setattr(localcluster, "_ephemeral_low", lambda: 65_536)
        monkeypatch.setattr(localcluster.random, "randrange", lambda lo, hi: next(picks))
        monkeypatch.setattr(localcluster, "_recent_ports", type(localcluster._recent_ports)(maxlen=16))
        assert localcluster.free_port() == free


def test_workers_given_slices_pick_ports_from_disjoint_parts_of_the_range(monkeypatch) -> None:
    low, high = localcluster.LISTEN_PORT_MIN, localcluster._ephemeral_low()
    picked = []
    for k in range(2):
        monkeypatch.setenv(localcluster.PORT_SLICE_ENV, f"{k}/2")
        picked.append({localcluster.free_port() for _ in range(100)})
    middle = low + (high - low) // 2
    assert all(low <= p < middle for p in picked[0]), picked[0]
    assert all(middle <= p < high for p in picked[1]), picked[1]


def test_a_slice_narrower_than_the_recent_ports_kept_still_picks_from_its_slice(monkeypatch) -> None:
    # One sixth of the range (ports 10,000 to 32,768) is under 4,096 ports wide: its ports must still
    # come from the slice, not from the kernel's ephemeral range.
    low, high = localcluster.LISTEN_PORT_MIN, localcluster._ephemeral_low()
    width = (high - low) // 6
    monkeypatch.setenv(localcluster.PORT_SLICE_ENV, "5/6")
    ports = [localcluster.free_port() for _ in range(100)]
    assert all(low + 5 * width <= p < low + 6 * width for p in ports), sorted(ports)[:5]
    assert len(set(ports)) == len(ports)
