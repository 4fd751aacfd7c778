"""``ring serve``'s cluster settings: flags, environment variables, and the start-up checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ring import cli
from ring.config import BrokerConfig
from ring.cluster.node import token_of
from ring.hashing import broker_token

CLUSTER_VARS = ("PEER_LISTEN", "SEEDS", "CLUSTER_SECRET", "TOKEN", "ADVERTISE")


def _serve_args(argv: list[str]):
    args, rest = cli.build_parser().parse_known_args(["serve", *argv])
    assert rest == []
    return args


def test_cluster_flags_default_to_a_broker_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in CLUSTER_VARS:
        monkeypatch.delenv("RING_" + var, raising=False)
    args = _serve_args([])
    assert args.peer_listen is None and args.seeds == () and args.cluster_secret is None
    assert args.token is None and args.advertise is None


def test_cluster_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RING_PEER_LISTEN", "127.0.0.1:9351")
    monkeypatch.setenv("RING_SEEDS", "a:1, b:2")
    monkeypatch.setenv("RING_CLUSTER_SECRET", "from-env")
    monkeypatch.setenv("RING_TOKEN", "-42")
    monkeypatch.setenv("RING_ADVERTISE", "ring-0.local")
    args = _serve_args([])
    assert args.cluster_secret == "from-env" and args.advertise == "ring-0.local"
    assert args.seeds == ("a:1", "b:2") and args.token == -42 and args.peer_listen == ("127.0.0.1", 9351)
    args = _serve_args(["--peer-listen", "0.0.0.0:7000", "--seeds", "h:7000,i:7001", "--token", "7",
                        "--cluster-secret", "flag", "--advertise", "me"])
    assert args.peer_listen == ("0.0.0.0", 7000) and args.seeds == ("h:7000", "i:7001")
    assert args.token == 7 and args.cluster_secret == "flag" and args.advertise == "me"


@pytest.mark.parametrize("bad", [["--seeds", "nohost"], ["--seeds", "h:0"], ["--seeds", ":80"],
                                 ["--token", "x"], ["--token", str(2**63)], ["--peer-listen", "h"]])
def test_bad_cluster_flags_exit_2(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _serve_args(bad)
    assert exc.value.code == 2


def test_token_comes_from_the_ordinal_unless_given() -> None:
    assert token_of(BrokerConfig(name="ring-4")) == broker_token(4)
    assert token_of(BrokerConfig(name="ring-4", token=99)) == 99
    assert token_of(BrokerConfig(name="solo")) == broker_token(0)  # alone, any token will do
    with pytest.raises(ValueError, match="no ordinal"):
        token_of(BrokerConfig(name="solo", seeds=("h:1",)))


def test_a_joining_broker_without_ordinal_or_token_is_refused_at_start(tmp_path: Path, capsys) -> None:
    code = cli.main(["serve", "--name", "nameless", "--data-dir", str(tmp_path / "d"), "--seeds", "127.0.0.1:1"])
    assert code == 2 and "give --token" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything was opened
