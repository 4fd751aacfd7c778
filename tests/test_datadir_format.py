"""A data directory's format version: the previous release's directories (no format file) open and are
marked with this release's format; a newer one is refused, by ``ring serve`` with exit code 2 and a
message naming the format, before anything in it is changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ring.errors import UnsupportedFormat
from ring.localcluster import free_port
from ring.log.datadir import FORMAT, FORMAT_FILE, FORMAT_OLDEST, DataDir, check_format
from tests.brokers import REPO_ROOT


def test_a_directory_without_a_format_file_is_the_previous_releases_and_is_marked_once_opened(
        tmp_path: Path) -> None:
    assert check_format(tmp_path) == FORMAT_OLDEST
    assert (tmp_path / FORMAT_FILE).read_text().strip() == str(FORMAT)
    assert check_format(tmp_path) == FORMAT
    d = DataDir(tmp_path / "d")
    d.open()
    d.close(clean=True)
    assert (tmp_path / "d" / FORMAT_FILE).read_text().strip() == str(FORMAT)


@pytest.mark.parametrize("text", [str(FORMAT + 1), "banana", ""])
def test_a_newer_or_unreadable_format_is_refused_and_left_as_it_is(tmp_path: Path, text: str) -> None:
    (tmp_path / FORMAT_FILE).write_text(text)
    with pytest.raises(UnsupportedFormat, match="newer than this release reads"):
        DataDir(tmp_path).open()
    assert (tmp_path / FORMAT_FILE).read_text() == text
    assert not (tmp_path / "incarnation").exists()
    d = DataDir(tmp_path)  # the refused open let go of the lock
    (tmp_path / FORMAT_FILE).write_text(str(FORMAT))
    d.open()
    d.close(clean=True)


def test_ring_serve_refuses_a_newer_data_directory_with_exit_code_2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / FORMAT_FILE).write_text(f"{FORMAT + 1}\n")
    port = free_port()
    run = subprocess.run([sys.executable, "-m", "ring", "serve", "--name", "ring-0", "--data-dir", str(data),
                          "--listen", f"127.0.0.1:{port}"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-3000:]
    assert f"is in format {FORMAT + 1}, newer than this release reads" in out, out[-3000:]
    assert not (data / "incarnation").exists() and not (data / "catalog.json").exists()
