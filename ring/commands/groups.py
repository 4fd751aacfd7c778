"""``ring groups list|describe|reset|delete``: consumer groups, their members and lag.

``list`` is ``GET /v1/groups`` (every broker asked for the groups it
coordinates), ``describe`` is ``GET /v1/groups/{group}`` (members, their
assignment, and per partition the committed offset, high watermark and lag),
``reset`` is ``PUT /v1/groups/{group}/offsets/{topic}``: move the group's
committed offsets of a topic (all partitions or ``--partition``) to the
earliest or latest offset, an offset, or the first record at a time;
``delete`` is ``DELETE /v1/groups/{group}``: a group with no members goes,
with its committed offsets. Any broker relays a group request to the
group's coordinator.
"""

from __future__ import annotations

import argparse
from typing import Any

from ring.commands.base import EXIT_OK, Context, UsageError, add_command, add_group, quote, table
from ring.commands.positions import parse_position


def register(sub: argparse._SubParsersAction) -> None:
    groups = add_group(sub, "groups", help="consumer groups: list, describe, reset offsets, delete",
                       description="Consumer groups: members, committed offsets, lag; reset offsets; delete.")
    add_command(groups, "list", list_, help="every group with its state, members and total lag",
                description="Every consumer group of the cluster.")
    p = add_command(groups, "describe", describe, help="members, assignment and lag per partition",
                    description="A group's members and, per partition, committed offset, high watermark "
                                "and lag.")
    p.add_argument("group")
    p = add_command(groups, "reset", reset, help="move a group's committed offsets of a topic",
                    description="Move the group's committed offsets of TOPIC; its members read from there "
                                "after their next poll.")
    p.add_argument("group")
    p.add_argument("topic")
    p.add_argument("--to", required=True, metavar="WHERE",
                   help="earliest, latest, an offset N, @MS (first record at/after a time in ms) or an "
                        "ISO 8601 time")
    p.add_argument("--partition", type=int, help="only this partition (default: all)")
    p = add_command(groups, "delete", delete, help="delete a group with no members and its committed offsets",
                    description="Delete a group that has no members, and its committed offsets: a consumer "
                                "joining it later starts from its reset policy. A group with members is "
                                "refused.")
    p.add_argument("group")


def _lag(doc: dict[str, Any]) -> int | None:
    lags = [o.get("lag") for o in doc.get("offsets") or [] if o.get("lag") is not None]
    return sum(lags) if lags else None


def list_(ctx: Context, args: argparse.Namespace) -> int:
    ctx.reachable()
    doc = ctx.api().call("GET", "/v1/groups")
    if ctx.json:
        ctx.emit(doc)
        return EXIT_OK
    groups = doc.get("groups") or []
    if groups:
        rows = [(g.get("group"), g.get("state"), g.get("generation"), len(g.get("members") or []),
                 ",".join(sorted({o["topic"] for o in g.get("offsets") or [] if "topic" in o})), _lag(g),
                 g.get("coordinator")) for g in groups]
        ctx.say(table(["GROUP", "STATE", "GENERATION", "MEMBERS", "TOPICS", "LAG", "COORDINATOR"], rows))
    else:
        ctx.note("no consumer groups")
    if doc.get("unreachable"):
        ctx.note(f"not answering (their groups are missing): {', '.join(doc['unreachable'])}")
    return EXIT_OK


def describe(ctx: Context, args: argparse.Namespace) -> int:
    ctx.reachable()
    doc = ctx.api().call("GET", f"/v1/groups/{quote(args.group)}")
    if ctx.json:
        ctx.emit(doc)
        return EXIT_OK
    members = doc.get("members") or []
    lag = _lag(doc)
    ctx.say(f"group {doc.get('group')}: {doc.get('state')}, generation {doc.get('generation')}, "
            f"{len(members)} member{'s' if len(members) != 1 else ''}, coordinator {doc.get('coordinator')}, "
            f"lag {lag if lag is not None else '-'}")
    if members:
        ctx.say("")
        rows = [(m.get("member"), m.get("client"), len(m.get("assignment") or []),
                 ",".join(m.get("topics") or []), m.get("idle_ms")) for m in members]
        ctx.say(table(["MEMBER", "CLIENT", "PARTITIONS", "TOPICS", "IDLE MS"], rows))
    offsets = doc.get("offsets") or []
    if offsets:
        ctx.say("")
        rows = [(o.get("topic"), o.get("partition"), o.get("committed"), o.get("high_watermark"), o.get("lag"),
                 o.get("consumer")) for o in offsets]
        ctx.say(table(["TOPIC", "PARTITION", "COMMITTED", "HIGH WATERMARK", "LAG", "MEMBER"], rows))
    return EXIT_OK


def reset(ctx: Context, args: argparse.Namespace) -> int:
    where = parse_position(args.to, "--to")
    if where.kind == "back":
        raise UsageError("--to takes earliest, latest, an offset N, @MS or an ISO 8601 time")
    if args.partition is not None and args.partition < 0:
        raise UsageError("--partition must be 0 or more")
    body: dict[str, Any] = {"to": where.kind}
    if where.kind in ("offset", "timestamp"):
        body["value"] = where.value
    if args.partition is not None:
        body["partition"] = args.partition
    ctx.reachable()
    doc = ctx.api().call("PUT", f"/v1/groups/{quote(args.group)}/offsets/{quote(args.topic)}", doc=body)
    if ctx.json:
        ctx.emit(doc)
        return EXIT_OK
    offsets = doc.get("offsets") or []
    ctx.say(f"group {args.group}: {args.topic} moved to {where} on {len(offsets)} "
            f"partition{'s' if len(offsets) != 1 else ''}")
    ctx.say(table(["PARTITION", "OFFSET"], [(o.get("partition"), o.get("offset")) for o in offsets]))
    return EXIT_OK


def delete(ctx: Context, args: argparse.Namespace) -> int:
    ctx.reachable()
    doc = ctx.api().call("DELETE", f"/v1/groups/{quote(args.group)}")
    if ctx.json:
        ctx.emit(doc)
    else:
        ctx.say(f"deleted group {args.group} and its committed offsets")
    return EXIT_OK
