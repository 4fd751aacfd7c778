"""``ring produce TOPIC``: every line of stdin becomes one record.

By default a line (without its newline; any bytes) is the record's value, so
``ring consume`` prints back exactly what went in. ``--ndjson`` parses each
line as a JSON event (blank lines are skipped; a line that is not JSON stops
the command with its line number) and stores it as JSON, as the HTTP API's
NDJSON produce does; ``--key-field F`` then takes the record key from the
event's top-level field F (a string as it is, a number or boolean as JSON
text; no key when the field is missing or null). ``--key`` gives every
record one key; ``--partition`` one partition.

Records go through the sync client: batched per partition, straight to each
leader, ``--consistency`` per request. The command reads stdin line by line,
so a producer that waits for room in the client's buffer also stops reading:
memory stays bounded whatever the input's size. The first failure stops the
reading; what was already sent is flushed, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import threading
from typing import Any, BinaryIO

import orjson

from ring import errors, limits
from ring.commands.base import (EXIT_API, EXIT_OK, EXIT_UNREACHABLE, Context, UsageError, add_command,
                               error_message, report)
from ring.commands.progress import Progress

# A line may carry a maximal record plus "\r\n"; longer is refused without
# reading the rest of it into memory.
LINE_BYTES_MAX = limits.MESSAGE_BYTES_MAX + 2


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "produce", produce, help="produce lines or NDJSON events from stdin",
                    description="Produce one record per line of stdin. Exit 0 when every record was "
                                "acknowledged, 1 at the first failure.")
    p.add_argument("topic")
    p.add_argument("--ndjson", action="store_true", help="parse each line as a JSON event and store it as JSON")
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("-k", "--key", help="the key of every record (places them all on one partition)")
    keys.add_argument("--key-field", metavar="FIELD", help="with --ndjson: the key is this top-level field "
                                                           "of each event")
    p.add_argument("--partition", type=int, help="produce to this partition (default: by key, or spread)")
    p.add_argument("--consistency", choices=("one", "quorum", "all"),
                   help="replicas that must have each record before it is acknowledged (default: the topic's)")


class _Tally:
    """Acknowledgements counted as they arrive (on the client's thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked = 0
        self.failed = 0
        self.error: BaseException | None = None
        self.partitions: dict[int, list[int]] = {}  # partition -> [first, last, count]

    def done(self, fut: Any) -> None:
        exc = fut.exception()
        with self.lock:
            if exc is not None:
                self.failed += 1
                self.error = self.error or exc
                return
            md = fut.result()
            self.acked += 1
            seen = self.partitions.get(md.partition)
            if seen is None:
                self.partitions[md.partition] = [md.offset, md.offset, 1]
            else:
                seen[0] = min(seen[0], md.offset)
                seen[1] = max(seen[1], md.offset)
                seen[2] += 1


def _key_of(event: Any, field: str, line_no: int) -> str | None:
    if not isinstance(event, dict):
        raise errors.BadRequest(f"line {line_no}: --key-field needs JSON objects, not {type(event).__name__}")
    value = event.get(field)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _stdin_size(stream: BinaryIO) -> int | None:
    """Bytes left in stdin when it is a regular file (``< events.ndjson``), for a percentage."""
    try:
        st = os.fstat(stream.fileno())
        if stat.S_ISREG(st.st_mode):
            return max(st.st_size - stream.tell(), 0) or None
    except (OSError, ValueError):
        pass
    return None


def produce(ctx: Context, args: argparse.Namespace) -> int:
    if args.key_field and not args.ndjson:
        raise UsageError("--key-field needs --ndjson")
    if args.partition is not None and args.partition < 0:
        raise UsageError("--partition must be 0 or more")
    stdin: BinaryIO = sys.stdin.buffer
    if stdin.isatty():
        ctx.note("reading records from the terminal, one per line; end with Ctrl-D")
    tally = _Tally()
    size = _stdin_size(stdin)
    progress = Progress(f"producing to {args.topic}", size, by_bytes=True)
    stopped: errors.RingError | None = None
    line_no = 0
    with ctx.client(consistency=args.consistency) as client:
        try:
            while tally.error is None:
                line = stdin.readline(LINE_BYTES_MAX)
                if not line:
                    break
                line_no += 1
                if len(line) == LINE_BYTES_MAX and not line.endswith(b"\n"):
                    raise errors.PayloadTooLarge(f"line {line_no} is longer than a record may be "
                                                 f"({limits.MESSAGE_BYTES_MAX} bytes)")
                progress.update(1, len(line))
                value = line[:-1] if line.endswith(b"\n") else line
                fut = _send(client, args, value, line_no)
                if fut is not None:
                    fut.add_done_callback(tally.done)
        except errors.RingError as exc:  # this line could not be sent: say which
            if not exc.message.startswith("line "):
                exc.message = f"line {line_no}: {exc.message}"
            stopped = exc
        finally:
            client.flush()
    seconds = progress.finish()
    return _report(ctx, args, tally, stopped, line_no, seconds)


def _send(client: Any, args: argparse.Namespace, value: bytes, line_no: int) -> Any:
    if not args.ndjson:
        return client.produce(args.topic, value, key=args.key, partition=args.partition)
    text = value.strip()
    if not text:
        return None  # NDJSON: blank lines separate nothing
    try:
        event = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        reason = str(exc).split(": line ")[0]  # orjson's position is within the line, not the input
        raise errors.BadRequest(f"line {line_no} is not JSON ({reason})") from None
    key = _key_of(event, args.key_field, line_no) if args.key_field else args.key
    # The event as written (validated above): no re-encoding, same bytes back.
    return client.produce(args.topic, key=key, partition=args.partition, json=orjson.Fragment(text))


def _report(ctx: Context, args: argparse.Namespace, tally: _Tally, stopped: errors.RingError | None,
            lines: int, seconds: float) -> int:
    with tally.lock:
        acked, failed, error = tally.acked, tally.failed, tally.error
        parts = {p: {"first_offset": f, "last_offset": last, "records": n}
                 for p, (f, last, n) in sorted(tally.partitions.items())}
    if stopped is None and error is not None:
        stopped = error if isinstance(error, errors.RingError) else errors.RingError(f"{type(error).__name__}: {error}")
    if ctx.json:
        doc: dict[str, Any] = {"topic": args.topic, "records": acked, "failed": failed, "lines": lines,
                               "seconds": round(seconds, 3), "partitions": parts}
        if stopped is not None:
            doc["error"] = error_message(stopped)
        ctx.emit(doc)
    else:
        where = f"{len(parts)} partition{'s' if len(parts) != 1 else ''}"
        ctx.say(f"produced {acked:,} record{'s' if acked != 1 else ''} to {args.topic} ({where}) "
                f"in {seconds:.2f} s")
    if stopped is None:
        return EXIT_OK
    from ring.client.transport import BrokersUnavailable, BrokerUnreachable

    if failed:
        stopped.extra["failed"] = failed
    report(ctx, stopped)
    if isinstance(stopped, (BrokersUnavailable, BrokerUnreachable)) and ctx.api().probe() is None:
        return EXIT_UNREACHABLE
    return EXIT_API
