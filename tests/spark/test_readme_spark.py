"""The README's Spark example runs as written (broker URL and checkpoint
directory swapped for this test's) and prints what it promises."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_spark_example_runs_as_written(spark, broker, tmp_path) -> None:
    text = README.read_text()
    block = re.search(r"<!-- spark-example:start -->\n```python\n(.*?)```\n<!-- spark-example:end -->", text, re.S)
    assert block, "README has no Spark example"
    code = (block.group(1)
            .replace("http://localhost:9250", broker.url)
            .replace("/tmp/ring-readme-checkpoint", str(tmp_path / "checkpoint")))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    per_user = lines[0]
    assert per_user.count("Row(user=") == 7 and sum(map(int, re.findall(r"count=(\d+)", per_user))) == 100
    count, splits = re.fullmatch(r"(\d+) records in (\d+) splits", lines[1]).groups()
    assert int(count) == 100 and int(splits) >= 4
    assert lines[2] == "[Row(count(1)=100)]"
