"""docker-compose.yml and the Dockerfile, checked without a Docker engine:
the services and their flags (parsed by ring's own argparse parser), the same
flags as ``make cluster``, health checks that really answer, volumes, and the
Spark job wired to the brokers."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ring import cli, localcluster
from tests.brokers import REPO_ROOT, TestBroker

BROKERS = ["ring-0", "ring-1", "ring-2"]
SECRET_ENV = "RING_CLUSTER_SECRET"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())


def _flags(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--") and i + 1 < len(argv)}


def _listen(svc: dict) -> tuple[str, int]:
    return cli.parse_listen(_flags(svc["command"])["--listen"])


def test_three_brokers_and_a_spark_job_behind_a_profile(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == {*BROKERS, "spark"}
    for name in BROKERS:
        assert "profiles" not in services[name]
        assert services[name]["build"]["target"] == "broker"
        assert services[name]["command"][0] == "serve"
    assert services["spark"]["profiles"] == ["spark"]


def test_broker_commands_parse_with_the_real_cli(compose: dict) -> None:
    for name in BROKERS:
        argv = compose["services"][name]["command"]
        args, rest = cli.build_parser().parse_known_args(argv)
        assert rest == [], f"{name}: flags ring serve does not know: {rest}"
        assert args.command == "serve" and args.name == name
        assert args.listen == ("0.0.0.0", 9250)
        assert str(args.data_dir).startswith("/var/lib/ring/")
        flags = _flags(argv)
        assert flags["--peer-listen"] == "0.0.0.0:9251"
        assert flags["--advertise"] == name
        assert flags["--seeds"] == ",".join(f"{b}:9251" for b in BROKERS)


def test_same_flags_as_make_cluster(compose: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "test-secret")
    local = localcluster.dev_cluster(tmp_path)
    for broker, name in zip(local.brokers, BROKERS):
        local_flags = set(_flags(broker.command()[3:]))
        compose_flags = set(_flags(compose["services"][name]["command"]))
        assert local_flags <= compose_flags
        # --advertise: in compose the service name, locally the listen host (the default); the Kafka
        # listener's advertised address: in compose the published port on the host's loopback, locally
        # the listen address (the default), the same address
        assert compose_flags - local_flags == {"--advertise", "--kafka-advertise"}
        kafka = _flags(compose["services"][name]["command"])["--kafka-advertise"]
        assert kafka == _flags(broker.command()[3:])["--kafka-listen"]
        # the secret travels in the environment in both, never on a command line
        assert broker.env[SECRET_ENV] == "test-secret"
        assert "--cluster-secret" not in compose_flags | local_flags
        assert broker.name == name


def test_the_secret_comes_from_the_environment_and_is_required(compose: dict) -> None:
    for name in BROKERS:
        value = compose["services"][name]["environment"][SECRET_ENV]
        assert re.fullmatch(r"\$\{RING_CLUSTER_SECRET:\?[^}]+\}", value), value


def test_each_broker_has_its_own_named_volume_under_its_data_dir(compose: dict) -> None:
    declared = set(compose["volumes"])
    used = []
    for name in BROKERS:
        svc = compose["services"][name]
        [mount] = svc["volumes"]
        volume, target = mount.split(":")[:2]
        assert volume in declared
        assert _flags(svc["command"])["--data-dir"].startswith(target.rstrip("/") + "/")
        used.append(volume)
    assert len(set(used)) == 3 and set(used) == declared


def test_published_ports_are_loopback_client_and_kafka_ports(compose: dict) -> None:
    for i, name in enumerate(BROKERS):
        client, kafka = compose["services"][name]["ports"]
        host, published, target = client.split(":")
        assert host == "127.0.0.1"
        assert int(published) == localcluster.DEV_CLIENT_PORT + localcluster.DEV_PORT_STEP * i
        assert int(target) == _listen(compose["services"][name])[1]
        flags = _flags(compose["services"][name]["command"])
        host, published, target = kafka.split(":")
        assert (host, int(published)) == ("127.0.0.1", localcluster.DEV_CLIENT_PORT + localcluster.DEV_PORT_STEP * i + 2)
        assert flags["--kafka-listen"] == f"0.0.0.0:{target}"
        assert flags["--kafka-advertise"] == f"127.0.0.1:{published}"


def _health_command(svc: dict) -> list[str]:
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD"
    return test[1:]


def test_health_checks_ask_the_status_route_and_really_answer(compose: dict, broker: TestBroker) -> None:
    for name in BROKERS:
        svc = compose["services"][name]
        cmd = _health_command(svc)
        assert cmd[0] == "python"
        port = _listen(svc)[1]
        assert f"http://127.0.0.1:{port}/v1/status" in cmd[-1]
        hc = svc["healthcheck"]
        assert hc["retries"] >= 3 and hc["timeout"] and hc["interval"]
    # Run the check itself: passes against a live broker, fails against a closed port.
    live = [sys.executable, *cmd[1:-1], cmd[-1].replace(":9250/", f":{broker.local.port}/")]
    assert subprocess.run(live, capture_output=True, timeout=30).returncode == 0
    dead = [sys.executable, *cmd[1:-1], cmd[-1].replace(":9250/", f":{localcluster.free_port()}/")]
    assert subprocess.run(dead, capture_output=True, timeout=30).returncode != 0


def test_spark_job_runs_the_example_against_every_broker_once_healthy(compose: dict) -> None:
    spark = compose["services"]["spark"]
    argv = spark["command"]
    assert argv[:2] == ["python", "examples/clickstream_job.py"]
    script = REPO_ROOT / argv[1]
    assert script.exists()
    flags = _flags(argv)
    urls = flags["--brokers"].split(",")
    assert urls == [f"http://{name}:{_listen(compose['services'][name])[1]}" for name in BROKERS]
    assert spark["depends_on"] == {name: {"condition": "service_healthy"} for name in BROKERS}
    assert spark["build"]["target"] == "spark"
    # Every option the service passes is one the example's own parser offers.
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        _run_help(script)
    assert done.value.code == 0
    offered = set(re.findall(r"--[a-z][a-z-]+", out.getvalue()))
    assert {a for a in argv if a.startswith("--")} <= offered


def _run_help(script: Path) -> None:
    namespace = runpy.run_path(str(script), run_name="clickstream_job")
    namespace["main"](["--help"])


def test_dockerfile_builds_both_targets_from_python_311_slim(compose: dict) -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    stages = {name: base for base, name in re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)", text, re.M | re.I)}
    assert stages == {"broker": "python:3.11-slim", "spark": "broker"}
    assert re.search(r"^RUN pip install \.$", text, re.M)
    assert re.search(r'^RUN pip install "\.\[spark\]"$', text, re.M)
    targets = {svc["build"]["target"] for svc in compose["services"].values()}
    assert targets <= set(stages)
    assert 'ENTRYPOINT ["ring"]' in text
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "var" in ignored


# --- make cluster: python -m ring.localcluster start|status|stop ----------------------


def _free_base_port() -> int:
    """A client port P with P, P+1, P+2 and the same at P+10 and P+20 all free."""
    import socket

    for _ in range(50):
        base = localcluster.free_port()
        if base + 22 > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for off in (0, 1, 2, 10, 11, 12, 20, 21, 22):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", base + off))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def _localcluster(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ring.localcluster", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=90)


def _serves(pid: int) -> bool:
    cmdline = Path(f"/proc/{pid}/cmdline")
    return cmdline.exists() and b"serve" in cmdline.read_bytes().split(b"\0")


def test_make_cluster_start_status_stop_by_pid_files(tmp_path: Path) -> None:
    root, base = tmp_path / "var", _free_base_port()
    opts = ["--root", str(root), "--base-port", str(base)]
    started = _localcluster("start", *opts)
    try:
        assert started.returncode == 0, started.stderr
        pids = [int((root / f"{n}.pid").read_text()) for n in BROKERS]
        assert all(map(_serves, pids))
        assert (root / "cluster-secret").stat().st_mode & 0o077 == 0  # the secret is private
        for i, name in enumerate(BROKERS):
            assert f"http://127.0.0.1:{base + 10 * i}" in started.stdout
            assert (root / name).is_dir() and (root / f"{name}.log").exists()
        # Kafka's clients bootstrap from the address it prints, and find all three brokers there.
        bootstrap = f"127.0.0.1:{base + 2},127.0.0.1:{base + 12},127.0.0.1:{base + 22}"
        assert f"kafka bootstrap.servers: {bootstrap}" in started.stdout
        from confluent_kafka.admin import AdminClient

        metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{base + 2}"}).list_topics(timeout=30)
        assert sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values()) == sorted(bootstrap.split(","))
        assert _localcluster("status", *opts).returncode == 0
        assert _localcluster("start", *opts).returncode == 1  # already running: nothing started twice
    finally:
        stopped = _localcluster("stop", *opts)
    assert stopped.returncode == 0, stopped.stderr
    assert not any((root / f"{n}.pid").exists() for n in BROKERS)
    assert not any(map(_serves, pids))
    assert _localcluster("status", *opts).returncode == 1
    assert all("stopped cleanly" in (root / f"{n}.log").read_text() for n in BROKERS)


def test_make_cluster_stop_leaves_a_process_that_is_not_its_broker_alone(tmp_path: Path) -> None:
    root = tmp_path / "var"
    root.mkdir()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (root / "ring-0.pid").write_text(f"{bystander.pid}\n")  # a stale file, its PID reused
        assert _localcluster("stop", "--root", str(root)).returncode == 0
        assert bystander.poll() is None
        assert not (root / "ring-0.pid").exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_the_two_hosts_example_runs_two_members_on_each_host() -> None:
    """deploy/compose/hosts.yml: each container is a host of two members, parsed by the real command line."""
    from ring.commands.members import members_of

    doc = yaml.safe_load((REPO_ROOT / "deploy" / "compose" / "hosts.yml").read_text())
    names, hosts = [], set()
    for svc in doc["services"].values():
        argv = svc["command"]
        args, rest = cli.build_parser().parse_known_args(argv)
        assert rest == [] and args.members == 2 and svc["environment"][SECRET_ENV].startswith("${")
        args.cluster_secret = "from-the-environment"  # (as RING_CLUSTER_SECRET gives it in the container)
        members = members_of(args, argv)
        names += [m.name for m in members]
        hosts.add(args.host_label)
        for m in members:  # each member's seeds reach the other host's first member
            own, _ = cli.build_parser().parse_known_args(m.argv[3:])
            assert {"host-0:9261", "host-1:9261"} <= set(own.seeds) | {f"{args.advertise}:{m.peer_port}"}
        assert svc["stop_grace_period"] == "40s" and svc["healthcheck"]["test"][-1].count("9250") == 1
    assert names == ["ring-0", "ring-1", "ring-2", "ring-3"] and hosts == {"host-0", "host-1"}
