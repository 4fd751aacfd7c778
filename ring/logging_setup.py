"""Where a broker's log lines go and what they look like: text for people, JSON for machines.

``configure(level, fmt)`` sets up the root logger once per process: ``text``
is one readable line per record; ``json`` is one JSON object per line with
``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and ``msg``,
then every field passed with ``extra={...}``, then ``exc`` (the formatted
traceback) when there is one. A log collector (Loki, Elasticsearch,
CloudWatch, journald's JSON mode) can then filter on any field without
parsing free text. Values that JSON cannot carry are written as ``str()``;
a record never spans two lines, whatever its message or traceback holds.
``add_arguments`` gives a parser the ``--log-format`` flag with its
``RING_LOG_FORMAT`` default, beside the existing ``--log-level``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

import orjson

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
FORMAT_ENV = "RING_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, no newline inside it."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
                  .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(doc, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def make_formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    assert fmt == "text", fmt
    return logging.Formatter(TEXT_FORMAT)


def parse_format(text: str) -> str:
    value = text.strip().lower()
    if value not in FORMATS:
        raise argparse.ArgumentTypeError(f"log format must be one of {', '.join(FORMATS)}, not {text!r}")
    return value


def configure(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Send every logger's records at ``level`` and above to ``stream`` (stderr) as ``fmt``.

    Replaces the root logger's handlers, so calling it again reconfigures
    instead of doubling every line. Returns the handler it installed.
    """
    fmt = parse_format(fmt)
    level_name = level.strip().upper()
    if level_name.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_name)
    logging.captureWarnings(True)
    return handler


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-format text|json`` (env RING_LOG_FORMAT, default text)."""
    parser.add_argument("--log-format", type=parse_format, default=os.environ.get(FORMAT_ENV, "text"),
                        help="text | json: one JSON object per line (env RING_LOG_FORMAT; default text)")
