"""``ring cluster status``: the brokers as the cluster sees them.

One ``GET /v1/cluster`` through the client (a standalone broker shows as a
cluster of one): per broker its status (up, suspect, down, joining, leaving),
the failure detector's phi, ring token, partitions led, replicas held, disk
used and client URL; the broker that answered is marked. The command exits 0
whenever a broker answered, whatever the statuses say: scripts read them
from ``--json``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from ring.commands.base import EXIT_OK, Context, add_command, add_group, table
from ring.commands.positions import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    cluster = add_group(sub, "cluster", help="the cluster's brokers", description="The cluster's brokers.")
    add_command(cluster, "status", status, help="brokers, their status, load and addresses",
                description="Every broker the cluster knows, with status, phi, token, load and address.")


def _phi(value: Any) -> str | None:
    return f"{value:.1f}" if isinstance(value, (int, float)) else None


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
        rows.append((name, b.get("status"), _phi(b.get("phi")), load.get("partitions_led"), load.get("replicas"),
                     format_bytes(load["disk_bytes"]) if isinstance(load.get("disk_bytes"), int) else None,
                     b.get("token"), b.get("client_url")))
    ctx.say(table(["BROKER", "STATUS", "PHI", "LEADS", "REPLICAS", "DISK", "TOKEN", "CLIENT URL"], rows))
    return EXIT_OK
