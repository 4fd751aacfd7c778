"""``ring cluster status``: the brokers as the cluster sees them.

One ``GET /v1/cluster`` through the client (a standalone broker shows as a
cluster of one): per broker its status (up, suspect, down, joining, leaving),
the failure detector's phi, its clock as it judges it against its peers'
(ok, warning or OUT with its offset, unknown), ring token, partitions led,
replicas held, disk used by its partition logs and by the ranges it holds
for other brokers' partitions (``ring.ranges``), its free disk (``full``
below its floor: it takes no new range), and client URL; the broker that
answered is marked, and a broker whose clock is off, or that is full, is
named below the table. The command exits 0
whenever a broker answered, whatever the statuses say: scripts read them
from ``--json``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from ring.commands.base import EXIT_OK, Context, add_command, add_group, table
from ring.commands.positions import format_bytes
from ring.gossip.clocks import describe_ms


def register(sub: argparse._SubParsersAction) -> None:
    cluster = add_group(sub, "cluster", help="the cluster's brokers", description="The cluster's brokers.")
    add_command(cluster, "status", status, help="brokers, their status, load and addresses",
                description="Every broker the cluster knows, with status, phi, token, load and address.")


def _phi(value: Any) -> str | None:
    return f"{value:.1f}" if isinstance(value, (int, float)) else None


def _clock(value: Any) -> str | None:
    """A broker's clock as it judges it: ``ok``, ``warning 1.2 s ahead``, ``OUT 8.0 d ahead``."""
    if not isinstance(value, dict) or not isinstance(value.get("state"), str):
        return None
    state, offset = value["state"], value.get("offset_ms")
    label = {"out_of_bounds": "OUT"}.get(state, state)
    if state in ("ok", "unknown") or not isinstance(offset, (int, float)):
        return label
    return f"{label} {describe_ms(offset)}"


def status(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.client() as client:
        doc = client.cluster()
    if ctx.json:
        ctx.emit(doc)
        return EXIT_OK
    brokers = sorted(doc.get("brokers") or [], key=lambda b: str(b.get("name")))
    counts = Counter(str(b.get("status")) for b in brokers)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    mode = " (standalone)" if doc.get("standalone") else ""
    ctx.say(f"{len(brokers)} broker{'s' if len(brokers) != 1 else ''}{mode}: {summary}; "
            f"answered by {doc.get('self')}")
    rows = []
    for b in brokers:
        load = b.get("load") or {}
        name = str(b.get("name")) + (" *" if b.get("name") == doc.get("self") else "")
        free = _bytes(load.get("disk_free_bytes"))
        rows.append((name, b.get("status"), _phi(b.get("phi")), _clock(b.get("clock")), load.get("partitions_led"),
                     load.get("replicas"), _bytes(load.get("disk_bytes")), _bytes(load.get("range_bytes")),
                     f"{free} full" if load.get("ranges_full") and free else free, b.get("token"), b.get("client_url")))
    ctx.say(table(["BROKER", "STATUS", "PHI", "CLOCK", "LEADS", "REPLICAS", "DISK", "RANGES", "FREE", "TOKEN",
                   "CLIENT URL"], rows))
    for b in brokers:
        clock = b.get("clock") if isinstance(b.get("clock"), dict) else {}
        offset = clock.get("offset_ms")
        off = f"{describe_ms(offset)} of the cluster's" if isinstance(offset, (int, float)) else "not measured"
        if clock.get("state") == "out_of_bounds":
            ctx.say(f"{b.get('name')}: clock out of bounds ({off}): it leads no partition, stamps no record and "
                    "applies no time-based retention until it is back within bounds")
        elif clock.get("state") == "warning":
            ctx.say(f"{b.get('name')}: clock warning ({off}; still within the hard bound)")
        if (b.get("load") or {}).get("ranges_full"):
            ctx.say(f"{b.get('name')}: free disk below its floor (--disk-free-min-bytes): it takes no new range; "
                    "the partitions it holds still take appends")
    return EXIT_OK


def _bytes(value: Any) -> str | None:
    return format_bytes(value) if isinstance(value, int) else None
