"""The README tells the truth: its curl examples run as written against a real
broker, and its limits table is the one ring/limits.py generates."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from ring import limits

README = Path(__file__).resolve().parent.parent / "README.md"


def _section(name: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert match, f"README has no {name} section"
    return match.group(1)


def _commands(block: str) -> list[str]:
    """Shell commands of the fenced blocks, joining backslash continuations."""
    commands, current = [], ""
    for line in block.splitlines():
        if line.startswith("```") or line.startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def test_limits_table_matches_the_code() -> None:
    assert _section("limits").strip() == limits.markdown_table().strip(), (
        "README limits table is stale: regenerate it with `python -m ring.limits`")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_examples_run_as_written(make_broker) -> None:
    broker = make_broker()
    commands = _commands(_section("curl-examples"))
    assert len(commands) >= 8
    outputs = []
    for cmd in commands:
        cmd = cmd.replace("localhost:9250", f"127.0.0.1:{broker.local.port}")
        done = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=30)
        assert done.returncode == 0, (cmd, done.stderr)
        lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
        assert lines, f"no output from {cmd}"
        outputs.append([orjson.loads(ln) for ln in lines])
    created, one, many, ndjson, fetched, as_ndjson, described, by_time, out_of_range = outputs
    assert created[0]["name"] == "clicks"
    assert one[0]["count"] == 1 and many[0]["count"] == 2 and ndjson[0]["partition"] == 1
    assert [r["value"] for r in fetched[0]["records"]] == [{"page": "/help"}, {"page": "/login"}]
    assert [r["value"] for r in as_ndjson] == [{"page": "/help"}, {"page": "/login"}]
    assert [p["high_watermark"] for p in described[0]["partitions"]][1] == 2
    assert by_time[0]["offset"] == 0
    assert out_of_range[0]["error"] == "offset_out_of_range" and "earliest" in out_of_range[0]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_polarstreams_examples_run_as_written(make_broker) -> None:
    from tests.test_polarstreams import HOSTS, _free_on_all

    ports = _free_on_all(HOSTS[:1], 3)
    broker = make_broker("--polarstreams", "--polarstreams-ports", ",".join(map(str, ports)))
    local = {"9250": ports[0], "9251": ports[1], "9252": ports[2], "9256": broker.local.port}
    outputs = []
    for cmd in _commands(_section("polarstreams-examples")):
        cmd = re.sub(r"localhost:(925[0-26])", lambda m: f"127.0.0.1:{local[m.group(1)]}", cmd)
        done = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=30)
        assert done.returncode == 0, (cmd, done.stderr)
        outputs.append(done.stdout.decode())
    brokers, one, two, registered, polled, bye, group = outputs
    assert orjson.loads(brokers) == {"length": 1, "names": ["127.0.0.1"], "producerPort": ports[1],
                                     "consumerPort": ports[2]}
    assert (one, two, registered, bye) == ("OK", "OK", "OK", "OK")
    answer, status = polled.rsplit("]", 1)
    values = [v for item in orjson.loads(answer + "]") for v in item["values"]]
    assert sorted(values, key=orjson.dumps) == sorted([{"productId": 123, "units": -5}, {"productId": 7, "units": 1},
                                                      {"productId": 7, "units": 2}], key=orjson.dumps)
    assert status.strip() == "204"
    doc = orjson.loads(group)
    assert doc["members"] == [] and sum(o["committed"] or 0 for o in doc["offsets"]) == 3
    assert all(o["lag"] == 0 for o in doc["offsets"])
