"""JSON events out of produce bodies one at a time, so a body costs memory in proportion to its bytes.

``orjson.loads`` of a whole body builds every event's objects at once: a 6.5 MB array of 50,000
events nested 64 deep is 450 MB of lists, and the record limit could only be checked afterwards.
And every ``orjson.dumps`` result keeps the buffer orjson sized for it (about 4 KiB), so
re-serialising 500,000 one-byte events holds 2 GB. Here instead:

- a top-level array's events are found by one regular expression (C level) that matches a JSON
  value nested at most ``JSON_DEPTH_MAX`` deep. It runs over a copy of the body in which every
  escaped pair (a backslash and the byte after it) is blanked to two neutral bytes, so a string
  is plainly ``"[^"]*"`` and offsets still line up with the body;
- events are counted as they are found: the one past ``RECORDS_PER_REQUEST_MAX`` is refused
  before it is parsed, and an event longer than ``NDJSON_LINE_BYTES_MAX`` likewise;
- each event is parsed on its own (validity is orjson's: fetch answers embed stored values
  verbatim) and its objects dropped at once;
- the stored value is the event's own bytes when they hold no whitespace (compact already), else
  orjson's compact form copied into a bytes object of its exact size.

NDJSON lines and a lone event take the same per-event path. ``one_line`` is the other direction:
a stored JSON value as it may appear on one NDJSON line (a stored batch may hold JSON that was
never made compact).
"""

from __future__ import annotations

import re
from collections import deque
from itertools import repeat
from typing import Iterator

import orjson

from ring import limits
from ring.errors import BadRequest, PayloadTooLarge

_STRING = rb'"[^"]*+"'  # in the blanked copy: no escaped quote is left inside a string
_INSIDE = rb'[^"\[\]{}]++'  # scalars, commas, colons and whitespace within a container
_SCALAR = rb'[^"\[\]{},: \t\n\r]++'


def _container(depth: int) -> bytes:
    pattern = rb"[\[{](?:" + _STRING + rb"|" + _INSIDE + rb")*+[\]}]"
    for _ in range(depth - 1):
        pattern = rb"[\[{](?:" + _STRING + rb"|" + _INSIDE + rb"|" + pattern + rb")*+[\]}]"
    return pattern


# Possessive quantifiers throughout: a failed match never backtracks, so any input is scanned in
# linear time. Brackets are not paired by kind here ("[1}" matches); orjson refuses such events.
_EVENT = re.compile(rb"[ \t\n\r]*+(" + _STRING + rb"|" + _container(limits.JSON_DEPTH_MAX) + rb"|" + _SCALAR
                    + rb")[ \t\n\r]*+([,\]])")
_ARRAY_OPEN = re.compile(rb"[ \t\n\r]*+\[[ \t\n\r]*+")
_TRAILING_SPACE = re.compile(rb"[ \t\n\r]*+\Z")
_NON_BLANK = re.compile(rb"[^ \t\r\n]")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS_ONLY = bytes(range(256)).translate(None, b"[]{}")
_NOT_OPENINGS = bytes(range(256)).translate(None, b"[{")


def json_depth(text: bytes) -> int:
    """Nesting depth of a valid JSON text, without recursion.

    Strings are cut out, everything but brackets dropped, and innermost
    pairs removed one layer per pass: all C-level byte operations.
    """
    brackets = _JSON_STRING.sub(b"", text).translate(None, _BRACKETS_ONLY)
    brackets = brackets.replace(b"{", b"[").replace(b"}", b"]")
    depth = 0
    while brackets:
        shorter = brackets.replace(b"[]", b"")
        assert len(shorter) < len(brackets), "unbalanced brackets in parsed JSON"
        brackets = shorter
        depth += 1
        if depth > limits.JSON_DEPTH_MAX + 1:
            break
    return depth


def too_deep(text: bytes, start: int = 0, end: int | None = None) -> bool:
    """Whether the valid JSON ``text[start:end]`` nests deeper than ``JSON_DEPTH_MAX``."""
    end = len(text) if end is None else end
    # Cheap first: each level takes an opening and a closing bracket, and fewer openings than the
    # limit cannot nest too deep.
    if end - start <= 2 * limits.JSON_DEPTH_MAX:
        return False
    if text.count(b"[", start, end) + text.count(b"{", start, end) <= limits.JSON_DEPTH_MAX:
        return False
    return json_depth(text[start:end]) > limits.JSON_DEPTH_MAX


def starts_array(body: bytes) -> bool:
    return _ARRAY_OPEN.match(body) is not None


def _has_space(body: bytes, start: int, end: int) -> bool:
    """Whether ``body[start:end]`` holds a JSON whitespace byte (four memchr scans: cheaper than a
    regular expression's class match)."""
    find = body.find
    return find(b" ", start, end) >= 0 or find(b"\n", start, end) >= 0 or find(b"\r", start, end) >= 0 \
        or find(b"\t", start, end) >= 0


def _value(body: bytes, start: int, end: int, where: str, depth_known: bool = False) -> bytes:
    """The compact stored form of the valid JSON event ``body[start:end]``; ``depth_known``: its
    nesting was bounded already."""
    if end - start > limits.NDJSON_LINE_BYTES_MAX:
        raise PayloadTooLarge(f"{where} is over the limit of {limits.NDJSON_LINE_BYTES_MAX} bytes",
                              limit_bytes=limits.NDJSON_LINE_BYTES_MAX)
    try:
        # The whole body (a lone event) is parsed as it is: no view to make.
        event = orjson.loads(body if start == 0 and end == len(body) else memoryview(body)[start:end])
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON in {where}: {exc}") from None
    if not depth_known and too_deep(body, start, end):
        raise BadRequest(f"JSON nested deeper than {limits.JSON_DEPTH_MAX} levels in {where}")
    if not _has_space(body, start, end):
        return body[start:end]
    return bytes(memoryview(orjson.dumps(event)))  # a copy: orjson's own buffer is far larger


def _counted(n: int) -> None:
    if n == limits.RECORDS_PER_REQUEST_MAX:
        raise PayloadTooLarge(f"more than {limits.RECORDS_PER_REQUEST_MAX} records in one request")


def array_values(body: bytes) -> list[bytes]:
    """The events of a body that is one top-level JSON array, compact; 413 past the record limit."""
    text = body.replace(b"\\\\", b"__").replace(b'\\"', b"__") if b"\\" in body else body
    opened = _ARRAY_OPEN.match(text)
    assert opened is not None, "array_values needs a body that starts_array"
    if text.startswith(b"]", opened.end()):
        if _TRAILING_SPACE.match(text, opened.end() + 1) is None:
            raise BadRequest("malformed JSON: content after the top-level array")
        raise BadRequest("no records in the body")
    values: list[bytes] = []
    pos = opened.end()
    while True:
        found = _EVENT.match(text, pos)
        if found is None:
            raise BadRequest(f"malformed JSON, or nested deeper than {limits.JSON_DEPTH_MAX} levels, in event "
                             f"{len(values) + 1} of the array (at byte {pos})")
        _counted(len(values))
        values.append(_value(body, *found.span(1), f"event {len(values) + 1} of the array", depth_known=True))
        pos = found.end()
        if found.group(2) == b"]":
            break
    if _TRAILING_SPACE.match(text, pos) is None:
        raise BadRequest("malformed JSON: content after the top-level array")
    return values


def single_value(body: bytes) -> bytes:
    """A body that is one JSON event (not an array), compact; refused unparsed when over the size limit."""
    return _value(body, 0, len(body), "the event")


def ndjson_lines(body: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each non-blank line, from its first non-blank byte; blank runs are
    skipped at C level."""
    pos = 0
    while (found := _NON_BLANK.search(body, pos)) is not None:
        start = found.start()
        end = body.find(b"\n", start)
        end = len(body) if end < 0 else end
        yield start, end
        pos = end


def ndjson_values(body: bytes) -> list[bytes]:
    """One event per non-blank line, compact; 413 past the record limit, before that line is parsed."""
    values: list[bytes] = []
    for start, end in ndjson_lines(body):
        _counted(len(values))
        values.append(_value(body, start, end, f"non-blank line {len(values) + 1}"))
    return values


def one_line(value: bytes) -> bytes | None:
    """A stored JSON value fit for one NDJSON line: itself unless it holds a line break, then its
    compact form; None when it is not JSON after all (it is then sent as text)."""
    if b"\n" not in value and b"\r" not in value:
        return value
    try:
        return bytes(memoryview(orjson.dumps(orjson.loads(value))))
    except orjson.JSONDecodeError:
        return None


def check_stored(values: tuple | list) -> None:
    """The rules of a JSON produce for the JSON-flagged values of a stored batch: each parses,
    and nests no deeper than ``JSON_DEPTH_MAX``. C-level loops; each value's objects are dropped
    as soon as it parsed."""
    try:
        deque(map(orjson.loads, values), maxlen=0)
    except orjson.JSONDecodeError:
        raise BadRequest("batch is flagged JSON but a value is not JSON") from None
    # Fewer openings than the limit cannot nest deeper (strings' brackets count too: an overcount).
    opening = map(len, map(bytes.translate, values, repeat(None), repeat(_NOT_OPENINGS)))
    for value, opens in zip(values, opening):
        if opens > limits.JSON_DEPTH_MAX and json_depth(value) > limits.JSON_DEPTH_MAX:
            raise BadRequest(f"batch is flagged JSON but a value nests deeper than {limits.JSON_DEPTH_MAX} levels")
