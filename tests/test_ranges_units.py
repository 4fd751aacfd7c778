"""Ranges' pure decisions and the holder's store, without brokers.

The catalogue's merge is checked as a merge must be (commutative,
associative on catalogues one leader history can make, idempotent, never
losing a newer change); placement against the ring's preference lists; the
leader's plan on hand-made logs; the store on real files, with a copy that
lies about its bytes and a bit flipped under a held range.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring.clock import ManualClock
from ring.errors import BadRequest, StorageError
from ring.hashing import Ring, broker_token
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.ranges import placement, plan
from ring.ranges.catalogue import Catalogue, Range
from ring.ranges.store import Meta, RangeStore, new_hash

SETTINGS = settings(max_examples=200, deadline=None)
SUM = "ab" * 20


def rng(base: int, end: int, holders: tuple[str, ...] = (), version: tuple[int, int] = (1, 1), copies: int = 3,
        size: int = 100, ts: int = 0) -> Range:
    return Range(base, end, size, SUM, ts, copies, tuple(sorted(holders)), version)


# -- the catalogue -----------------------------------------------------------------------------


def test_find_earliest_and_safe_through() -> None:
    cat = Catalogue(0, [rng(0, 10, ("a", "b", "c")), rng(10, 20, ("a", "b", "c")), rng(20, 30, ("a",))])
    assert cat.find(0).base == 0 and cat.find(19).base == 10 and cat.find(30) is None
    assert cat.safe_through(0) == 20 and cat.safe_through(12) == 20 and cat.safe_through(25) == 25
    assert cat.earliest(30) == 0 and cat.earliest(25) == 0 and cat.earliest(0) == 0
    assert cat.earliest(31) == 31  # a gap between the ranges and the local log: nothing below it is reachable
    cat.move_start(15)
    assert [r.base for r in cat.ranges] == [10, 20] and cat.earliest(30) == 15 and cat.find(12) is None


def test_merge_takes_newer_changes_and_the_larger_start() -> None:
    old = Catalogue(0, [rng(0, 10, ("a",), (1, 1)), rng(10, 20, ("a",), (1, 2))], 2)
    new = Catalogue(5, [rng(0, 10, ("a", "b"), (1, 3)), rng(20, 30, ("b",), (1, 4))], 4)
    m = old.merge(new)
    assert m.start == 5 and m.seq == 4
    assert [(r.base, r.holders) for r in m.ranges] == [(0, ("a", "b")), (10, ("a",)), (20, ("b",))]
    gone = Catalogue(10, [], 5).merge(m)
    assert [r.base for r in gone.ranges] == [10, 20]  # ranges wholly below the start go


def test_overlapping_cuts_keep_the_newer_leaders() -> None:
    a = Catalogue(0, [rng(0, 100, ("a",), (1, 5))], 5)
    b = Catalogue(0, [rng(0, 120, ("b",), (2, 6)), rng(120, 200, ("b",), (2, 7))], 7)
    assert a.merge(b) == b.merge(a)
    assert [(r.base, r.end) for r in a.merge(b).ranges] == [(0, 120), (120, 200)]


def catalogues() -> st.SearchStrategy[Catalogue]:
    """Catalogues of one partition as its leaders make them: cuts at boundaries of a shared log,
    each range changed by one leader at a time, versions unique per (epoch, seq)."""
    @st.composite
    def build(draw: st.DrawFn) -> Catalogue:
        cuts = sorted(set(draw(st.lists(st.sampled_from(range(0, 200, 10)), max_size=8))) | {0})
        start = draw(st.sampled_from([0, 10, 50]))
        out = []
        for base, end in zip(cuts, cuts[1:]):
            epoch = draw(st.integers(1, 3))
            holders = tuple(sorted(draw(st.sets(st.sampled_from("abcd"), max_size=3))))
            # One version is one change: the same version always names the same range.
            seq = ((base * 1000 + end) * 16 + sum(1 << "abcd".index(h) for h in holders)) * 4 + epoch
            out.append(Range(base, end, end - base, SUM, 0, 3, holders, (epoch, seq)))
        return Catalogue(0, out, 500).merge(Catalogue(start, [], 0))
    return build()


@SETTINGS
@given(catalogues(), catalogues(), catalogues())
def test_merge_is_commutative_idempotent_and_never_overlaps(a: Catalogue, b: Catalogue, c: Catalogue) -> None:
    assert a.merge(b) == b.merge(a)
    assert a.merge(a) == a
    ab = a.merge(b)
    assert ab.merge(b) == ab
    for x, y in zip(ab.ranges, ab.ranges[1:]):
        assert x.end <= y.base
    newest = max((r for r in (*a.ranges, *b.ranges) if r.end > ab.start), key=lambda r: r.version, default=None)
    if newest is not None:
        assert newest in ab.ranges  # the newest change is never lost
    abc = ab.merge(c)
    assert abc.start == max(a.start, b.start, c.start)


@SETTINGS
@given(catalogues())
def test_wire_round_trip(cat: Catalogue) -> None:
    assert Catalogue.loads(cat.dumps()) == cat


@pytest.mark.parametrize("bad", [
    [0, 0, [[0, 10, 5, "zz" * 20, 0, 3, [], 1, 1]]],  # not hex
    [0, 0, [[10, 10, 5, SUM, 0, 3, [], 1, 1]]],  # empty
    [0, 0, [[0, 10, 5, SUM, 0, 3, ["a", "a"], 1, 1]]],  # a holder twice
    [0, 0, [[0, 10, 5, SUM, 0, 3, [], 1, 1], [5, 20, 5, SUM, 0, 3, [], 1, 2]]],  # overlapping
    [-1, 0, []], "x", [0, 0],
])
def test_malformed_catalogues_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        Catalogue.from_wire(bad)


# -- placement ---------------------------------------------------------------------------------


def ring_of(n: int) -> Ring:
    return Ring((f"ring-{i}", broker_token(i)) for i in range(n))


def test_holders_follow_the_ring_and_pass_over_full_brokers() -> None:
    ring = ring_of(6)
    got = placement.holders(ring, "t", 0, 4096, 3)
    assert got == ring.preference_list(placement.range_token("t", 0, 4096), 3)
    full = {got[0]}
    skipped = placement.holders(ring, "t", 0, 4096, 3, full=full)
    assert got[0] not in skipped and skipped[:2] == got[1:]
    assert placement.holders(ring, "t", 0, 4096, 3, full=full, keep=full) == got  # a full holder keeps its copy
    assert placement.holders(ring_of(2), "t", 0, 0, 3) == placement.holders(ring_of(2), "t", 0, 0, 2)


def test_ranges_of_one_partition_spread_over_every_broker() -> None:
    ring = ring_of(6)
    counts = {name: 0 for _, name in ring.brokers}
    for i in range(600):
        for h in placement.holders(ring, "t", 0, i * 1000, 3):
            counts[h] += 1
    mean = sum(counts.values()) / len(counts)
    assert all(0.8 * mean <= n <= 1.2 * mean for n in counts.values()), counts


# -- the leader's plan ---------------------------------------------------------------------------


def seg(base: int, end: int, size: int = 100, ts: int = 0) -> plan.SegmentInfo:
    return plan.SegmentInfo(base, end, size, ts)


def test_next_ranges_follow_the_catalogue_and_stop_at_the_high_watermark() -> None:
    closed = [seg(0, 10), seg(10, 25), seg(25, 40)]
    assert plan.next_ranges(Catalogue(), closed, 0, 30, 10) == [(0, 10, 0), (10, 25, 0)]
    cat = Catalogue(0, [rng(0, 7)])  # another leader cut at 7: the next range starts there
    assert plan.next_ranges(cat, closed, 0, 100, 10) == [(7, 10, 0), (10, 25, 0), (25, 40, 0)]
    assert plan.next_ranges(cat, closed, 0, 100, 1) == [(7, 10, 0)]


def test_holder_changes_copy_first_then_let_go() -> None:
    r = rng(0, 10, ("a", "b", "x"))
    assert plan.holder_changes(r, ["a", "b", "c"], {"a", "b", "c", "x"}) == (["c"], [])
    assert plan.holder_changes(r, ["a", "b", "x"], {"a", "b", "c", "x"}) == ([], [])
    r2 = rng(0, 10, ("a", "b", "c", "x"))
    assert plan.holder_changes(r2, ["a", "b", "c"], {"a", "b", "c", "x"}) == ([], ["x"])
    assert plan.holder_changes(r, ["a", "b", "c"], {"a", "b", "c"}) == (["c"], ["x"])  # off the ring: at once


class _Owner:
    """What ``Audit`` uses of the ranges (``AuditOwner``), for a leader whose catalogue is ``cat`` and
    whose peers hold ``held`` (broker -> base -> (end, checksum)); it records what it tells them."""

    def __init__(self, cat: Catalogue, held: dict[str, dict[int, tuple[int, str]]]) -> None:
        import types

        self.cat, self.held, self.let = cat, held, []
        names = sorted(held)
        ring = types.SimpleNamespace(brokers=[(i, n) for i, n in enumerate(names)])
        membership = types.SimpleNamespace(ring=ring, alive=lambda n: True)
        self.host = types.SimpleNamespace(name="leader", membership=membership)
        self.copier = types.SimpleNamespace(in_flight=lambda key, base, name: False)

    def catalogue(self, rep: object) -> Catalogue:
        return self.cat

    def still_leads(self, rep: object, epoch: int) -> bool:
        return True

    def tell(self, *args: object) -> None:
        return None

    def let_go(self, rep: object, holder: str, base: int) -> None:
        self.let.append((holder, base))

    async def peer(self, method: str, name: str, path: str, **kw: object) -> bytes:
        import orjson

        return orjson.dumps([[b, e, c] for b, (e, c) in self.held[name].items()])


async def audit(cat: Catalogue, held: dict[str, dict[int, tuple[int, str]]]) -> _Owner:
    import types

    from ring.ranges.audit import Audit

    owner = _Owner(cat, held)
    await Audit(owner).audit(types.SimpleNamespace(topic="t", index=3, epoch=3))  # type: ignore[arg-type]
    return owner


async def test_a_new_leaders_audit_keeps_copies_of_a_range_its_catalogue_has_not_heard_of() -> None:
    # An isolated leader comes back and leads again before the catalogue exchange of its term: the
    # range 53-106 the interim leader cut and copied to a, b and c is not in its catalogue yet, and
    # those three copies are the only ones (the interim leader's log was trimmed below 106).
    cat = Catalogue(0, [rng(0, 53, ("a", "b", "c"))])
    held = {n: {0: (53, SUM), 53: (106, SUM)} for n in "abc"}
    owner = await audit(cat, held)
    assert owner.let == [] and [r.holders for r in cat.ranges] == [("a", "b", "c")]


async def test_an_audit_lets_go_of_copies_safe_elsewhere_and_adopts_sound_copies_of_short_ranges() -> None:
    cat = Catalogue(60, [rng(0, 100, ("a", "b", "c")), rng(100, 200, ("a",), copies=2), rng(200, 300, ("a", "b"))])
    held = {"a": {0: (100, SUM), 100: (200, SUM), 200: (300, SUM)},
            "b": {0: (100, SUM), 100: (200, SUM), 200: (300, SUM)},
            "c": {0: (100, SUM), 10: (50, SUM)},  # an older cut below the start
            "d": {0: (100, SUM), 100: (200, "cd" * 20), 200: (300, SUM), 300: (400, SUM)}}
    owner = await audit(cat, held)
    # b's sound copy of 100-200 and d's of 200-300 make them holders of ranges short of holders. d's
    # copy of 0-100 is one too many, its 100-200 differs from the range's (safe with a and b by then),
    # and its 300-400 is in no range: kept, as the catalogue may not have heard of it yet. c's older cut
    # lies wholly below the start.
    assert sorted(owner.let) == [("c", 10), ("d", 0), ("d", 100)]
    assert [r.holders for r in cat.ranges] == [("a", "b", "c"), ("a", "b"), ("a", "b", "d")]


async def test_an_audit_takes_a_spoiled_copy_out_of_the_holders() -> None:
    cat = Catalogue(0, [rng(0, 100, ("a", "b", "c"))])
    owner = await audit(cat, {"a": {0: (100, SUM)}, "b": {0: (100, "cd" * 20)}, "c": {}})
    assert owner.let == [] and [r.holders for r in cat.ranges] == [("a",)]


def test_trim_point_keeps_the_tail_and_stays_below_what_is_safe() -> None:
    closed = [seg(0, 10), seg(10, 20), seg(20, 30)]
    assert plan.trim_point(closed, 400, -1, 30) is None
    assert plan.trim_point(closed, 400, 0, 30) == 30
    assert plan.trim_point(closed, 400, 0, 25) == 20
    assert plan.trim_point(closed, 400, 250, 30) == 10  # 100 bytes of closed segments, plus the active 100: 300 stay
    assert plan.trim_point(closed, 400, 1000, 30) is None


def test_retention_counts_the_ranges_below_the_local_log() -> None:
    cat = Catalogue(0, [rng(0, 10, size=100, ts=1), rng(10, 20, size=100, ts=2)])
    closed = [seg(20, 30, 100, 3), seg(30, 40, 100, 4)]
    # 200 bytes in ranges + 300 local: keep 250 by size -> the two ranges go
    assert plan.retention_start(cat, closed, 20, 300, 40, -1, 250, None) == 20
    assert plan.retention_start(cat, closed, 20, 300, 40, -1, 400, None) == 10
    assert plan.retention_start(cat, closed, 20, 300, 40, 5, -1, 9) == 30  # older than 5 ms at 9: ts 1, 2, 3
    assert plan.retention_start(cat, closed, 20, 300, 40, 5, -1, None) is None  # no clock: no age
    assert plan.retention_start(cat, closed, 20, 300, 25, -1, 0, None) == 20  # not past the high watermark


# -- the store ---------------------------------------------------------------------------------------


def log_bytes(tmp: Path, n: int = 30) -> tuple[bytes, int]:
    """A partition log's stored batches for offsets [0, n) (one record each)."""
    plog = PartitionLog(tmp / "log", LogConfig(segment_bytes=1 << 20, fsync=FsyncPolicy("never")), ManualClock())
    for i in range(n):
        plog.append(B.encode([(None, None, f"r{i}".encode(), None)], now_ms=1000 + i), 1)
    data = plog.read(0, 1 << 20)
    plog.close()
    return data, n


def meta_of(data: bytes, end: int) -> Meta:
    h = new_hash()
    h.update(data)
    return Meta(0, end, len(data), h.hexdigest(), 1000 + end - 1, 7)


def take(store: RangeStore, meta: Meta, data: bytes) -> None:
    inc = store.incoming(("t", 0), meta)
    inc.write(data)
    inc.finish()
    store.install(("t", 0), meta)


def test_a_copy_is_kept_only_whole_and_verified(tmp_path: Path) -> None:
    data, end = log_bytes(tmp_path)
    store = RangeStore(tmp_path / "ranges")
    store.open()
    meta = meta_of(data, end)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 1
    for wrong, m in ((bytes(bad), meta), (data, dataclasses.replace(meta, end=end + 1))):
        inc = store.incoming(("t", 0), m)
        inc.write(wrong)
        with pytest.raises(BadRequest):
            inc.finish()
    assert store.get(("t", 0), 0) is None and not list((tmp_path / "ranges" / "t" / "0").glob("*.part"))
    take(store, meta, data)
    got = store.read(("t", 0), 12, 1 << 20)
    assert [r.offset for _, rs in [B.decode(got, p) for _, p in B.scan(got)] for r in rs] == list(range(12, end))
    assert store.first_offset_at(("t", 0), 0, 1010) == 10
    store.close()
    again = RangeStore(tmp_path / "ranges")  # reopened: the range is still there, whole
    again.open()
    assert again.get(("t", 0), 0) == meta and again.scrub(("t", 0), 0)


def test_a_flipped_bit_is_found_by_a_read_and_by_a_scrub(tmp_path: Path) -> None:
    data, end = log_bytes(tmp_path)
    store = RangeStore(tmp_path / "ranges")
    store.open()
    meta = meta_of(data, end)
    take(store, meta, data)
    path = next((tmp_path / "ranges" / "t" / "0").glob("*.log"))
    fd = os.open(path, os.O_RDWR)
    byte = os.pread(fd, 1, len(data) - 3)
    os.pwrite(fd, bytes([byte[0] ^ 0x10]), len(data) - 3)
    os.close(fd)
    assert not store.scrub(("t", 0), 0)
    with pytest.raises(StorageError):
        store.read(("t", 0), end - 1, 1 << 20)
    assert store.get(("t", 0), 0) is None and store.dropped == 1  # dropped: its leader copies it again


def test_nothing_below_the_partitions_start_is_served_and_the_start_is_kept(tmp_path: Path) -> None:
    data, end = log_bytes(tmp_path)
    store = RangeStore(tmp_path / "ranges")
    store.open()
    take(store, meta_of(data, end), data)
    store.set_start(("t", 0), 12)
    assert store.read(("t", 0), 11, 1 << 20) is None and store.read(("t", 0), 12, 1 << 20)
    store.set_start(("t", 0), 5)  # never back
    assert store.start(("t", 0)) == 12
    store.close()
    again = RangeStore(tmp_path / "ranges")
    again.open()
    assert again.start(("t", 0)) == 12 and again.read(("t", 0), 11, 1 << 20) is None
    again.set_start(("t", 0), end)  # past the whole range: it goes
    assert again.get(("t", 0), 0) is None


# -- readers: where a backlog is read from ---------------------------------------------------------


def test_spread_gives_each_range_to_the_holder_with_the_fewest_bytes_so_far() -> None:
    from ring.ranges.readers import spread

    ranges = [{"base_offset": i * 10, "end_offset": i * 10 + 10, "bytes": 100,
               "holders": sorted({f"b{i % 6}", f"b{(i + 1) % 6}", f"b{(i + 2) % 6}"})} for i in range(60)]
    got = spread(ranges)
    firsts = [h[0] for _, _, h in got]
    counts = {b: firsts.count(b) for b in set(firsts)}
    assert len(counts) == 6 and max(counts.values()) - min(counts.values()) <= 1, counts
    assert all(sorted(h) == r["holders"] for (_, _, h), r in zip(got, ranges))
    assert spread([{"base_offset": 0, "end_offset": 5, "bytes": 1, "holders": []}]) == []  # nobody to ask yet


def test_splits_are_cut_at_range_boundaries_with_the_holders_first() -> None:
    from sparkio.holders import _cut
    from sparkio.ranges import OffsetRange

    r = OffsetRange("t", 0, 5, 40, ("http://replica",))
    held = [(0, 10, ["a", "b"]), (10, 20, ["c"]), (25, 30, ["a"])]
    urls = {"a": "http://a", "b": "http://b", "c": "http://c"}
    got = [(s.start, s.end, s.urls) for s in _cut(r, held, urls)]
    assert got == [(5, 10, ("http://a", "http://b", "http://replica")), (10, 20, ("http://c", "http://replica")),
                   (20, 25, ("http://replica",)), (25, 30, ("http://a", "http://replica")),
                   (30, 40, ("http://replica",))]
