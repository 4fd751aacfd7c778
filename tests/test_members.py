"""``ring serve --members N``: one command runs N brokers on a host (ring/commands/members.py).

The members' names, ports, data directories, seeds and host label from the
host's flags (unit), and on real processes: both members join as one host,
the host's one client port answers (and forwards what the member behind it
does not lead), a member that crashes is started again, and SIGTERM stops
every member cleanly.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ring.cli import build_parser
from ring.localcluster import free_port
from ring.commands.members import members_of
from tests.brokers import REPO_ROOT
from tests.support import Http, wait_for

STOP_S_MAX = 60.0


def _args(*flags: str):
    argv = ["serve", *flags]
    args, rest = build_parser().parse_known_args(argv)
    assert not rest
    return args, argv


def test_members_take_names_ports_data_directories_and_seeds_from_the_hosts_flags(tmp_path: Path) -> None:
    args, argv = _args("--members", "3", "--name", "ring-2", "--listen", "0.0.0.0:9250", "--data-dir",
                       str(tmp_path), "--host", "rack1-a", "--cluster-secret", "s3cret")
    ms = members_of(args, argv)
    assert [m.name for m in ms] == ["ring-6", "ring-7", "ring-8"]  # host 2 of three members each
    assert [(m.client_port, m.peer_port) for m in ms] == [(9260, 9261), (9262, 9263), (9264, 9265)]
    for i, m in enumerate(ms):
        own, _ = build_parser().parse_known_args(m.argv[3:])  # (python -m ring ...)
        assert own.members == 1 and own.name == m.name and own.shared_port == 9250
        assert own.listen == ("0.0.0.0", 9260 + 2 * i) and own.peer_listen == ("0.0.0.0", 9261 + 2 * i)
        assert own.data_dir == tmp_path / m.name and own.host_label == "rack1-a"
        assert set(own.seeds) == {f"127.0.0.1:{9261 + 2 * j}" for j in range(3) if j != i}
        assert own.cluster_secret == "s3cret"


@pytest.mark.parametrize(("flags", "message"), [
    (["--name", "broker", "--listen", "127.0.0.1:9250"], "ordinal"),
    (["--name", "ring-0", "--listen", "127.0.0.1:9250", "--token", "5"], "--token"),
    (["--name", "ring-0", "--listen", "127.0.0.1:0"], "fixed --listen port"),
    (["--name", "ring-0", "--listen", "127.0.0.1:9250", "--seeds", "10.1.1.1:9251"], "secret"),
    (["--name", "ring-0", "--listen", "127.0.0.1:9250", "--member-ports", "9249"], "--member-ports"),
])
def test_flags_that_cannot_make_members_are_refused(flags: list[str], message: str) -> None:
    args, argv = _args("--members", "2", *flags)
    with pytest.raises(ValueError, match=message):
        members_of(args, argv)


def test_members_auto_is_one_per_core() -> None:
    args, _ = _args("--members", "auto")
    assert args.members == len(os.sched_getaffinity(0))


def _ports(n: int) -> tuple[int, int]:
    """A free client port and a base with ``2n`` free ports after it."""
    for _ in range(200):
        base = free_port()
        ok = True
        for port in range(base, base + 2 * n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return free_port(), base
    raise AssertionError("no free ports")


def test_a_host_of_two_members_serves_on_one_port_restarts_a_crashed_member_and_stops_cleanly(
        tmp_path: Path, topic: str) -> None:
    port, base = _ports(2)
    log_path = tmp_path / "host.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ring", "serve", "--members", "2", "--name", "ring-0", "--listen",
             f"127.0.0.1:{port}", "--member-ports", str(base), "--data-dir", str(tmp_path / "data"),
             "--host", "host-a", "--fsync", "interval:100"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    shared = Http("127.0.0.1", port)
    try:
        def joined() -> dict | None:
            doc = shared.get("/v1/cluster").json()
            brokers = {b["name"]: b for b in doc.get("brokers", [])}
            return brokers if sorted(brokers) == ["ring-0", "ring-1"] and all(
                b["status"] == "up" for b in brokers.values()) else None

        brokers = wait_for("both members up, seen through the shared port", joined, 60.0, errors=(OSError,))
        assert {b["host"] for b in brokers.values()} == {"host-a"}
        assert {b["client_url"] for b in brokers.values()} == {f"http://127.0.0.1:{base}",
                                                               f"http://127.0.0.1:{base + 2}"}
        # Each member's own data directory.
        assert (tmp_path / "data" / "ring-0").is_dir() and (tmp_path / "data" / "ring-1").is_dir()
        wait_for("the topic is created", lambda: shared.create_topic(topic, partitions=4).status == 201, 30.0)
        # Through the one port: every partition takes records, whichever member the kernel picked.
        for i in range(40):
            r = shared.post(f"/v1/topics/{topic}/messages", json_body={"i": i}, query={"partition": i % 4})
            assert r.status in (200, 201), r.body
        wait_for("40 records committed", lambda: Http("127.0.0.1", base).end_offsets(topic) == [10] * 4, 30.0)
        answered = {shared.get("/v1/status").json()["name"] for _ in range(200)}  # the kernel spreads them
        assert answered == {"ring-0", "ring-1"}, answered

        # A member that crashes is started again.
        pids = dict(re.findall(rb"member (ring-\d) started, pid (\d+)", log_path.read_bytes()))
        os.kill(int(pids[b"ring-1"]), signal.SIGKILL)
        wait_for("ring-1 started again", lambda: len(re.findall(
            rb"member ring-1 started, pid", log_path.read_bytes())) == 2, 30.0)
        gen = brokers["ring-1"]["generation"]
        wait_for("ring-1 back, a new generation", lambda: (b := joined()) and b["ring-1"]["generation"] != gen,
                 60.0, errors=(OSError,))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(STOP_S_MAX)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    text = log_path.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "member ring-0 stopped (exit 0)" in text and "member ring-1 stopped (exit 0)" in text
    for pid in re.findall(r"member ring-\d started, pid (\d+)", text):
        assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()
