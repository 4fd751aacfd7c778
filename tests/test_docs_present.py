"""The reference docs describe the system as it is: none of docs/*.md or README.md names a commit
of this repository (a run's revision belongs in that run's output, not in the reference).

A word of 7 to 40 hex digits counts only when git resolves it to a commit here, so checksums,
tokens and other hex in the docs do not trip it."""

from __future__ import annotations

import re
import subprocess

from tests.docs import REPO_ROOT

HEX_WORD = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")


def _docs() -> list:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def _is_commit(word: str) -> bool:
    r = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{word}^{{commit}}"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def test_docs_name_no_commit() -> None:
    assert (REPO_ROOT / ".git").exists(), "the check needs the git repository"
    found = []
    for path in _docs():
        words = {w for w in HEX_WORD.findall(path.read_text()) if re.search(r"[a-f]", w)}  # all digits: a figure
        found += [f"{path.relative_to(REPO_ROOT)}: {w}" for w in sorted(words) if _is_commit(w)]
    assert not found, "the docs name commits of this repository: " + ", ".join(found)
