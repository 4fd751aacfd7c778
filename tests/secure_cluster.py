"""Throwaway certificates and tokens, and real brokers that use them, for the security tests.

``make_pki`` writes a CA, a broker certificate it signed (for 127.0.0.1 and
localhost, usable as server and client certificate), and a rogue CA with
its own "broker" certificate, with the ``cryptography`` package.
``make_tokens`` writes a tokens file and returns the tokens by name.
``SecureCluster`` runs ``LocalCluster`` brokers with those flags; its
``client(i, token)`` is a ``tests.support.Http`` on broker i's client port,
over http or https, with that token.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import secrets
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ring import auth
from ring.localcluster import LocalCluster
from tests.brokers import REPO_ROOT
from tests.support import Http

# name -> (permissions, topics): the grants every secure test cluster knows.
GRANTS = {
    "admin": ("admin", "*"),
    "producer": ("produce", "orders*"),
    "consumer": ("consume", "orders*"),
    "both": ("produce,consume", "orders*"),
    "scoped-admin": ("admin", "orders-admin*"),
}


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path  # a broker's certificate, signed by ca
    key: Path
    rogue_ca: Path
    rogue_cert: Path  # a certificate for the same names, signed by another CA
    rogue_key: Path


def make_pki(root: Path) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    root.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: Any, path: Path) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))

    def ca(cn: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return key, cert

    def leaf(ca_key: Any, ca_cert: Any, cn: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        san = x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                           x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca_cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(san, critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return key, cert

    pem = serialization.Encoding.PEM
    ca_key, ca_cert = ca("ring test CA")
    b_key, b_cert = leaf(ca_key, ca_cert, "ring broker")
    r_ca_key, r_ca_cert = ca("rogue CA")
    r_key, r_cert = leaf(r_ca_key, r_ca_cert, "rogue broker")
    pki = Pki(root / "ca.pem", root / "broker.pem", root / "broker.key",
              root / "rogue-ca.pem", root / "rogue.pem", root / "rogue.key")
    pki.ca.write_bytes(ca_cert.public_bytes(pem))
    pki.cert.write_bytes(b_cert.public_bytes(pem))
    write_key(b_key, pki.key)
    pki.rogue_ca.write_bytes(r_ca_cert.public_bytes(pem))
    pki.rogue_cert.write_bytes(r_cert.public_bytes(pem))
    write_key(r_key, pki.rogue_key)
    return pki


def make_tokens(path: Path, grants: dict[str, tuple[str, str]] = GRANTS) -> dict[str, str]:
    """Write a tokens file (digests only) for ``grants``; the plain tokens by name."""
    tokens = {n: secrets.token_urlsafe(24) for n in grants}
    lines = ["# test tokens"] + [auth.file_line(tokens[n], n, *grants[n]) for n in grants]
    path.write_text("\n".join(lines) + "\n")
    return tokens


class SecureCluster:
    """``size`` brokers with TLS (``pki``), mutual TLS between them, and/or client tokens."""

    def __init__(self, root: Path, size: int = 3, pki: Pki | None = None, tokens_file: Path | None = None,
                 args: Iterable[str] = ()) -> None:
        flags = list(args)
        if pki is not None:
            flags += ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--peer-ca", str(pki.ca)]
        if tokens_file is not None:
            flags += ["--auth-tokens", str(tokens_file)]
        self.pki = pki
        self.local = LocalCluster(root, size, args=flags, env={"PYTHONPATH": str(REPO_ROOT)})
        self.scheme = "https" if pki is not None else "http"
        self.peer_ports = [int(b.args[b.args.index("--peer-listen") + 1].rpartition(":")[2])
                           for b in self.local.brokers]

    @property
    def secret(self) -> str:
        return self.local.secret or ""

    def ssl_context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.pki.ca)) if self.pki is not None else None

    def url(self, i: int) -> str:
        return f"{self.scheme}://127.0.0.1:{self.local.brokers[i].port}"

    def peer_url(self, i: int) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_ports[i]}"

    def client(self, i: int, token: str | None = None) -> Http:
        return Http.to(self.url(i), token, self.ssl_context())

    def start(self, admin_token: str | None = None, timeout_s: float = 60.0) -> SecureCluster:
        """Start every broker; return once each sees all of them up."""
        self.local.start(wait=False)
        deadline = time.monotonic() + timeout_s
        try:
            for i, b in enumerate(self.local.brokers):
                while True:
                    if b.proc is not None and b.proc.poll() is not None:
                        raise RuntimeError(f"{b.name} exited with {b.proc.returncode}; see {b.log_path}")
                    try:
                        r = self.client(i, admin_token).get("/v1/cluster")
                        if r.status == 200 and sum(m["status"] == "up" for m in r.json()["brokers"]) == len(
                                self.local.brokers):
                            break
                    except (OSError, ssl.SSLError, http.client.HTTPException, ValueError):
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{b.name} does not see every broker up within {timeout_s} s")
                    time.sleep(0.2)
        except BaseException:
            self.local.kill()
            raise
        return self

    def stop(self) -> None:
        self.local.stop()

    def kill(self) -> None:
        self.local.kill()

    def log_text(self, i: int) -> str:
        path = self.local.brokers[i].log_path
        return path.read_text(errors="replace") if path and path.exists() else ""
