"""TLS for both ports: the SSL contexts a broker serves and connects with.

Plaintext is the default (local use). ``--tls-cert``/``--tls-key`` make
both ports speak TLS with that certificate. ``--peer-ca`` adds mutual TLS
between brokers: the peer port then requires a client certificate signed by
that CA, every broker presents its own ``--tls-cert`` when it connects to
another, and it checks the other's certificate (and host name) against the
same CA. The client port with ``--peer-ca`` asks for a client certificate
without requiring one: clients connect as before, while a broker's request
there (a proxied read, a group request sent to its coordinator) is known to
come from a broker only if it presents a certificate the CA signed and
carries the cluster secret.

A broker's certificate must name the host others reach it at (its
``--advertise`` host, or the listen host) in its subjectAltName. Contexts
are built once at start from files; nothing here does I/O afterwards.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsConfig:
    cert: Path | None = None
    key: Path | None = None
    peer_ca: Path | None = None

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    @property
    def mutual(self) -> bool:
        return self.peer_ca is not None

    @property
    def scheme(self) -> str:
        return "https" if self.enabled else "http"

    def check(self) -> None:
        """ValueError when the flags do not make sense together or the files cannot be used."""
        if (self.cert is None) != (self.key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.peer_ca is not None and self.cert is None:
            raise ValueError("--peer-ca needs --tls-cert and --tls-key (brokers present them to each other)")
        if self.enabled:
            self.client_port_context()
            self.outgoing_context()
            if self.mutual:
                self.peer_port_context()

    def client_port_context(self) -> ssl.SSLContext | None:
        """What the client port serves with (None: plaintext)."""
        if self.cert is None or self.key is None:
            return None
        ctx = _server_context(self.cert, self.key)
        if self.peer_ca is not None:
            _load_ca(ctx, self.peer_ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL  # clients need none; brokers show theirs
        return ctx

    def peer_port_context(self) -> ssl.SSLContext | None:
        """What the peer port serves with: the client port's, plus a required client certificate."""
        if self.cert is None or self.key is None:
            return None
        ctx = _server_context(self.cert, self.key)
        if self.peer_ca is not None:
            _load_ca(ctx, self.peer_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def outgoing_context(self) -> ssl.SSLContext | None:
        """What a broker connects to other brokers with (either port): their certificate checked
        against --peer-ca (else the system's CAs), ours presented when --peer-ca is set."""
        if self.cert is None or self.key is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.peer_ca is not None:
            _load_ca(ctx, self.peer_ca)
            try:
                ctx.load_cert_chain(str(self.cert), str(self.key))
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load --tls-cert {self.cert} / --tls-key {self.key}: {exc}") from None
        return ctx


def _server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load --tls-cert {cert} / --tls-key {key}: {exc}") from None
    return ctx


def _load_ca(ctx: ssl.SSLContext, ca: Path) -> None:
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the CA file {ca}: {exc}") from None


PLAINTEXT = TlsConfig()


def client_context(ca_file: str | Path | None = None) -> ssl.SSLContext:
    """For clients of the client port: the system's CAs, or ``ca_file`` (a private CA)."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def peer_certificate_verified(transport: object) -> bool:
    """Whether the other end of ``transport`` presented a certificate our CA verified.

    With CERT_OPTIONAL, ``getpeercert()`` returns a non-empty dict only for a
    certificate that passed verification."""
    get = getattr(transport, "get_extra_info", None)
    if get is None:
        return False
    obj = get("ssl_object")
    if obj is None:
        return False
    try:
        return bool(obj.getpeercert())
    except (ValueError, ssl.SSLError):
        return False
