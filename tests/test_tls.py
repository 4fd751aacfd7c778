"""TLS on both ports and mutual TLS between brokers, on a real 3-broker cluster with client tokens:
gossip, forwarded produces, replication and proxied reads all run over TLS; the peer port takes no
connection without a certificate from the peer CA; clients check the brokers' certificates."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from ring.tls import TlsConfig
from tests.brokers import REPO_ROOT
from tests.secure_cluster import Pki, SecureCluster, make_pki, make_tokens
from tests.support import Http

pytestmark = pytest.mark.integration

REFUSED = (ssl.SSLError, ConnectionError, http.client.HTTPException, socket.timeout)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[tuple[SecureCluster, dict[str, str]]]:
    root = tmp_path_factory.mktemp("tls-cluster")
    tokens = make_tokens(root / "tokens.txt")
    c = SecureCluster(root / "cluster", 3, pki=pki, tokens_file=root / "tokens.txt", args=["--fsync", "interval:100"])
    c.start(admin_token=tokens["admin"])
    try:
        yield c, tokens
    finally:
        c.stop()


def _context(ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def test_the_cluster_gossips_replicates_and_forwards_over_tls(cluster) -> None:
    c, tokens = cluster
    admin = c.client(0, tokens["admin"])
    view = admin.get("/v1/cluster").json()
    assert all(b["client_url"].startswith("https://") and b["peer_url"].startswith("https://")
               for b in view["brokers"])
    assert [b["status"] for b in view["brokers"]] == ["up"] * 3
    topic = "orders-" + uuid.uuid4().hex[:8]
    assert admin.post("/v1/topics", json_body={"name": topic, "partitions": 3, "replication_factor": 3}).status == 201
    for i in range(3):  # every broker takes a produce for every partition: 2 of 3 are forwarded to the leader
        for p in range(3):
            r = c.client(i, tokens["producer"]).produce(topic, [{"i": i, "p": p}], partition=p, consistency="all")
            assert r.status == 200, r.body
    for i in range(3):  # consistency=all: every replica holds every record, followers included
        for p in range(3):
            r = c.client(i, tokens["consumer"]).fetch(topic, p)
            assert r.status == 200 and len(r.json()["records"]) == 3, r.body


def test_clients_check_the_brokers_certificate(cluster, pki: Pki) -> None:
    c, tokens = cluster
    url = c.url(0)
    with pytest.raises(ssl.SSLCertVerificationError):
        Http.to(url, tokens["admin"], _context()).get("/v1/status")  # the system's CAs do not know ours
    with pytest.raises(ssl.SSLCertVerificationError):
        Http.to(url, tokens["admin"], _context(pki.rogue_ca)).get("/v1/status")
    assert Http.to(url, tokens["admin"], _context(pki.ca)).get("/v1/status").status == 200
    # plaintext to a TLS port gets no HTTP answer
    with pytest.raises(REFUSED):
        r = Http.to(url.replace("https", "http"), timeout_s=5).get("/v1/status")
        assert r.status >= 400


def test_the_peer_port_needs_a_certificate_from_the_peer_ca(cluster, pki: Pki) -> None:
    c, _ = cluster
    peer = c.peer_url(1)
    secret = {"Ring-Cluster-Secret": c.secret}
    for ctx in (_context(pki.ca), _context(pki.ca, pki.rogue_cert, pki.rogue_key)):
        with pytest.raises(REFUSED):
            Http.to(peer, ssl_context=ctx, timeout_s=5).get("/peer/v1/status", headers=secret)
    broker = Http.to(peer, ssl_context=_context(pki.ca, pki.cert, pki.key))
    assert broker.get("/peer/v1/status").status == 401  # a certificate is not the secret
    r = broker.get("/peer/v1/status", headers=secret)
    assert r.status == 200 and r.json()["name"] == "ring-1"


def test_a_broker_identity_on_the_client_port_needs_the_certificate_too(cluster, pki: Pki) -> None:
    """With --peer-ca, the cluster secret alone does not make a request a broker's on the client port."""
    c, _ = cluster
    secret = {"Ring-Cluster-Secret": c.secret}
    plain = Http.to(c.url(2), ssl_context=_context(pki.ca))
    assert plain.get("/v1/status").status == 200  # clients need no certificate
    r = plain.get("/v1/topics", headers=secret)
    assert r.status == 401, r.body
    as_broker = Http.to(c.url(2), ssl_context=_context(pki.ca, pki.cert, pki.key))
    assert as_broker.get("/v1/topics", headers=secret).status == 200
    with pytest.raises(REFUSED):  # a certificate from another CA fails the handshake outright
        Http.to(c.url(2), ssl_context=_context(pki.ca, pki.rogue_cert, pki.rogue_key), timeout_s=5).get(
            "/v1/topics", headers=secret)


def test_flags_are_checked_at_start(tmp_path: Path, pki: Pki) -> None:
    for bad, message in [(TlsConfig(cert=pki.cert), "go together"),
                         (TlsConfig(key=pki.key), "go together"),
                         (TlsConfig(peer_ca=pki.ca), "needs --tls-cert"),
                         (TlsConfig(cert=pki.cert, key=pki.rogue_key), "cannot load"),
                         (TlsConfig(cert=pki.cert, key=pki.key, peer_ca=tmp_path / "missing.pem"), "CA file")]:
        with pytest.raises(ValueError, match=message):
            bad.check()
    TlsConfig(cert=pki.cert, key=pki.key, peer_ca=pki.ca).check()
    (tmp_path / "empty.txt").write_text("# nothing\n")
    for flags, message in [(["--tls-cert", str(pki.cert)], "go together"),
                           (["--auth-tokens", str(tmp_path / "empty.txt")], "holds no token"),
                           (["--auth-tokens", str(tmp_path / "nope.txt")], "cannot read")]:
        proc = subprocess.run([sys.executable, "-m", "ring", "serve", "--data-dir", str(tmp_path / "d"),
                               "--listen", "127.0.0.1:0", *flags], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
