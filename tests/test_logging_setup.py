"""Structured logs: ``configure(level, fmt)`` and the ``--log-format`` flag.

JSON mode writes exactly one JSON object per record and per line, whatever
the message or traceback holds, with the extra fields a caller passed; text
mode stays readable; the level filters; configuring twice does not double
lines. The last test asks a real ``ring serve`` once cli.py hands the flag on.
"""

from __future__ import annotations

import argparse
import io
import logging
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Iterator

import orjson
import pytest

from ring import logging_setup
from ring.localcluster import free_port
from tests.brokers import REPO_ROOT


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict]:
    text = stream.getvalue()
    assert text.endswith("\n")
    return [orjson.loads(line) for line in text.splitlines()]


def test_json_lines_carry_the_fields_and_extras(restore_root: None) -> None:
    out = io.StringIO()
    logging_setup.configure("info", "json", stream=out)
    log = logging.getLogger("ring.test")
    log.debug("not shown")
    log.info("produced %d records", 3, extra={"topic": "clicks", "partition": 2, "path": Path("/x")})
    log.warning("two\nlines \"quoted\" ✓")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed", extra={"topic": "t"})
    lines = _lines(out)
    assert len(lines) == 3
    first = lines[0]
    assert first["level"] == "info" and first["logger"] == "ring.test" and first["msg"] == "produced 3 records"
    assert first["topic"] == "clicks" and first["partition"] == 2 and first["path"] == "/x"
    ts = datetime.fromisoformat(first["ts"].replace("Z", "+00:00"))
    assert ts.tzinfo is not None and first["ts"].endswith("Z")
    assert lines[1]["msg"] == "two\nlines \"quoted\" ✓" and lines[1]["level"] == "warning"
    assert lines[2]["level"] == "error" and "ValueError: boom" in lines[2]["exc"] and lines[2]["topic"] == "t"
    assert "args" not in first and "levelno" not in first  # no LogRecord internals


def test_text_format_and_levels(restore_root: None) -> None:
    out = io.StringIO()
    logging_setup.configure("WARNING", "text", stream=out)
    logging.getLogger("ring.x").info("quiet")
    logging.getLogger("ring.x").warning("loud %s", "yes")
    [line] = out.getvalue().splitlines()
    assert line.endswith("WARNING ring.x: loud yes")


def test_configuring_again_replaces_the_handler(restore_root: None) -> None:
    first, second = io.StringIO(), io.StringIO()
    logging_setup.configure("info", "json", stream=first)
    logging_setup.configure("info", "json", stream=second)
    logging.getLogger("ring.y").info("once")
    assert first.getvalue() == "" and len(_lines(second)) == 1


def test_bad_values_are_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        logging_setup.configure("info", "xml")
    with pytest.raises(ValueError):
        logging_setup.configure("verbose", "json")


def test_the_flag_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    p = argparse.ArgumentParser()
    logging_setup.add_arguments(p)
    assert p.parse_args([]).log_format == "text"
    assert p.parse_args(["--log-format", "JSON"]).log_format == "json"
    monkeypatch.setenv("RING_LOG_FORMAT", "json")
    p = argparse.ArgumentParser()
    logging_setup.add_arguments(p)
    assert p.parse_args([]).log_format == "json"
    with pytest.raises(SystemExit):
        p.parse_args(["--log-format", "yaml"])


def test_a_broker_logs_json_when_asked(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ring", "serve", "--name", "ring-0",
                             "--data-dir", str(tmp_path / "d"), "--listen", f"127.0.0.1:{port}", "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "listening on": the broker is up and has logged its start
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert lines, "the broker logged nothing"
    for ln in lines:
        doc = orjson.loads(ln)
        assert {"ts", "level", "logger", "msg"} <= set(doc)
