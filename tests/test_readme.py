"""README.md and docs/ tell the truth: the README's tour and the HTTP API's, PolarStreams' and
growing topics' examples run as written against real brokers and print what they say; the limits
table is the one ring/limits.py generates; the HTTP API's route table names every route the
OpenAPI document describes; the README stays a front door. The command line's, client's and
security examples are run by tests/test_docs_commands.py, the consumer groups' by
tests/test_groups_readme.py, the Spark ones by tests/spark/test_readme_spark.py. Every block of
commands in README.md and docs/ is run by one of them, or listed in UNRUN with the reason."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import orjson

from ring import limits
from ring.http_api import openapi
from tests.docs import DOCS, README, REPO_ROOT, Shell, commands, run_cluster_stop, section, sections
from tests.support import require

README_BYTES_MAX = 15 * 1024  # a front door: what ring is, two commands, a tour, where to go next

# Blocks of commands in README.md and docs/ that no test runs, and why they cannot run here.
UNRUN = {
    ("OPERATIONS.md", "docker build --target broker"): "needs a Docker engine and a Kubernetes cluster "
                                                        "(tests/test_deploy_k8s.py checks the manifests)",
    ("OPERATIONS.md", "python3 -m venv /opt/ring/venv"): "installs a systemd unit as root on the host "
                                                        "(tests/test_deploy_k8s.py checks the unit and its "
                                                        "environment files)",
    ("OPERATIONS.md", "ring serve --members auto --name ring-0"): "a synopsis of two hosts' commands; "
                                                                   "tests/test_members.py runs a host of members",
    ("SECURITY.md", "ring serve --tls-cert broker.pem"): "a synopsis of the flags; the same command runs in "
                                                          "the security-example block",
    ("SPARK.md", "spark-submit --master spark://master:7077"): "a synopsis with hosts' names; "
                                                                "tests/spark/test_spark_standalone.py "
                                                                "submits the same job to a cluster on loopback",
    ("SECURITY.md", "python -m tests.soak --seconds 300"): "five minutes of load; tests/test_soak.py runs 30 s",
    ("SPARK.md", "python -m ring.bench.spark_kafka"): "starts three Apache Kafka JVMs beside three brokers and "
                                                      "runs for minutes; tests/spark/test_spark_kafka_source.py "
                                                      "reads ring through Spark's Kafka source",
}


def _curl() -> None:
    require(None if shutil.which("curl") else "curl is not installed")


def test_readme_is_a_front_door() -> None:
    size = README.stat().st_size
    assert size <= README_BYTES_MAX, f"README.md is {size} bytes: the reference belongs in docs/"
    text = README.read_text()
    for doc in sorted((REPO_ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in text, f"README's 'Where to go next' does not link docs/{doc.name}"


def test_limits_table_matches_the_code() -> None:
    assert section("limits").strip() == limits.markdown_table().strip(), (
        "docs/LIMITS.md's table is stale: regenerate it with `python -m ring.limits --write docs/LIMITS.md`")


def test_http_api_doc_names_every_route() -> None:
    text = (REPO_ROOT / "docs" / "HTTP-API.md").read_text()
    for path, item in openapi.document()["paths"].items():
        for method in item:
            if method in ("get", "post", "put", "patch", "delete"):
                assert f"`{method.upper()} {path}`" in text, f"docs/HTTP-API.md does not name {method.upper()} {path}"


def test_curl_and_growing_examples_run_as_written(make_broker) -> None:
    _curl()
    broker = make_broker()
    port = broker.local.port
    outputs = []
    for cmd in commands(section("curl-examples")) + commands(section("growing-examples")):
        cmd = cmd.replace("localhost:9250", f"127.0.0.1:{port}")
        done = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=30)
        assert done.returncode == 0, (cmd, done.stderr)
        lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
        assert lines, f"no output from {cmd}"
        outputs.append([orjson.loads(ln) for ln in lines])
    created, one, many, ndjson, fetched, as_ndjson, described, by_time, out_of_range, grown, auto = outputs
    assert created[0]["name"] == "clicks"
    assert one[0]["count"] == 1 and many[0]["count"] == 2 and ndjson[0]["partition"] == 1
    assert [r["value"] for r in fetched[0]["records"]] == [{"page": "/help"}, {"page": "/login"}]
    assert [r["value"] for r in as_ndjson] == [{"page": "/help"}, {"page": "/login"}]
    assert [p["high_watermark"] for p in described[0]["partitions"]][1] == 2
    assert by_time[0]["offset"] == 0
    assert out_of_range[0]["error"] == "offset_out_of_range" and "earliest" in out_of_range[0]
    assert len(grown[0]["partitions"]) == 12 and grown[0]["base_partitions"] == 4
    assert [p["high_watermark"] for p in grown[0]["partitions"]][1] == 2, "growing moved a partition's records"
    assert auto[0]["name"] == "jobs" and auto[0]["auto_partitions"] is True and len(auto[0]["partitions"]) == 1


def test_polarstreams_examples_run_as_written(make_broker) -> None:
    from tests.test_polarstreams import HOSTS, _free_on_all

    _curl()
    ports = _free_on_all(HOSTS[:1], 3)
    broker = make_broker("--polarstreams", "--polarstreams-ports", ",".join(map(str, ports)))
    local = {"9250": ports[0], "9251": ports[1], "9252": ports[2], "9256": broker.local.port}
    outputs = []
    for cmd in commands(section("polarstreams-examples")):
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


def run_tour(shell: Shell) -> list[subprocess.CompletedProcess]:
    """The README tour's shell block, checked as it goes; the brokers stay up."""
    cmds = commands(section("tour"))
    assert cmds[0] == "make cluster"
    done = [shell.run(c) for c in cmds]
    out = [d.stdout.decode() for d in done]
    _, created, produced, fetched, exported, ring_produced, consumed, grouped, described, status = out
    assert len(orjson.loads(created)["partitions"]) == 3
    assert orjson.loads(produced) == {"topic": "orders", "partition": 2, "base_offset": 0, "count": 2}
    assert [r["value"] for r in orjson.loads(fetched)["records"]] == [{"item": "book", "qty": 1},
                                                                     {"item": "lamp", "qty": 2}]
    assert exported == "" and ring_produced.startswith("produced 2 records to orders (2 partitions)")
    events = [{"item": "book", "qty": 1}, {"item": "lamp", "qty": 2}, {"user": "bob", "item": "pen"},
              {"user": "carol", "item": "ink"}]
    by_json = orjson.dumps
    assert sorted(map(orjson.loads, consumed.splitlines()), key=by_json) == sorted(events, key=by_json)
    assert sorted(map(orjson.loads, grouped.splitlines()), key=by_json) == sorted(events, key=by_json)
    assert "lag 0" in described.splitlines()[0] and "3 brokers: 3 up" in status
    return done


def finish_tour(shell: Shell) -> None:
    """The README's closing block: the brokers stop, and their ports with them."""
    for cmd in commands(section("tour-end")):
        shell.run(cmd)
    for documented in (9250, 9260, 9270):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{shell.port(documented)}/v1/status", timeout=2)
        except OSError:
            continue
        raise AssertionError(f"a broker still answers on {shell.port(documented)} after make cluster-stop")


def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    _curl()
    shell = Shell(tmp_path, on_path=False)  # the tour's own export puts ring on PATH
    try:
        run_tour(shell)
        text = README.read_text()
        pages = re.findall(r"<(http://localhost:9250/[^>]*)>", text)
        assert pages, "the tour names no page to open"
        for url in pages:
            with urllib.request.urlopen(shell.local(url), timeout=10) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
                assert b"<title>" in r.read()
        finish_tour(shell)
    finally:
        run_cluster_stop(shell)


def _blocks(path: Path) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of commands in a file."""
    return [(lang, body) for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", path.read_text(), re.S | re.M)
            if lang in ("", "sh", "bash", "python")]


def test_every_block_of_commands_is_run_by_a_test() -> None:
    """A block a reader is told to run is marked (and the marker's name appears in a test that runs
    it), or listed in UNRUN with why it cannot run here."""
    marked = {name: text for name, (_, text) in sections().items()}
    tests_text = "\n".join(p.read_text() for p in (REPO_ROOT / "tests").rglob("test_*.py"))
    for name in marked:
        if "```" in marked[name]:
            assert f'"{name}"' in tests_text, f"block {name!r} is marked but no test names it"
    unrun_used = set()
    for path in DOCS:
        for lang, body in _blocks(path):
            if any(body in text for text in marked.values()):
                continue
            first = body.strip().splitlines()[0] if body.strip() else ""
            key = next((k for k in UNRUN if k[0] == path.name and first.startswith(k[1])), None)
            assert key is not None, (
                f"{path.name} has a block of commands no test runs (mark it and run it, or list it in UNRUN "
                f"with why it cannot run): {first!r}")
            unrun_used.add(key)
    stale = set(UNRUN) - unrun_used
    assert not stale, f"UNRUN lists blocks that are not in the docs: {stale}"



def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_lands() -> None:
    anchors = {p: {_slug(h) for h in re.findall(r"^#+ (.+)$", p.read_text(), re.M)} for p in DOCS}
    for path in DOCS:
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md|)(?:#([\w-]+))?\)", path.read_text()):
            dest = (path.parent / target).resolve() if target else path
            assert dest.exists(), f"{path.name} links to {target}, which does not exist"
            if anchor:
                assert anchor in anchors.get(dest, set()), f"{path.name} links to {target}#{anchor}: no such heading"
