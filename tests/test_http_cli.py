"""``ring serve`` settings: flags, environment variables, and which wins."""

from __future__ import annotations

import pytest

from ring import cli


def _serve_args(argv: list[str]):
    args, rest = cli.build_parser().parse_known_args(["serve", *argv])
    assert rest == []
    return args


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NAME", "DATA_DIR", "LISTEN", "FSYNC", "AUTO_CREATE", "LOG_LEVEL"):
        monkeypatch.delenv("RING_" + var, raising=False)
    args = _serve_args([])
    assert args.name == "ring-0" and args.listen == ("127.0.0.1", 9250)
    assert str(args.fsync) == "interval:1000" and args.auto_create is True and args.log_level == "info"


def test_environment_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RING_NAME", "ring-5")
    monkeypatch.setenv("RING_LISTEN", "0.0.0.0:9999")
    monkeypatch.setenv("RING_FSYNC", "always")
    monkeypatch.setenv("RING_AUTO_CREATE", "false")
    monkeypatch.setenv("RING_LOG_LEVEL", "WARNING")
    args = _serve_args([])
    assert args.name == "ring-5" and args.listen == ("0.0.0.0", 9999) and str(args.fsync) == "always"
    assert args.auto_create is False and args.log_level == "warning"
    args = _serve_args(["--name", "x-1", "--listen", "127.0.0.1:0", "--fsync", "interval:250"])
    assert args.name == "x-1" and args.listen == ("127.0.0.1", 0) and str(args.fsync) == "interval:250"


@pytest.mark.parametrize("bad", [["--listen", "nohost"], ["--listen", "h:70000"], ["--fsync", "sometimes"]])
def test_bad_flags_exit_2(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _serve_args(bad)
    assert exc.value.code == 2


def test_bench_gets_its_own_arguments() -> None:
    args, rest = cli.build_parser().parse_known_args(["bench", "--records", "10"])
    assert args.command == "bench" and rest == ["--records", "10"]
