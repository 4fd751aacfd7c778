"""The client subcommands (``ring topics|produce|consume|groups|cluster``) as a shell runs them.

Every test runs ``python -m ring ...`` as a real process against real brokers
(the session broker, the shared three-broker cluster, or a private broker
with client tokens) and checks what a script would: stdout, stderr and the
exit code (0 done, 1 the API refused, 2 bad usage, 3 no broker reachable).
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest

from ring.commands.positions import (Position, format_bytes, format_duration_ms, parse_bytes, parse_duration_ms,
                                    parse_position)
from ring.commands.base import UsageError, table
from ring.commands.consume import LEAVE_REQUEST_TIMEOUT_S, LEAVE_TIMEOUT_S
from ring.hashing import partition_for_key
from tests.brokers import REPO_ROOT, TestBroker, TestCluster

RUN_TIMEOUT_S = 60.0


def _env(brokers: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RING_")}
    env.update({"PYTHONPATH": str(REPO_ROOT), "RING_BROKERS": brokers, **extra})
    return env


def ring(url: str, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
         timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ring", *args], input=stdin, capture_output=True,
                          env=env or _env(url), timeout=timeout_s, cwd=REPO_ROOT)


@dataclass
class Ran:
    returncode: int
    stdout: bytes
    stderr: bytes


def cli(url: str, *args: str, stdin: bytes = b"") -> Ran:
    """The same command in this process (``ring.cli.main``), for the many checks whose point is
    not the process boundary: no interpreter start-up, so the suite stays short."""
    from ring.cli import main

    out, err = io.BytesIO(), io.BytesIO()
    streams = (io.TextIOWrapper(io.BytesIO(stdin)), io.TextIOWrapper(out, write_through=True),
               io.TextIOWrapper(err, write_through=True))
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = streams
    try:
        try:
            code = main([args[0], "--brokers", url, *args[1:]] if args else [])
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return Ran(code, out.getvalue(), err.getvalue())


def ok(proc: subprocess.CompletedProcess | Ran) -> bytes:
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode(errors="replace"))
    return proc.stdout


def json_of(proc: subprocess.CompletedProcess | Ran) -> Any:
    return orjson.loads(ok(proc))


def ndjson_of(proc: subprocess.CompletedProcess | Ran) -> list[Any]:
    return [orjson.loads(line) for line in ok(proc).splitlines()]


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# --- units: what the shell user writes -----------------------------------------------------


def test_positions_durations_and_sizes() -> None:
    assert parse_position("earliest") == Position("earliest") and parse_position("latest") == Position("latest")
    assert parse_position("42") == Position("offset", 42) and parse_position("-10") == Position("back", 10)
    assert parse_position("@1700000000000") == Position("timestamp", 1700000000000)
    assert parse_position("2023-11-14T22:13:20Z") == Position("timestamp", 1700000000000)
    assert parse_position("2023-11-14T22:13:20") == Position("timestamp", 1700000000000)  # UTC without a zone
    assert parse_position("2023-11-15T00:13:20+02:00") == Position("timestamp", 1700000000000)
    for bad in ("yesterday", "1.5", "@x", "--3"):
        with pytest.raises(UsageError):
            parse_position(bad)
    assert parse_duration_ms("7d", "-") == 604_800_000 and parse_duration_ms("90s", "-") == 90_000
    assert parse_duration_ms("1500", "-") == 1500 and parse_duration_ms("forever", "-") == -1
    assert parse_bytes("64MiB", "-") == 64 << 20 and parse_bytes("1GB", "-") == 10**9 and parse_bytes("-1", "-") == -1
    with pytest.raises(UsageError):
        parse_bytes("12 parsecs", "-")
    assert [format_bytes(n) for n in (-1, 0, 1023, 64 << 20, 3_353_805)] == ["unlimited", "0B", "1023B", "64MiB",
                                                                           "3.2MiB"]
    assert [format_duration_ms(ms) for ms in (-1, 604_800_000, 90_000, 1500)] == ["forever", "1w", "90s", "1500ms"]
    assert table(["A", "N"], [("x", 1), ("long", 100)]).splitlines() == ["A       N", "x       1", "long  100"]


# --- topics ----------------------------------------------------------------------------------


def test_topics_create_list_describe_delete(broker: TestBroker, topic: str) -> None:
    url = broker.url
    out = ok(cli(url, "topics", "create", topic, "-p", "3", "-r", "1", "--retention", "2d")).decode()
    assert out.startswith(f"topic {topic}: 3 partitions, replication factor 1, retention 2d")
    again = cli(url, "topics", "create", topic)
    assert again.returncode == 1 and b"already exists" in again.stderr and again.stdout == b""
    assert json_of(cli(url, "topics", "create", topic, "--if-not-exists", "--json"))["name"] == topic

    listed = json_of(cli(url, "topics", "list", "--json"))["topics"]
    mine = next(t for t in listed if t["name"] == topic)
    assert mine["partitions"] == 3 and mine["retention_ms"] == 2 * 86_400_000
    assert topic in ok(cli(url, "topics", "list")).decode()

    described = json_of(cli(url, "topics", "--json", "describe", topic))  # --json before the subcommand too
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    human = ok(cli(url, "topics", "describe", topic)).decode().splitlines()
    assert human[1].split()[:2] == ["PARTITION", "LEADER"] and len(human) == 2 + 3

    out = ok(cli(url, "topics", "alter", topic, "-p", "4", "--retention", "1d")).decode()
    assert out.startswith(f"topic {topic}: 4 partitions, replication factor 1, retention 1d")
    assert "(auto)" in ok(cli(url, "topics", "alter", topic, "--auto")).decode()
    assert json_of(cli(url, "topics", "alter", topic, "--no-auto", "--json"))["auto_partitions"] is False
    shrink = cli(url, "topics", "alter", topic, "-p", "2")
    assert shrink.returncode == 1 and b"never shrink" in shrink.stderr and shrink.stdout == b""
    assert cli(url, "topics", "alter", topic).returncode == 2  # nothing to change
    assert cli(url, "topics", "alter", topic, "-p", "many").returncode == 2
    assert [p["partition"] for p in json_of(cli(url, "topics", "describe", topic, "--json"))["partitions"]] == [0, 1, 2, 3]

    assert ok(cli(url, "topics", "delete", topic)).decode().strip() == f"deleted topic {topic}"
    gone = cli(url, "topics", "describe", topic)
    assert gone.returncode == 1 and f"unknown topic '{topic}'".encode() in gone.stderr
    assert cli(url, "topics", "delete", topic).returncode == 1
    assert cli(url, "topics", "delete", topic, "--if-exists").returncode == 0


# --- produce and consume ---------------------------------------------------------------------


def test_thousand_lines_round_trip_exactly(broker: TestBroker, topic: str) -> None:
    """Lines in, the same lines out: any bytes but newlines, empty lines included."""
    ok(cli(broker.url, "topics", "create", topic, "-p", "4", "-r", "1"))
    lines = [f"{i:04d}\tclick é ✓ {'x' * (i % 37)}".encode() for i in range(1000)]
    lines[10] = b""
    lines[11] = b"\xff\xfe not utf-8 \x00"
    lines[12] = b'{"looks": "like json"}'
    summary = json_of(ring(broker.url, "produce", topic, "--json", stdin=b"\n".join(lines) + b"\n"))
    assert summary["records"] == 1000 and summary["failed"] == 0
    assert sum(p["records"] for p in summary["partitions"].values()) == 1000

    out = ok(ring(broker.url, "consume", topic))
    assert sorted(out.split(b"\n")[:-1]) == sorted(lines) and out.endswith(b"\n")

    # One key: one partition, so the order is kept too.
    ok(cli(broker.url, "produce", topic, "--key", "k", stdin=b"\n".join(lines[:300]) + b"\n"))
    keyed = [r for r in ndjson_of(cli(broker.url, "consume", topic, "--json")) if r["key"] == "k"]
    assert len({r["partition"] for r in keyed}) == 1
    values = [base64.b64decode(r["value"]) if r.get("value_encoding") == "base64" else r["value"].encode()
              for r in keyed]
    assert values == lines[:300]


def test_ndjson_with_key_field_and_json_output(broker: TestBroker, topic: str) -> None:
    events = [{"user": f"u{i % 5}", "n": i, "page": "/cart"} for i in range(50)]
    body = b"\n".join(orjson.dumps(e) for e in events[:25]) + b"\n\n" + b"\n".join(
        orjson.dumps(e) for e in events[25:]) + b"\n"  # a blank line is skipped
    summary = json_of(cli(broker.url, "produce", topic, "--ndjson", "--key-field", "user", "--json", stdin=body))
    assert summary["records"] == 50 and summary["lines"] == 51

    records = ndjson_of(cli(broker.url, "consume", topic, "--json"))
    assert sorted(r["value"]["n"] for r in records) == list(range(50))
    assert all(r["key"] == r["value"]["user"] and r["topic"] == topic for r in records)
    partition_of = {}
    for r in records:  # a key always lands on one partition
        assert partition_of.setdefault(r["key"], r["partition"]) == r["partition"]
    # Without --json each event comes back as its JSON text, one per line.
    plain = [orjson.loads(line) for line in ok(cli(broker.url, "consume", topic)).splitlines()]
    assert sorted(e["n"] for e in plain) == list(range(50))

    bad = cli(broker.url, "produce", topic, "--ndjson", stdin=b'{"ok": 1}\nnot json\n{"ok": 2}\n')
    assert bad.returncode == 1 and b"line 2 is not JSON" in bad.stderr
    assert b"produced 1 record" in bad.stdout
    too_long = cli(broker.url, "produce", topic, "--json", stdin=b"fine\n" + b"x" * (1 << 20) * 2 + b"\nnever\n")
    assert too_long.returncode == 1 and json_of(Ran(0, too_long.stdout, b""))["records"] == 1
    assert orjson.loads(too_long.stderr)["message"].startswith("line 2 is longer than a record may be")


def test_consume_shows_records_without_value_and_repeated_headers(broker: TestBroker, topic: str) -> None:
    import msgpack

    http = broker.http
    assert http.create_topic(topic, partitions=1).status == 201
    body = msgpack.packb([{"key": "k", "value": b"v", "headers": [["a", b"1"], ["a", b"2"]]}, {"key": "k"}],
                         use_bin_type=True)
    assert http.produce(topic, body, "application/msgpack").status == 200
    assert ok(ring(broker.url, "consume", topic)) == b"v\nnull\n"  # as Kafka's console consumer prints it
    first, tomb = ndjson_of(cli(broker.url, "consume", topic, "--json"))
    assert first["headers"] == [["a", "1"], ["a", "2"]] and "value" not in tomb and tomb["key"] == "k"


def test_consume_from_positions_and_max(broker: TestBroker, topic: str) -> None:
    ok(cli(broker.url, "topics", "create", topic, "-p", "1", "-r", "1"))
    ok(cli(broker.url, "produce", topic, stdin=b"".join(b"a%d\n" % i for i in range(10))))
    time.sleep(0.05)
    mark = int(time.time() * 1000)
    time.sleep(0.05)
    ok(cli(broker.url, "produce", topic, stdin=b"".join(b"b%d\n" % i for i in range(10))))

    def read(*args: str) -> list[bytes]:
        return ok(cli(broker.url, "consume", topic, *args)).splitlines()

    assert len(read()) == 20
    assert read("--from", "latest") == []
    assert read("--from", "-3") == [b"b7", b"b8", b"b9"]
    assert read("--from", "5", "--partition", "0", "-n", "2") == [b"a5", b"a6"]
    assert read("--from", f"@{mark}") == [b"b%d" % i for i in range(10)]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mark / 1000)) + f".{mark % 1000:03d}Z"
    assert read("--from", iso) == [b"b%d" % i for i in range(10)]
    far = cli(broker.url, "consume", topic, "--from", "999", "--partition", "0")
    assert far.returncode == 1 and b"latest" in far.stderr  # 416 names the offsets there are


def test_follow_prints_new_records_and_ends_on_signals(broker: TestBroker, topic: str) -> None:
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        name = f"{topic}-{sig.name}"
        ok(cli(broker.url, "topics", "create", name, "-p", "2", "-r", "1"))
        # From the start of an empty topic: whenever the process gets going, it sees both.
        proc = subprocess.Popen([sys.executable, "-m", "ring", "consume", name, "-f"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(broker.url), cwd=REPO_ROOT)
        try:
            time.sleep(0.5)
            ok(cli(broker.url, "produce", name, stdin=b"one\ntwo\n"))
            got = b""
            deadline = time.monotonic() + 20
            while got.count(b"\n") < 2 and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], 0.5)
                if ready:
                    got += os.read(proc.stdout.fileno(), 4096)
            assert sorted(got.splitlines()) == [b"one", b"two"]
            proc.send_signal(sig)
            assert proc.wait(timeout=20) == code
            assert b"Traceback" not in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_a_closed_pipe_ends_consume_quietly(broker: TestBroker, topic: str) -> None:
    ok(cli(broker.url, "produce", topic, "--partition", "0",
            stdin=b"".join(b"%04d " % i + b"v" * 1000 + b"\n" for i in range(400))))
    proc = subprocess.Popen([sys.executable, "-m", "ring", "consume", topic, "--partition", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(broker.url), cwd=REPO_ROOT)
    try:
        assert proc.stdout.readline().startswith(b"0000 ")  # `| head -1`
        proc.stdout.close()
        assert proc.wait(timeout=20) == 0
        assert proc.stderr.read().strip() == b""  # no "committing: ..." note
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# --- exit codes ------------------------------------------------------------------------------


def test_exit_codes_of_the_process(broker: TestBroker) -> None:
    unknown = ring(broker.url, "consume", "no-such-topic-here")
    assert unknown.returncode == 1 and unknown.stdout == b""
    assert unknown.stderr.decode().strip() == "ring consume: unknown topic 'no-such-topic-here'"
    as_json = ring(broker.url, "topics", "describe", "no-such-topic-here", "--json")
    doc = orjson.loads(as_json.stderr)
    assert as_json.returncode == 1 and doc["error"] == "unknown_topic" and doc["status"] == 404
    assert as_json.stdout == b""
    usage = ring(broker.url, "consume", "t", "--from", "soon")
    assert usage.returncode == 2 and b"usage: ring consume" in usage.stderr
    dead = ring(_dead_url(), "produce", "t", stdin=b"x\n")
    assert dead.returncode == 3 and b"cannot reach any broker" in dead.stderr


def test_usage_errors_exit_2(broker: TestBroker) -> None:
    for usage in (["topics"], ["topics", "list", "--bogus"], ["consume"], ["consume", "t", "--from", "5"],
                  ["produce", "t", "--key-field", "x"], ["consume", "t", "--group", "g", "--partition", "0"],
                  ["consume", "t", "--group", "g", "--from", "-5"], ["consume", "t", "--consumer", "c"],
                  ["groups", "reset", "g", "t"], ["groups", "reset", "g", "t", "--to", "-1"],
                  ["produce", "t", "--key", "a", "--key-field", "b", "--ndjson"], ["topics", "create", "x",
                  "--retention", "a while"], ["consume", "t", "--max", "0"], ["topics", "list", "--ca-file", "/no"]):
        ran = cli(broker.url, *usage)
        assert ran.returncode == 2, (usage, ran.stderr)
        assert b"usage: ring" in ran.stderr, usage


def test_no_broker_reachable_exits_3(broker: TestBroker) -> None:
    dead = _dead_url()
    for args in (["topics", "list"], ["topics", "create", "t"], ["cluster", "status"], ["consume", "t"],
                 ["consume", "t", "--group", "g"], ["groups", "list"]):
        ran = cli(dead, *args)
        assert ran.returncode == 3, (args, ran.stderr)
        assert b"cannot reach any broker" in ran.stderr
    # Several brokers: any one answering is enough.
    assert cli(f"{dead},{broker.url}", "topics", "list").returncode == 0


# --- a cluster ---------------------------------------------------------------------------------


def test_cluster_status_and_a_round_trip_through_any_broker(shared_cluster: TestCluster, topic: str) -> None:
    urls = ",".join(m.url for m in shared_cluster)
    env = _env(urls)
    status = json_of(ring(urls, "cluster", "status", "--json", env=env))
    assert sorted(b["name"] for b in status["brokers"]) == ["ring-0", "ring-1", "ring-2"]
    assert {b["status"] for b in status["brokers"]} == {"up"}
    assert {b["clock"]["state"] for b in status["brokers"]} == {"ok"}  # every clock agrees with the others
    human = ok(cli(urls, "cluster", "status")).decode()
    assert human.startswith("3 brokers: 3 up") and all(f"ring-{i}" in human for i in range(3))
    assert "CLOCK" in human.splitlines()[1] and "out of bounds" not in human

    ok(cli(urls, "topics", "create", topic, "-p", "6", "-r", "3"))
    lines = [b"event-%d" % i for i in range(1000)]
    ok(cli(urls, "produce", topic, "--consistency", "all", stdin=b"\n".join(lines) + b"\n"))
    # Read back through another broker alone: it learns the rest of the cluster from it.
    out = ok(cli(shared_cluster[2].url, "consume", topic))
    assert sorted(out.splitlines()) == sorted(lines)


# --- groups ------------------------------------------------------------------------------------


def test_group_consume_commits_what_it_printed(broker: TestBroker, topic: str) -> None:
    group = "g-" + topic
    ok(cli(broker.url, "topics", "create", topic, "-p", "3", "-r", "1"))
    ok(cli(broker.url, "produce", topic, "--key", "one-partition",
            stdin=b"".join(b"r%02d\n" % i for i in range(30))))

    first = ok(cli(broker.url, "consume", topic, "--group", group, "-n", "10")).splitlines()
    second = ok(cli(broker.url, "consume", topic, "--group", group, "-n", "5")).splitlines()
    assert first == [b"r%02d" % i for i in range(10)] and second == [b"r%02d" % i for i in range(10, 15)]

    listed = json_of(cli(broker.url, "groups", "list", "--json"))["groups"]
    mine = next(g for g in listed if g["group"] == group)
    assert mine["members"] == []  # each run left the group
    described = json_of(cli(broker.url, "groups", "describe", group, "--json"))
    committed = {o["partition"]: o["committed"] for o in described["offsets"] if o["committed"] is not None}
    assert sorted(committed.values()) == [15] and sum(o["lag"] or 0 for o in described["offsets"]) == 15
    assert group in ok(cli(broker.url, "groups", "list")).decode()
    assert "LAG" in ok(cli(broker.url, "groups", "describe", group)).decode()

    rest = ok(cli(broker.url, "consume", topic, "--group", group, "--json"))
    assert [orjson.loads(r)["value"] for r in rest.splitlines()] == ["r%02d" % i for i in range(15, 30)]

    moved = json_of(cli(broker.url, "groups", "reset", group, topic, "--to", "earliest", "--json"))
    assert sorted(o["partition"] for o in moved["offsets"]) == [0, 1, 2]
    assert len(ok(cli(broker.url, "consume", topic, "--group", group)).splitlines()) == 30
    ok(cli(broker.url, "groups", "reset", group, topic, "--to", "28"))
    assert ok(cli(broker.url, "consume", topic, "--group", group)).splitlines() == [b"r28", b"r29"]

    assert cli(broker.url, "consume", "no-such-topic-" + topic, "--group", group).returncode == 1
    missing = cli(broker.url, "groups", "describe", "no-such-group-" + topic)
    assert missing.returncode == 1 and missing.stderr.startswith(b"ring groups describe: ")


@contextlib.contextmanager
def _running(brokers: str, *args: str) -> Iterator[subprocess.Popen]:
    """``ring ARGS`` as a process the test talks to, killed if the test leaves it running."""
    proc = subprocess.Popen([sys.executable, "-m", "ring", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(brokers, PYTHONFAULTHANDLER="1"), cwd=REPO_ROOT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _read_until(proc: subprocess.Popen, want: bytes) -> bytes:
    """What ``proc`` printed until it holds ``want``, read unbuffered: a line read ahead into a
    buffer would never make select() ready."""
    got = b""
    while want not in got:
        ready, _, _ = select.select([proc.stdout], [], [], RUN_TIMEOUT_S)
        assert ready, proc.stderr.read() if proc.poll() is not None else f"printed only {got!r}"
        got += os.read(proc.stdout.fileno(), 4096)
    return got


def _interrupted_quietly(proc: subprocess.Popen) -> None:
    """Ctrl-C: it commits what it printed and leaves, with exit 130 and nothing on stderr; within
    the time leaving has (and a request's timeout) even if the broker does not answer."""
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=LEAVE_TIMEOUT_S + LEAVE_REQUEST_TIMEOUT_S + 5)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: where it is stuck, on stderr
        proc.wait(timeout=RUN_TIMEOUT_S)
        raise AssertionError(f"still running after Ctrl-C: {proc.stderr.read().decode(errors='replace')}") from None
    assert code == 130, proc.stderr.read()
    assert proc.stderr.read().strip() == b""  # no "committing: ..." note, no traceback


def test_group_consume_commits_the_partitions_it_kept_when_one_moved(broker: TestBroker, topic: str) -> None:
    """A partition it printed moved to another member before the final commit: the commit keeps
    what the command still holds, and says which partition was not committed."""
    group = "g-" + topic
    ok(cli(broker.url, "topics", "create", topic, "-p", "2", "-r", "1"))
    for p in (0, 1):
        ok(cli(broker.url, "produce", topic, "--partition", str(p), stdin=b"".join(b"p%d-%02d\n" % (p, i)
                                                                                  for i in range(10))))
    with _running(broker.url, "consume", topic, "--group", group, "--follow", "-n", "25", "--consumer", "cli") as proc:
        lines = [proc.stdout.readline() for _ in range(20)]  # both partitions, in its first poll
        assert sorted(lines) == sorted(b"p%d-%02d\n" % (p, i) for p in (0, 1) for i in range(10))
        # The next poll commits what the first handed out: once that shows, the poll is waiting and
        # the other member's join is what moves a partition away from it.
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while {o["partition"]: o["committed"] for o in json_of(cli(
                broker.url, "groups", "describe", group, "--json"))["offsets"]} != {0: 10, 1: 10}:
            assert time.monotonic() < deadline, "the second poll never reached the broker"
            time.sleep(0.05)
        joined = broker.http.post(f"/v1/groups/{group}/members", json_body={"consumer": "other", "topics": [topic]})
        assert joined.status == 200, joined.body
        [moved] = [a["partition"] for a in joined.json()["assignment"]]
        kept = 1 - moved
        ok(cli(broker.url, "produce", topic, "--partition", str(kept),
                stdin=b"".join(b"p%d-%02d\n" % (kept, i) for i in range(10, 15))))
        assert proc.wait(timeout=RUN_TIMEOUT_S) == 0  # after 25 records: it printed the 5 new ones
        rest = proc.stdout.read()
        assert sorted(rest.splitlines()) == [b"p%d-%02d" % (kept, i) for i in range(10, 15)]
        stderr = proc.stderr.read().decode()
    described = json_of(cli(broker.url, "groups", "describe", group, "--json"))
    committed = {o["partition"]: o["committed"] for o in described["offsets"]}
    assert committed[kept] == 15  # all it printed of the partition it kept
    assert committed[moved] == 10  # its first poll's, committed by the next poll; not the moved one's last
    assert f"not committed: {topic}/{moved}" in stderr, stderr


def test_a_leaving_call_ends_within_its_time_even_if_the_broker_never_answers() -> None:
    """``Api.within``: a broker that accepts and never answers gets the request again on a fresh
    connection after each request's timeout, and the call gives up once the time is spent (what
    ``ring consume --group`` leaving on Ctrl-C relies on to end)."""
    from ring.client.transport import BrokerUnreachable
    from ring.commands.api import Api

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        api = Api([f"http://127.0.0.1:{server.getsockname()[1]}"], timeout_s=30)
        api.within(1.5, 0.4)
        started = time.monotonic()
        with pytest.raises(BrokerUnreachable):
            api.call("DELETE", "/v1/groups/g/members/m", repeatable=True)
        spent_s = time.monotonic() - started
        accepted = []
        server.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                accepted.append(server.accept()[0])
        for conn in accepted:
            conn.close()
    assert len(accepted) >= 2  # sent again, each time on a new connection
    assert spent_s < 1.5 + 0.4 + 1.0  # the time given, one request's timeout, and a last pause's rounding


def test_group_consume_follows_through_a_broker_restart(make_broker: Any, topic: str) -> None:
    """``--follow --group`` keeps polling while its only broker is down for 5 s (the group's
    coordinator with it) and prints what is produced once it is back."""
    b = make_broker()
    ok(cli(b.url, "topics", "create", topic, "-p", "1", "-r", "1"))
    ok(cli(b.url, "produce", topic, stdin=b"before\n"))
    with _running(b.url, "consume", topic, "--group", "g", "--follow") as proc:
        assert _read_until(proc, b"before\n") == b"before\n"
        b.kill()
        time.sleep(5)  # the outage itself, not a wait for something to happen
        assert proc.poll() is None, proc.stderr.read()
        b.local.start()  # same port, same data
        ok(cli(b.url, "produce", topic, stdin=b"after\n"))
        # "before" may come again (at-least-once): the poll that would have committed it may not
        # have reached the broker before the kill.
        got = _read_until(proc, b"after\n")
        assert got in (b"after\n", b"before\nafter\n"), got
        _interrupted_quietly(proc)  # mid-poll: the final commit must not reuse that connection


def test_group_consume_leaves_cleanly_on_ctrl_c_mid_poll(broker: TestBroker, topic: str) -> None:
    """Ctrl-C while ``--follow --group`` long-polls: the final commit and the leave go out on a
    fresh connection (the interrupted one is half used), so the command ends quietly with 130
    and the group has no member left."""
    group = "g-" + topic
    ok(cli(broker.url, "topics", "create", topic, "-p", "1", "-r", "1"))
    ok(cli(broker.url, "produce", topic, stdin=b"a\nb\n"))
    with _running(broker.url, "consume", topic, "--group", group, "--follow") as proc:
        assert _read_until(proc, b"a\nb\n") == b"a\nb\n"
        # The next poll commits what the first handed out: once that shows, the poll is waiting.
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while json_of(cli(broker.url, "groups", "describe", group, "--json"))["offsets"][0]["committed"] != 2:
            assert time.monotonic() < deadline, "the second poll never reached the broker"
            time.sleep(0.05)
        _interrupted_quietly(proc)
    mine = next(g for g in json_of(cli(broker.url, "groups", "list", "--json"))["groups"] if g["group"] == group)
    assert mine["members"] == []


def test_group_consume_rides_out_a_commit_answered_outcome_unknown(make_cluster: Any, topic: str) -> None:
    """The other replicas of the group's offsets partition SIGKILLed: a poll committing what was
    printed waits for a quorum that is gone and is answered 504 before they are convicted. The
    poll may be sent again, so ``--follow --group`` keeps trying until they are back 8 s later."""
    c = make_cluster(3)
    urls, group = ",".join(m.url for m in c), "g-" + topic
    ok(cli(urls, "topics", "create", topic, "-p", "6", "-r", "1"))
    ok(cli(urls, "consume", topic, "--group", "warm-up"))  # the offsets topic exists from here on
    offsets = c[0].http.get("/v1/topics/__offsets").json()
    coordinator = c.member(offsets["partitions"][partition_for_key(group.encode(),
                                                                   offsets["partition_count"])]["leader"])
    [p, *_] = [p for p, leader in c.leaders(topic).items() if leader == coordinator.name]  # stays up with it
    produce = ("produce", topic, "--partition", str(p))

    def wait_committed(n: int) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            described = json_of(cli(coordinator.url, "groups", "describe", group, "--json"))
            if {o["partition"]: o["committed"] for o in described["offsets"]}.get(p) == n:
                return
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)

    ok(cli(coordinator.url, *produce, stdin=b"before\n"))
    with _running(urls, "consume", topic, "--group", group, "--follow") as proc:
        assert _read_until(proc, b"before\n") == b"before\n"
        wait_committed(1)  # by the next poll, now waiting
        victims = [m for m in c if m is not coordinator]
        for m in victims:
            m.kill()
        killed_at = time.monotonic()
        ok(cli(coordinator.url, *produce, stdin=b"during\n"))
        assert _read_until(proc, b"during\n") == b"during\n"
        while time.monotonic() - killed_at < 8:  # its next poll commits "during": 504 after 5 s
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        for m in victims:
            m.local.start()
        wait_committed(2)
        _interrupted_quietly(proc)


# --- a terminal, and tokens --------------------------------------------------------------------


def _with_tty_stderr(url: str, args: list[str], stdin_path: Path, stdout_path: Path) -> tuple[int, bytes]:
    """Run with stderr on a pseudo-terminal (stdin and stdout files); its return code and what the tty showed."""
    master, slave = pty.openpty()
    with open(stdin_path, "rb") as fin, open(stdout_path, "wb") as fout:
        proc = subprocess.Popen([sys.executable, "-m", "ring", *args], stdin=fin, stdout=fout, stderr=slave,
                                env=_env(url), cwd=REPO_ROOT)
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=10), shown


def test_progress_only_on_a_terminal(broker: TestBroker, topic: str, tmp_path: Path) -> None:
    data = tmp_path / "in.txt"
    data.write_bytes(b"".join(b"line %d\n" % i for i in range(3_000)))
    code, shown = _with_tty_stderr(broker.url, ["produce", topic], data, tmp_path / "out.txt")
    assert code == 0 and b"%" in shown and b"records" in shown and b"\r" in shown
    assert (tmp_path / "out.txt").read_bytes().startswith(b"produced 3,000 records")
    code, shown = _with_tty_stderr(broker.url, ["consume", topic], data, tmp_path / "read.txt")
    assert code == 0 and b"reading" in shown
    assert sorted((tmp_path / "read.txt").read_bytes().splitlines()) == sorted(data.read_bytes().splitlines())
    # In a pipe there is no progress line at all.
    piped = ring(broker.url, "produce", topic, stdin=b"x\n")
    assert piped.returncode == 0 and piped.stderr == b""


def test_token_is_sent_as_a_bearer(make_broker: Any, tmp_path: Path, topic: str) -> None:
    from ring.auth import file_line

    tokens = tmp_path / "tokens"
    tokens.write_text(file_line("tok-cli-admin", "ops", "admin", "*") + "\n")
    b = make_broker("--auth-tokens", str(tokens), name="ring-0")
    denied = cli(b.url, "topics", "list")
    assert denied.returncode == 1 and b"Traceback" not in denied.stderr
    ok(ring(b.url, "produce", topic, stdin=b"secret\n", env=_env(b.url, RING_CLIENT_TOKEN="tok-cli-admin")))
    assert ok(cli(b.url, "consume", topic, "--token", "tok-cli-admin")) == b"secret\n"
    assert cli(b.url, "consume", topic, "--token", "nope").returncode == 1
    assert cli(b.url, "topics", "describe", topic, "--token", "tok-cli-admin").returncode == 0
