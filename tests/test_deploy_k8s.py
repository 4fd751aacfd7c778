"""deploy/kubernetes and deploy/systemd, checked without a cluster or systemd.

Kubernetes: the manifests parse; kinds, names and selectors fit together; the
ports named by Services and probes exist on the container; every probe asks
/v1/status; the broker's arguments, expanded the way the kubelet expands
``$(VAR)``, parse with ring's own argparse parser into a broker named after
its pod, advertising its stable DNS name and seeding from ring-0..2; the
secret comes from a Secret. systemd: the unit's command parses the same way
for an instance, and the example environment files start a real broker.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml

from ring import cli
from ring.localcluster import free_port
from tests.brokers import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "kubernetes"
SYSTEMD = REPO_ROOT / "deploy" / "systemd"
NAMESPACE = "streams"


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _one(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.fixture(scope="module")
def sts(docs: list[dict]) -> dict:
    return _one(docs, "StatefulSet", "ring")


@pytest.fixture(scope="module")
def container(sts: dict) -> dict:
    [c] = sts["spec"]["template"]["spec"]["containers"]
    return c


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: defined names are replaced, others left as they are."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def _pod_env(container: dict, pod: str, node: str = "node-a", zone: str = "") -> dict[str, str]:
    """The pod's environment as the kubelet gives it, on ``node`` in ``zone`` (empty: a pod without the
    zone label, whose downward-API value is empty)."""
    env = {}
    for e in container["env"]:
        ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if ref == "metadata.name":
            env[e["name"]] = pod
        elif ref == "metadata.namespace":
            env[e["name"]] = NAMESPACE
        elif ref == "spec.nodeName":
            env[e["name"]] = node
        elif ref == f"metadata.labels['{ZONE_LABEL}']":
            env[e["name"]] = zone
        elif "value" in e:
            env[e["name"]] = e["value"]
    return env


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == manifests


def test_kinds_and_selectors_fit_together(docs: list[dict], sts: dict) -> None:
    assert {d["kind"] for d in docs} == {"Service", "StatefulSet", "PodDisruptionBudget"}
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    match = sts["spec"]["selector"]["matchLabels"]
    assert match.items() <= pod_labels.items()
    peers = _one(docs, "Service", sts["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None", "the peer Service must be headless for per-pod DNS names"
    assert peers["spec"]["publishNotReadyAddresses"] is True, "brokers gossip before they are ready"
    clients = _one(docs, "Service", "ring")
    assert clients["spec"].get("clusterIP") != "None"
    for svc in (peers, clients):
        assert svc["spec"]["selector"].items() <= pod_labels.items()
    pdb = _one(docs, "PodDisruptionBudget", "ring")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"


def test_ports_are_consistent(docs: list[dict], sts: dict, container: dict) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"client": 9250, "peer": 9251, "kafka": 9252}
    for svc in (d for d in docs if d["kind"] == "Service"):
        for p in svc["spec"]["ports"]:
            target = p["targetPort"]
            assert (target in ports) if isinstance(target, str) else (target in ports.values()), (svc, p)
            assert p["port"] == ports[p["name"]]
    flags = _flags(_expanded_args(container, "ring-0"))
    assert cli.parse_listen(flags["--listen"]) == ("0.0.0.0", ports["client"])
    assert cli.parse_listen(flags["--peer-listen"]) == ("0.0.0.0", ports["peer"])
    assert cli.parse_listen(flags["--kafka-listen"]) == ("0.0.0.0", ports["kafka"])
    ann = sts["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/path"] == "/metrics" and int(ann["prometheus.io/port"]) == ports["client"]


def test_every_probe_asks_the_status_route(container: dict) -> None:
    ports = {p["name"] for p in container["ports"]}
    probes = [container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container]
    assert len(probes) >= 2 and "readinessProbe" in container
    for probe in probes:
        assert probe["httpGet"]["path"] == "/v1/status"
        assert probe["httpGet"]["port"] in ports or probe["httpGet"]["port"] == 9250


def test_status_route_answers_as_the_probes_expect(broker) -> None:
    r = broker.http.get("/v1/status")
    assert r.status == 200 and r.json()["name"] == "ring-0"


def _flags(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--") and i + 1 < len(argv)}


def _expanded_args(container: dict, pod: str) -> list[str]:
    env = _pod_env(container, pod)
    return [_expand(a, env) for a in container["args"]]


@pytest.mark.parametrize("ordinal", [0, 1, 2, 5])
def test_broker_command_parses_with_the_real_cli(container: dict, ordinal: int) -> None:
    pod = f"ring-{ordinal}"
    assert "command" not in container, "the image's entrypoint (ring) runs the args"
    argv = _expanded_args(container, pod)
    assert not any("$(" in a for a in argv), argv
    args, rest = cli.build_parser().parse_known_args(argv)
    assert rest == [], f"flags ring serve does not know: {rest}"
    assert args.command == "serve" and args.name == pod
    assert str(args.data_dir).startswith("/var/lib/ring/")
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/ring" in mounts
    flags = _flags(argv)
    domain = f"ring-peers.{NAMESPACE}.svc.cluster.local"
    assert flags["--advertise"] == f"{pod}.{domain}"
    assert flags["--kafka-advertise"] == f"{pod}.{domain}:9252"  # its pod's stable name, as peers reach it
    assert flags["--seeds"] == ",".join(f"ring-{i}.{domain}:9251" for i in range(3))
    assert "--cluster-secret" not in flags, "the secret stays out of the pod spec's command line"


ZONE_LABEL = "topology.kubernetes.io/zone"


@pytest.mark.parametrize("zone", ["eu-west-1b", ""])
def test_the_pod_is_placed_by_its_node_and_zone(container: dict, sts: dict, monkeypatch, zone: str) -> None:
    """RING_HOST is the node's name and RING_ZONE the zone label the pod is given at binding; the broker
    reads them as --host and --zone (an empty zone: none). Pods spread over the same two domains."""
    env = _pod_env(container, "ring-0", node="node-7", zone=zone)
    for name in ("RING_HOST", "RING_ZONE"):
        monkeypatch.setenv(name, env[name])
    args, _ = cli.build_parser().parse_known_args(_expanded_args(container, "ring-0"))
    assert (args.host_label, args.zone) == ("node-7", zone or None)
    spec = sts["spec"]["template"]["spec"]
    assert {c["topologyKey"] for c in spec["topologySpreadConstraints"]} == {ZONE_LABEL}
    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {t["podAffinityTerm"]["topologyKey"] for t in terms} == {"kubernetes.io/hostname"}


def test_secret_comes_from_a_secret_and_logs_are_json(container: dict, sts: dict) -> None:
    env = {e["name"]: e for e in container["env"]}
    ref = env["RING_CLUSTER_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "ring-cluster", "key": "secret"}
    assert env["RING_LOG_FORMAT"]["value"] == "json"
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] in {m["name"] for m in container["volumeMounts"]}


def test_the_pod_runs_as_the_images_user(sts: dict, container: dict) -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile).group(1))
    ctx = sts["spec"]["template"]["spec"]["securityContext"]
    assert ctx["runAsUser"] == uid and ctx["fsGroup"] == uid and ctx["runAsNonRoot"] is True
    assert re.search(r'^ENTRYPOINT \["ring"\]', dockerfile, re.M)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    from ring import limits

    assert grace > limits.STOP_HANDOVER_MS_MAX / 1000 + limits.SHUTDOWN_GRACE_S + 5  # hand over, finish, close


# --- systemd ----------------------------------------------------------------------------------


def _unit() -> dict[str, list[str]]:
    """key -> values of ring@.service (systemd keys may repeat)."""
    out: dict[str, list[str]] = {}
    for line in (SYSTEMD / "ring@.service").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _cli_env_names() -> set[str]:
    source = (REPO_ROOT / "ring" / "cli.py").read_text()
    from ring import logging_setup

    return {"RING_" + n for n in re.findall(r'_env\("([A-Z_]+)"', source)} | {logging_setup.FORMAT_ENV}


def test_unit_runs_the_instance_as_a_broker_named_after_it() -> None:
    unit = _unit()
    [exec_start] = unit["ExecStart"]
    argv = shlex.split(exec_start.replace("%i", "ring-1"))
    assert argv[0].endswith("/ring")
    args, rest = cli.build_parser().parse_known_args(argv[1:])
    assert rest == [] and args.command == "serve" and args.name == "ring-1"
    assert unit["KillSignal"] == ["SIGTERM"]
    assert "/etc/ring/ring.env" in unit["EnvironmentFile"]
    assert "-/etc/ring/%i.env" in unit["EnvironmentFile"]
    assert "RING_DATA_DIR=/var/lib/ring/%i" in unit["Environment"]
    assert unit["StateDirectory"] == ["ring/%i"]
    assert unit["User"] == ["ring"]


def test_every_variable_the_unit_and_examples_set_is_one_ring_serve_reads() -> None:
    names = _cli_env_names()
    used = {v.partition("=")[0] for v in _unit()["Environment"]}
    for path in SYSTEMD.glob("*.env.example"):
        used |= set(_env_file(path))
    missing = used - names
    assert not missing, f"ring serve reads no {sorted(missing)}"


def _member_ports(n: int) -> tuple[int, int]:
    """A free client port and a base with ``2n`` free ports after it."""
    for _ in range(200):
        base = free_port()
        if all(_bindable(port) for port in range(base, base + 2 * n)):
            return free_port(), base
    raise AssertionError("no free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_the_example_environment_starts_a_real_broker(tmp_path: Path) -> None:
    """ring serve --name %i with the unit's defaults and the example files (ports and paths made local): one
    member per core, all answering on the host's one client port."""
    unit = _unit()
    env = {k: v for k, _, v in (e.partition("=") for e in unit["Environment"])}
    assert env["RING_MEMBERS"] == "auto"
    env |= _env_file(SYSTEMD / "ring.env.example") | _env_file(SYSTEMD / "ring-0.env.example")
    client, base = _member_ports(len(os.sched_getaffinity(0)))
    env |= {"RING_DATA_DIR": str(tmp_path / "ring-0"), "RING_LISTEN": f"127.0.0.1:{client}",
            "RING_MEMBER_PORTS": str(base), "RING_ADVERTISE": "127.0.0.1", "RING_SEEDS": f"127.0.0.1:{base + 1}"}
    env = {k: v.replace("%i", "ring-0") for k, v in env.items()}
    argv = shlex.split(unit["ExecStart"][0].replace("%i", "ring-0"))[1:]
    log_path = tmp_path / "ring-0.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ring", *argv], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env})
    try:
        doc = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/v1/status", timeout=1) as r:
                    doc = orjson.loads(r.read())
                    break
            except urllib.error.HTTPError as exc:  # 503 while joining is an answer too
                doc = orjson.loads(exc.read())
                break
            except OSError:
                time.sleep(0.1)
        assert doc is not None, log_path.read_text()
        members = [f"ring-{i}" for i in range(len(os.sched_getaffinity(0)))]
        assert doc["name"] in members  # whichever member the kernel handed the connection
        assert doc.get("cluster_secret_set") is True
        # Each member's own directory under the instance's (the members start together: the one that
        # answered first may be alone in having made its directory yet).
        dirs = [tmp_path / "ring-0" / name for name in members]
        while time.monotonic() < deadline and not all(d.is_dir() for d in dirs):
            time.sleep(0.05)
        assert all(d.is_dir() for d in dirs), (dirs, log_path.read_text())
    finally:
        proc.terminate()
        code = proc.wait(60)
    assert code == 0, log_path.read_text()
    lines = [ln for ln in log_path.read_text().splitlines() if ln.startswith("{")]
    if "log_format" in (REPO_ROOT / "ring" / "cli.py").read_text():
        assert lines, "RING_LOG_FORMAT=json: the broker's log lines are JSON objects"
        for ln in lines:
            assert {"ts", "level", "logger", "msg"} <= set(orjson.loads(ln))
