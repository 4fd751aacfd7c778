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
    assert args.name == "ring-0" and cli.listen_address(args) == ("127.0.0.1", 9250) and not args.polarstreams
    assert str(args.fsync) == "interval:1000" and args.auto_create is True and args.log_level == "info"


def test_polarstreams_moves_the_client_port_out_of_its_way(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:
    for var in ("LISTEN", "PEER_LISTEN", "POLARSTREAMS", "POLARSTREAMS_PORTS"):
        monkeypatch.delenv("RING_" + var, raising=False)
    args = _serve_args(["--polarstreams"])
    assert cli.listen_address(args) == ("127.0.0.1", 9256) and args.polarstreams_ports == "9250,9251,9252"
    monkeypatch.setenv("RING_POLARSTREAMS", "true")
    monkeypatch.setenv("RING_POLARSTREAMS_PORTS", "7000,7001,7002")
    args = _serve_args([])
    assert args.polarstreams and args.polarstreams_ports == "7000,7001,7002"
    for flags, message in ((["--listen", "127.0.0.1:7001"], "port 7001"), (["--peer-listen", "127.0.0.1:7000"], "port 7000"),
                           (["--polarstreams-ports", "7000,7000,7002"], "three different ports")):
        assert cli.main(["serve", "--data-dir", str(tmp_path / "d"), *flags]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything was opened


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
