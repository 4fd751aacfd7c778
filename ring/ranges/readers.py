"""Which holder a reader asks first for each range, so a backlog's bytes spread over the cluster (pure).

A range has ``copies`` holders; a reader that always asked the first would
load some brokers with far more of a backlog than others. ``spread`` walks
the ranges in order and gives each to the holder with the fewest bytes
given so far (ties by name), then lists its other holders after it: with
three holders to choose from, a partition's ranges end up within about one
range of an even share per broker. The Python client and sparkio's planner
use it on the ``GET .../ranges`` answer.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def spread(ranges: Iterable[Mapping[str, Any]], given: dict[str, int] | None = None) -> list[tuple[int, int, list[str]]]:
    """(base, end, holders best first) of each range of a ``GET .../ranges`` answer, in order.

    ``given``: bytes already given to each broker (by other partitions), updated in place.
    """
    load = given if given is not None else {}
    out = []
    for r in ranges:
        holders = [h for h in r.get("holders") or [] if isinstance(h, str)]
        if not holders:
            continue
        first = min(holders, key=lambda h: (load.get(h, 0), h))
        load[first] = load.get(first, 0) + int(r.get("bytes") or 0)
        out.append((int(r["base_offset"]), int(r["end_offset"]), [first] + sorted(h for h in holders if h != first)))
    return out
