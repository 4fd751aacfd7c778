"""docs/GROUPS.md's examples run as written against a real broker and say what they claim: the curl
walk-through, then the Python client's group consumers and idempotent producer on the records it left."""

from __future__ import annotations

import ast
import contextlib
import io
import shutil
import subprocess

import orjson

from tests.docs import code, commands, section
from tests.support import require


def test_group_examples_run_as_written(make_broker, tmp_path) -> None:
    require(None if shutil.which("curl") else "curl is not installed")
    broker = make_broker()
    outputs = []
    for cmd in commands(section("groups-examples")):
        cmd = cmd.replace("localhost:9250", f"127.0.0.1:{broker.local.port}")
        done = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=30, cwd=tmp_path)
        assert done.returncode == 0, (cmd, done.stderr)
        outputs.append(orjson.loads(done.stdout))
    (created, p0, p1, join1, join2, poll1, poll2, commit, described, listed, reset, left, idem1, idem2) = outputs
    assert created["name"] == "orders" and (p0["count"], p1["count"]) == (2, 1)
    assert join1["generation"] == 1 and len(join1["assignment"]) == 2
    assert join2["generation"] == 2 and join2["assignment"] == [{"topic": "orders", "partition": 1}]
    assert [r["value"] for r in poll1["records"]] == [{"order": 1}, {"order": 2}]
    assert poll2["records"] == [] and poll2["generation"] == 2 and poll2["token"] != poll1["token"]
    assert commit["committed"] == [{"topic": "orders", "partition": 1, "offset": 1}]
    assert {(o["partition"], o["committed"], o["lag"]) for o in described["offsets"]} == {(0, 2, 0), (1, 1, 0)}
    assert [g["group"] for g in listed["groups"]] == ["billing"]
    assert [o["offset"] for o in reset["offsets"]] == [0, 0]
    assert left["left"] is True and left["generation"] == 3
    assert idem1 == idem2 and idem1["count"] == 2
    after = broker.http.get("/v1/groups/billing").json()
    assert [m["member"] for m in after["members"]] == ["c-2"] and len(after["members"][0]["assignment"]) == 2

    # The Python block, on the records the curl walk-through left: orders 1-5 on two partitions.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code("groups-python").replace("localhost:9250", f"127.0.0.1:{broker.local.port}"),
                     "docs/GROUPS.md", "exec"), {})
    lines = out.getvalue().splitlines()
    orders = [{"order": n} for n in range(1, 6)]
    reports, audit, search, idempotent = lines[:5], lines[5:10], lines[10:15], lines[15:]
    by_order = lambda v: v["order"]  # noqa: E731
    assert sorted((ast.literal_eval(line.split(" ", 2)[2]) for line in reports), key=by_order) == orders
    assert sorted(map(ast.literal_eval, audit), key=by_order) == orders
    assert sorted(map(ast.literal_eval, search), key=by_order) == orders
    assert idempotent == ["True"]
    groups = {g: broker.http.get(f"/v1/groups/{g}").json() for g in ("reports", "audit", "search")}
    for name, doc in groups.items():
        assert doc["members"] == [] and sum(o["committed"] for o in doc["offsets"]) == 5, (name, doc)
    sixes = broker.http.get("/v1/topics/orders").json()["partitions"]
    assert sum(p["high_watermark"] for p in sixes) == 6, "the idempotent retry was stored twice"
