"""``ring topics create|list|describe|alter|delete|elect-unclean``: topic administration.

Each is one call of the sync client (``create_topic`` waits until every live
broker knows the new topic, so a produce right after it works anywhere).
People get a sentence or a table; ``--json`` prints the API's own document
(``POST``/``GET``/``PATCH /v1/topics/{t}``, ``GET /v1/topics``, ``{"deleted": t}``,
``POST .../partitions/{p}/unclean-election``).
"""

from __future__ import annotations

import argparse
from typing import Any

from ring import errors
from ring.commands.base import EXIT_OK, Context, UsageError, add_command, add_group, table
from ring.commands.positions import format_bytes, format_duration_ms, parse_bytes, parse_duration_ms

CONSISTENCIES = ("one", "quorum", "all")
COMPRESSIONS = ("none", "zstd", "lz4")


def register(sub: argparse._SubParsersAction) -> None:
    topics = add_group(sub, "topics", help="create, list, describe, alter and delete topics",
                       description="Create, list, describe, alter and delete topics.")
    p = add_command(topics, "create", create, help="create a topic",
                    description="Create a topic; settings not given take the cluster's defaults.")
    p.add_argument("topic")
    p.add_argument("-p", "--partitions", type=_partitions, help="partitions (default 8), or auto: start with one "
                                                               "and grow with the consumer groups reading it")
    p.add_argument("-r", "--replication-factor", type=int, help="copies of each partition (default 3, at most "
                                                               "the number of brokers)")
    p.add_argument("--retention", metavar="DURATION", help="keep records this long: 86400000 (ms), 12h, 7d, or "
                                                          "forever (default 7d)")
    p.add_argument("--retention-bytes", metavar="SIZE", help="keep at most this much per partition: 10GiB, or "
                                                            "unlimited (default)")
    p.add_argument("--segment-bytes", metavar="SIZE", help="roll segment files at this size (default 64MiB)")
    p.add_argument("--compression", choices=COMPRESSIONS, help="how the broker compresses stored batches")
    p.add_argument("--consistency", choices=CONSISTENCIES, help="default acknowledgement level of produces")
    p.add_argument("--if-not-exists", action="store_true", help="succeed when the topic already exists")

    add_command(topics, "list", list_, help="list topics", description="List every topic with its settings.")

    p = add_command(topics, "describe", describe, help="a topic's settings and partitions",
                    description="Settings and, per partition, leader, replicas, epoch and offsets.")
    p.add_argument("topic")

    p = add_command(topics, "alter", alter, help="change a topic's settings",
                    description="Change a topic's settings; those not given stay as they are. Partitions only "
                                "grow; replication factor and segment size are fixed at creation.")
    p.add_argument("topic")
    p.add_argument("-p", "--partitions", type=_partitions, help="grow to this many partitions, or auto")
    p.add_argument("--auto", dest="auto_partitions", action=argparse.BooleanOptionalAction, default=None,
                   help="grow (or stop growing) with the consumer groups reading it")
    p.add_argument("--retention", metavar="DURATION", help="keep records this long: 86400000 (ms), 12h, 7d, or "
                                                          "forever")
    p.add_argument("--retention-bytes", metavar="SIZE", help="keep at most this much per partition: 10GiB, or "
                                                            "unlimited")
    p.add_argument("--compression", choices=COMPRESSIONS, help="how the broker compresses new batches")
    p.add_argument("--consistency", choices=CONSISTENCIES, help="default acknowledgement level of produces")
    p.add_argument("--unclean-leader-election", action=argparse.BooleanOptionalAction, default=None,
                   help="elect the most up-to-date live replica when the only ones holding what was acknowledged "
                        "lost their state, losing what only they held (default: off, the partition waits)")

    p = add_command(topics, "elect-unclean", elect_unclean, help="elect a leader, losing what lost replicas held",
                    description="For a partition without a leader because the only replicas holding what was "
                                "acknowledged lost their state (no_eligible_leader): elect the most up-to-date "
                                "live replica once. What only the lost replicas held is gone; the answer names "
                                "the offset from which records were lost.")
    p.add_argument("topic")
    p.add_argument("partition", type=int)

    p = add_command(topics, "delete", delete, help="delete a topic and its data",
                    description="Delete a topic and all of its records, on every broker.")
    p.add_argument("topic")
    p.add_argument("--if-exists", action="store_true", help="succeed when there is no such topic")


def _partitions(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a partition count or auto: {text!r}") from None


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if args.retention is not None:
        config["retention_ms"] = parse_duration_ms(args.retention, "--retention")
    if args.retention_bytes is not None:
        config["retention_bytes"] = parse_bytes(args.retention_bytes, "--retention-bytes")
    for name in ("compression", "consistency"):
        if getattr(args, name) is not None:
            config[name] = getattr(args, name)
    return config


def create(ctx: Context, args: argparse.Namespace) -> int:
    config = _settings(args)
    if args.segment_bytes is not None:
        config["segment_bytes"] = parse_bytes(args.segment_bytes, "--segment-bytes", no_limit=False)
    with ctx.client() as client:
        doc = client.create_topic(args.topic, args.partitions, args.replication_factor,
                                  exist_ok=args.if_not_exists, **config)
    if ctx.json:
        ctx.emit(doc)
    else:
        ctx.say(f"topic {doc['name']}: {_summary(doc)}")
    return EXIT_OK


def alter(ctx: Context, args: argparse.Namespace) -> int:
    config = _settings(args)
    if args.partitions is not None:
        config["partitions"] = args.partitions
    if args.auto_partitions is not None:
        config["auto_partitions"] = args.auto_partitions
    if args.unclean_leader_election is not None:
        config["unclean_leader_election"] = args.unclean_leader_election
    if not config:
        raise UsageError("nothing to change: give --partitions, --auto/--no-auto, --retention, --retention-bytes, "
                         "--compression, --consistency or --[no-]unclean-leader-election")
    with ctx.client() as client:
        doc = client.change_topic(args.topic, **config)
    if ctx.json:
        ctx.emit(doc)
    else:
        ctx.say(f"topic {doc['name']}: {_summary(doc)}")
    return EXIT_OK


def _summary(doc: dict[str, Any]) -> str:
    count = doc.get('partitions') if isinstance(doc.get('partitions'), int) else doc.get('partition_count')
    return (f"{count} partitions{' (auto)' if doc.get('auto_partitions') else ''}, "
            f"replication factor {doc.get('replication_factor')}, "
            f"retention {format_duration_ms(doc.get('retention_ms'))}, consistency {doc.get('consistency')}, "
            f"compression {doc.get('compression')}")


def list_(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.client() as client:
        topics = sorted(client.topics(), key=lambda t: t.get("name", ""))
    if ctx.json:
        ctx.emit({"topics": topics})
        return EXIT_OK
    if not topics:
        ctx.note("no topics")
        return EXIT_OK
    rows = [(t.get("name"), t.get("partitions"), t.get("replication_factor"),
             format_duration_ms(t.get("retention_ms")), format_bytes(t.get("retention_bytes")),
             t.get("consistency"), t.get("compression")) for t in topics]
    ctx.say(table(["TOPIC", "PARTITIONS", "RF", "RETENTION", "MAX BYTES", "CONSISTENCY", "COMPRESSION"], rows))
    return EXIT_OK


def describe(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.client() as client:
        doc = client.describe(args.topic)
    if ctx.json:
        ctx.emit(doc)
        return EXIT_OK
    parts = doc.get("partitions") or []
    held = sum(max(p.get("high_watermark", 0) - p.get("earliest_offset", 0), 0) for p in parts)
    ctx.say(f"topic {doc.get('name')}: {_summary({**doc, 'partitions': len(parts)})}; {held:,} records held")
    rows = [(p.get("partition"), p.get("leader"), ",".join(p.get("replicas") or []), p.get("epoch"),
             p.get("earliest_offset"), p.get("high_watermark"), p.get("end_offset")) for p in parts]
    ctx.say(table(["PARTITION", "LEADER", "REPLICAS", "EPOCH", "EARLIEST", "HIGH WATERMARK", "END"], rows))
    return EXIT_OK


def elect_unclean(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.client() as client:
        doc = client.unclean_election(args.topic, args.partition)
    if ctx.json:
        ctx.emit(doc)
        return EXIT_OK
    lost = [u["from_offset"] for u in doc.get("state", {}).get("unclean_elections", [])]
    where = f"; records from offset {lost[-1]} on that only the lost replicas held are gone" if lost else ""
    ctx.say(f"{args.topic}/{args.partition}: {doc.get('leader')} leads{where}")
    return EXIT_OK


def delete(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.client() as client:
        try:
            client.delete_topic(args.topic)
            deleted = True
        except errors.UnknownTopic:
            if not args.if_exists:
                raise
            deleted = False
    if ctx.json:
        ctx.emit({"deleted": args.topic if deleted else None})
    elif deleted:
        ctx.say(f"deleted topic {args.topic}")
    else:
        ctx.note(f"no topic {args.topic}")
    return EXIT_OK
