"""The README's consumer-group examples run as written against a real broker and say what they claim."""

from __future__ import annotations

import shutil
import subprocess

import orjson
import pytest

from tests.test_readme import _commands as readme_commands
from tests.test_readme import _section as readme_section


def _commands() -> list[str]:
    return readme_commands(readme_section("groups-examples"))


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_group_examples_run_as_written(make_broker, tmp_path) -> None:
    broker = make_broker()
    outputs = []
    for cmd in _commands():
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
