"""``ring consume TOPIC``: records to stdout, one per line.

Each record's value is written as it was produced, followed by a newline
(an event produced as JSON is its JSON text), so ``ring produce`` and ``ring
consume`` round-trip lines exactly; ``--json`` writes each record as one
JSON line instead (topic, partition, offset, timestamp, key, value, headers:
the HTTP API's record shape). Records of one partition come in offset
order; partitions interleave.

Without ``--group`` the command reads partitions directly (all, or
``--partition``) from ``--from`` on: one long-polling reader per partition
through the async client, handing answers to one writer through a bounded
queue. It stops when every partition is caught up with its high watermark,
after ``--max`` records, or never with ``--follow``. With ``--group`` it joins
the consumer group, polls the partitions the group assigns to it (each poll
names the previous answer's token, which commits it), and leaves on the way
out, committing what it printed: at-least-once, and a second run of the same
group continues where the first stopped. A partition that moved to another
member before that last commit is named on stderr and left out; the
partitions it still holds are committed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
from typing import Any

import orjson

from ring import errors, limits
from ring.commands.base import EXIT_OK, Context, UsageError, add_command, quote
from ring.commands.positions import Position, parse_position
from ring.commands.progress import Progress

FETCH_RECORDS = 5_000  # per fetch or poll: big answers keep a fast consumer's requests few
FOLLOW_WAIT_MS = 10_000  # a long-poll, well under proxies' idle timeouts
GROUP_FOLLOW_WAIT_MS = 5_000  # under the shortest session timeout a member may have, with room
REJOINS_MAX = 20  # consecutive rebalances without a poll answered: the group is in turmoil
# Leaving (done, Ctrl-C, a closed pipe): the final commit and the leave together get this long, each
# request at most LEAVE_REQUEST_TIMEOUT_S (a commit is answered, 504 at worst, within the produce
# timeout). A request left unanswered is sent again on a fresh connection; past the time the command
# says so and ends, and the group drops the member after its session timeout.
LEAVE_TIMEOUT_S = 15.0
LEAVE_REQUEST_TIMEOUT_S = limits.PRODUCE_TIMEOUT_MS_MAX / 1000 + 2.0


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "consume", consume, help="print a topic's records to stdout",
                    description="Print records, one per line, until caught up (or --max, or forever with "
                                "--follow).")
    p.add_argument("topic")
    p.add_argument("--from", dest="start", metavar="WHERE",
                   help="earliest (default), latest, an offset N (with --partition), -N (N before the end of "
                        "each partition), @MS (first record at/after a time in ms) or an ISO 8601 time")
    p.add_argument("--partition", type=int, help="only this partition")
    p.add_argument("-f", "--follow", action="store_true", help="keep waiting for new records (Ctrl-C ends)")
    p.add_argument("-n", "--max", type=int, metavar="N", help="stop after N records")
    p.add_argument("-g", "--group", help="read as a member of this consumer group, committing what was printed")
    p.add_argument("--consumer", metavar="ID", help="with --group: this member's id (default cli-HOST-PID)")


def consume(ctx: Context, args: argparse.Namespace) -> int:
    start = parse_position(args.start) if args.start is not None else Position("earliest")
    if args.max is not None and args.max < 1:
        raise UsageError("--max must be 1 or more")
    if args.partition is not None and args.partition < 0:
        raise UsageError("--partition must be 0 or more")
    if args.group is None and args.consumer is not None:
        raise UsageError("--consumer needs --group")
    if args.group is not None:
        if args.partition is not None:
            raise UsageError("--partition cannot be used with --group: the group assigns partitions")
        if start.kind not in ("earliest", "latest"):
            raise UsageError("with --group, --from is earliest or latest (where partitions without a committed "
                             "offset start); move committed offsets with 'ring groups reset'")
        return _consume_group(ctx, args, start)
    if start.kind == "offset" and args.partition is None:
        raise UsageError("--from OFFSET needs --partition (offsets are per partition)")
    return _consume_partitions(ctx, args, start)


# --- output ----------------------------------------------------------------------------------


def _progress(ctx: Context, label: str, total: int | None) -> Progress:
    # Only when records go somewhere else: on a shared terminal the line would tear the output.
    return Progress(label, total, enabled=ctx.stderr.isatty() and not ctx.stdout.isatty())


def _value_line(doc: dict[str, Any]) -> bytes:
    """A JSON record (group polls) back to the value's bytes."""
    value = doc.get("value")
    if doc.get("value_encoding") == "base64" and isinstance(value, str):
        return base64.b64decode(value)
    if isinstance(value, str):
        return value.encode()
    return orjson.dumps(value)


# --- partitions, directly ------------------------------------------------------------------


def _start_offsets(ctx: Context, args: argparse.Namespace, start: Position) -> tuple[dict[int, int | None], int]:
    """Partition -> offset to read from (None: the earliest kept), and the records up to the ends now."""
    api = ctx.api()
    topic = quote(args.topic)
    doc = api.call("GET", f"/v1/topics/{topic}")
    parts = {p["partition"]: p for p in doc.get("partitions", [])}
    if args.partition is not None and args.partition not in parts:
        raise errors.UnknownPartition(f"topic {args.topic!r} has partitions 0..{len(parts) - 1}, "
                                      f"not {args.partition}", topic=args.topic, partition=args.partition)
    chosen = [args.partition] if args.partition is not None else sorted(parts)
    starts: dict[int, int | None] = {}
    total = 0
    for p in chosen:
        earliest, hw = int(parts[p]["earliest_offset"]), int(parts[p]["high_watermark"])
        if start.kind == "earliest":
            offset: int | None = None
        elif start.kind == "latest":
            offset = hw
        elif start.kind == "offset":
            offset = start.value
        elif start.kind == "back":
            offset = max(earliest, hw - start.value)
        else:
            found = api.call("GET", f"/v1/topics/{topic}/partitions/{p}/offsets", query={"timestamp": start.value})
            offset = int(found["offset"])
        starts[p] = offset
        total += max(hw - (earliest if offset is None else offset), 0)
    return starts, total


def _consume_partitions(ctx: Context, args: argparse.Namespace, start: Position) -> int:
    ctx.reachable()
    starts, total = _start_offsets(ctx, args, start)
    progress = _progress(ctx, f"reading {args.topic}", None if args.follow else total)
    try:
        asyncio.run(_read(ctx, args, starts, progress))
    finally:
        progress.finish()
    return EXIT_OK


async def _read(ctx: Context, args: argparse.Namespace, starts: dict[int, int | None], progress: Progress) -> None:
    from ring.client import AsyncClient
    from ring.http_api.fetch_codec import record_line

    out = ctx.stdout.buffer
    remaining = args.max if args.max is not None else -1
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=2 * len(starts) + 2)  # bounded: readers wait for the writer

    async with AsyncClient(ctx.brokers, **ctx.client_options()) as client:
        async def reader(p: int, offset: int | None) -> None:
            try:
                while True:
                    got = await client.fetch(args.topic, p, offset, max_records=FETCH_RECORDS,
                                             wait_ms=FOLLOW_WAIT_MS if args.follow else 0)
                    if got.records:
                        await queue.put(got)
                    offset = got.next_offset
                    if not args.follow and (not got.records or offset >= got.high_watermark):
                        break
                await queue.put(None)
            except Exception as exc:  # handed to the writer, which raises it
                await queue.put(exc)

        tasks = [asyncio.create_task(reader(p, o)) for p, o in starts.items()]
        try:
            running = len(tasks)
            while running and remaining != 0:
                got = await queue.get()
                if got is None:
                    running -= 1
                    continue
                if isinstance(got, BaseException):
                    raise got
                records = got.records if remaining < 0 else got.records[:remaining]
                if ctx.json:
                    lines = [orjson.dumps({"topic": r.topic, "partition": r.partition,
                                           **record_line(r, r.value_is_json)}) for r in records]
                else:
                    # A record without a value prints as null, as Kafka's console consumer does.
                    lines = [b"null" if r.value is None else r.value for r in records]
                lines.append(b"")
                data = b"\n".join(lines)
                out.write(data)
                out.flush()
                progress.update(len(records), len(data))
                if remaining > 0:
                    remaining -= len(records)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# --- as a member of a group -------------------------------------------------------------------


def _default_consumer() -> str:
    host = "".join(c if c.isalnum() or c in ".-" else "-" for c in socket.gethostname())[:64] or "host"
    return f"cli-{host}-{os.getpid()}"


def _consume_group(ctx: Context, args: argparse.Namespace, start: Position) -> int:
    ctx.reachable()
    api = ctx.api(timeout_s=limits.CLIENT_REQUEST_TIMEOUT_S_DEFAULT + GROUP_FOLLOW_WAIT_MS / 1000,
                  retry_timeout_s=limits.CLIENT_RETRY_TIMEOUT_S_DEFAULT)  # a member rides out a failover
    api.call("GET", f"/v1/topics/{quote(args.topic)}")  # an unknown topic is an error here too, not an idle member
    group, consumer = quote(args.group), args.consumer or _default_consumer()
    member = f"/v1/groups/{group}/members/{quote(consumer)}"
    join_doc = {"consumer": consumer, "topics": [args.topic], "reset": start.kind, "client": "ring consume"}

    out = ctx.stdout.buffer
    remaining = args.max if args.max is not None else -1
    progress = _progress(ctx, f"reading {args.topic} as {args.group}", None)
    printed: dict[tuple[str, int], int] = {}  # next offset after the last record written out
    ids: dict[str, str] = {}  # topic -> its id as the last join gave it

    def join() -> int:
        doc = api.call("POST", f"/v1/groups/{group}/members", doc=join_doc, repeatable=True)
        new_ids = doc.get("topic_ids") or {}
        recreated = {t for t, i in new_ids.items() if ids.get(t, i) != i}
        ids.update(new_ids)
        for tp in [tp for tp in printed if tp[0] in recreated]:  # of the old topic: never committed for the new
            del printed[tp]
        if doc.get("idle") and doc.get("message"):
            ctx.note(f"{ctx.prog}: {doc['message']}")
        return int(doc.get("generation", 0))

    generation = join()
    rejoins = 0
    token = None  # of the last answer read: the next poll acknowledges it
    try:
        while remaining != 0:
            size = FETCH_RECORDS if remaining < 0 else min(remaining, FETCH_RECORDS)
            query = {"max_records": size, "wait_ms": GROUP_FOLLOW_WAIT_MS if args.follow else 0,
                     "generation": generation}
            if token is not None:
                query["token"] = token
            try:
                got = api.call("POST", f"{member}/poll", query=query, repeatable=True)
            except errors.Conflict as exc:  # a rebalance: join the new generation and go on
                rejoins += 1
                if rejoins > REJOINS_MAX:
                    raise
                if isinstance(exc, errors.TopicRecreated):  # joining starts it over on the new topic
                    ctx.note(f"{ctx.prog}: topic {exc.extra.get('topic')} was deleted and created again; "
                             "reading it anew")
                    token = None
                generation = join()
                continue
            rejoins = 0
            generation = int(got.get("generation", generation))
            token = got.get("token")
            records = got.get("records") or []
            if records:
                progress.update(len(records), _write_polled(ctx, out, records, printed))
                if remaining > 0:
                    remaining -= len(records)
            elif not args.follow:
                break
    finally:
        progress.finish()
        _leave(ctx, api, group, consumer, generation, printed)
    return EXIT_OK


def _write_polled(ctx: Context, out: Any, records: list[dict[str, Any]], printed: dict[tuple[str, int], int]) -> int:
    """Write a poll's records out, one line each, and note the next offset after each partition's
    last one (what leaving commits); the bytes written."""
    lines = [orjson.dumps(r) for r in records] if ctx.json else [_value_line(r) for r in records]
    lines.append(b"")
    data = b"\n".join(lines)
    out.write(data)
    out.flush()
    for r in records:
        tp = (r["topic"], r["partition"])
        printed[tp] = max(printed.get(tp, 0), r["offset"] + 1)
    return len(data)


def _leave(ctx: Context, api: Any, group: str, consumer: str, generation: int,
           printed: dict[tuple[str, int], int]) -> None:
    """Commit exactly what was written out, then leave without the poll's own commit:
    however the command ends (done, Ctrl-C, a closed pipe), nothing unprinted is
    committed. A failure here is said, not raised: the group drops the member
    after its session timeout anyway, and uncommitted records are read again.
    Both together take LEAVE_TIMEOUT_S at most (and one request's timeout)."""
    api.within(LEAVE_TIMEOUT_S, LEAVE_REQUEST_TIMEOUT_S)
    try:
        _commit_printed(ctx, api, group, consumer, generation, printed)
    except (errors.RingError, OSError) as exc:
        ctx.note(f"{ctx.prog}: committing: {exc}")
    except KeyboardInterrupt:
        pass
    try:
        api.call("DELETE", f"/v1/groups/{group}/members/{quote(consumer)}", query={"commit": "false"},
                 repeatable=True)
    except (errors.RingError, OSError) as exc:
        ctx.note(f"{ctx.prog}: leaving the group: {exc}")
    except KeyboardInterrupt:
        pass


def _commit_printed(ctx: Context, api: Any, group: str, consumer: str, generation: int,
                    printed: dict[tuple[str, int], int]) -> None:
    """One commit of everything printed; if a partition moved to another member meanwhile (409),
    each partition on its own: the coordinator takes those this member has held without a break
    since ``generation``, and the others are named (their new owner reads them again)."""
    def commit(tps: list[tuple[str, int]]) -> None:
        api.call("POST", f"/v1/groups/{group}/offsets", doc={
            "consumer": consumer, "generation": generation,
            "offsets": [{"topic": t, "partition": p, "offset": printed[(t, p)]} for t, p in tps]}, repeatable=True)

    if not printed:
        return
    try:
        commit(sorted(printed))
        return
    except errors.Conflict as exc:
        if exc.extra.get("reason") == "unknown_member":  # the group dropped this member: nothing is taken
            ctx.note(f"{ctx.prog}: committing: {exc.message}")
            return
    missed = []
    for tp in sorted(printed):
        try:
            commit([tp])
        except errors.Conflict:
            missed.append(tp)
    if missed:
        ctx.note(f"{ctx.prog}: not committed: {', '.join(f'{t}/{p}' for t, p in missed)}: moved to another "
                 "member of the group, which reads on from the committed offset (what was printed since comes again)")
