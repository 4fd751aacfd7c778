"""The commands of docs/CLI.md, docs/CLIENT.md and docs/SECURITY.md run as written, in a reader's
shell (``tests.docs.Shell``), and print what the docs say: ``ring serve`` alone, the client
commands against the three brokers of ``make cluster``, the Python client's example in
``python -m asyncio``'s way (top-level ``await``), and a broker with TLS and client tokens.
``ring serve``'s flags table names every flag the parser has."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import re
import shutil
from pathlib import Path

import orjson

from ring import cli
from tests.docs import REPO_ROOT, Shell, code, commands, run_cluster_stop, section
from tests.secure_cluster import make_pki
from tests.support import require


def test_serve_flags_table_names_every_flag() -> None:
    serve = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "serve")[1]
    flags = {opt for action in serve._actions for opt in action.option_strings if opt.startswith("--")} - {"--help"}
    table = (REPO_ROOT / "docs" / "CLI.md").read_text().split("## `ring serve`", 1)[1].split("\n## ", 1)[0]
    missing = sorted(f for f in flags if f"`{f}`" not in table)
    assert not missing, f"docs/CLI.md's ring serve table does not name {missing}"


def test_serve_example_runs_as_written(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    (cmd,) = commands(section("serve-example"))
    shell.run(cmd)  # waits until it answers /v1/status
    assert shell.stop_servers() == [0], "ring serve did not end cleanly on SIGTERM"
    assert (tmp_path / "var" / "ring-0" / "clean-shutdown").exists()


def test_cli_examples_run_as_written(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    try:
        shell.run("make cluster")
        out = {}
        for cmd in commands(section("cli-examples")):
            if "--follow" in cmd:
                # Ctrl-C ends it: once both records are out, SIGINT, and the exit code of an interrupt
                code_, printed = shell.interrupt_when(cmd, lambda b: b.count(b"\n") >= 2)
                assert code_ == 130 and printed.count(b"\n") == 2, (code_, printed)
                continue
            out[cmd.split("#")[0].strip()] = shell.run(cmd)
        text = {k: v.stdout.decode() for k, v in out.items()}
        assert (tmp_path / "numbers.txt").read_text().splitlines() == [str(n) for n in range(1, 1001)]
        last = [orjson.loads(line) for line in text["ring consume clicks --from -10 --json"].splitlines()]
        assert sorted(r["key"] for r in last) == ["u1", "u2"] and {r["value"]["user"] for r in last} == {"u1", "u2"}
        assert len(text["ring consume clicks --group dashboards --max 1000"].splitlines()) == 2
        described = text["ring groups describe dashboards"]
        assert "lag 0" in described.splitlines()[0], described
        assert "3 brokers: 3 up" in text["ring cluster status"]
    finally:
        run_cluster_stop(shell)


def test_client_example_runs_as_written(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    try:
        shell.run("make cluster")
        source = shell.local(code("client-example"))
        compiled = compile(source, "docs/CLIENT.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            pending = eval(compiled, {})  # the asyncio REPL's way: a coroutine when the code awaits
            asyncio.run(pending)
        lines = out.getvalue().splitlines()
        assert lines[:2] == ["0 b'user-1' {'page': '/'}", "1 1"], lines  # its record; next offset, high watermark
        assert re.fullmatch(r"RecordMetadata\(topic='clicks', partition=\d+, offset=\d+, timestamp=\d+\)", lines[-1])
    finally:
        run_cluster_stop(shell)


def test_security_example_runs_as_written(tmp_path: Path) -> None:
    require(None if shutil.which("curl") else "curl is not installed")
    make_pki(tmp_path)  # broker.pem, broker.key and ca.pem, as the reader has them
    shell = Shell(tmp_path)
    try:
        cmds = commands(section("security-example"))
        done = [shell.run(cmd) for cmd in cmds[:-1]]
        refused = shell.run(cmds[-1], check=False)
        token = (tmp_path / "alice.token").read_text().strip()
        assert len(token) >= 40 and "alice  produce,consume  orders,clicks-*" in (tmp_path / "tokens.txt").read_text()
        assert orjson.loads(done[2].stdout) == {"topic": "orders", "partition": 0, "base_offset": 0, "count": 1}
        assert done[4].stdout.decode().startswith("produced 1 record")
        assert sorted(map(orjson.loads, done[5].stdout.splitlines()), key=str) == [{"id": 1}, {"id": 2}]
        assert refused.returncode == 1 and b"needs admin on topic 'orders'" in refused.stderr, refused
        anonymous = shell.run("curl -s --cacert ca.pem https://127.0.0.1:9250/v1/topics")
        assert orjson.loads(anonymous.stdout)["error"] == "unauthorized"
    finally:
        shell.stop_servers()
