"""SASL on the Kafka listener: SaslHandshake (v1) and SaslAuthenticate (v0-2), mechanism PLAIN, with
ring's client tokens as the passwords.

A listener of a broker started with ``--auth-tokens`` serves a connection nothing but ApiVersions,
SaslHandshake and SaslAuthenticate until it has authenticated (the listener closes a connection that
sends anything else first, as Kafka does). PLAIN's message (RFC 4616) is ``[authzid] NUL authcid NUL
passwd``: the user name is the token's name in the tokens file, the password the token itself, and an
authorization id, when one is given, must be that name. What a token may do is what it may do on the
HTTP port (``ring.kafka_api.access``), within its quotas (``server.py``). A failed authentication is
answered SASL_AUTHENTICATION_FAILED and the connection closed, as Kafka does. The client authenticates
once a connection (a session lifetime of 0); the connection keeps the token's digest, and once the
tokens file is read again (SIGHUP) its next request is served with the token's grants and quotas as
the file now gives them, or closes the connection when the token is gone from it.

Without ``--auth-tokens`` the listener takes no SASL: a handshake is answered UNSUPPORTED_SASL_MECHANISM
naming no mechanism, so a client configured for SASL says at once that the broker offers none.
"""

from __future__ import annotations

from ring.auth import Principal, TokenTable, digest
from ring.kafka_api.wire import Reader, Writer

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
KEYS = (SASL_HANDSHAKE, SASL_AUTHENTICATE)
VERSIONS = {SASL_HANDSHAKE: (1, 1), SASL_AUTHENTICATE: (0, 2)}
FLEXIBLE_FROM = {SASL_AUTHENTICATE: 2}
PLAIN = "PLAIN"

UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58

FAILED = "Authentication failed: invalid username or password"


def read_handshake(r: Reader) -> str:
    return r.string()


def handshake_body(error: int, offered: bool) -> bytes:
    """A SaslHandshake answer: ``error`` and the mechanisms this listener takes (PLAIN when ``offered``)."""
    w = Writer().int16(error)
    if offered:
        w.array_len(1).string(PLAIN)
    else:
        w.array_len(0)
    return bytes(w.buf)


def read_authenticate(version: int, r: Reader) -> bytes:
    """The SASL bytes of a SaslAuthenticate request (empty for null)."""
    if version >= FLEXIBLE_FROM[SASL_AUTHENTICATE]:
        got = r.compact_nullable_bytes()
        r.tagged_fields()
    else:
        got = r.nullable_bytes()
    return b"" if got is None else bytes(got)


def authenticate_body(version: int, error: int, message: str | None) -> bytes:
    """A SaslAuthenticate answer: no SASL bytes back (PLAIN has no server message), no session lifetime."""
    w = Writer().int16(error)
    if version >= FLEXIBLE_FROM[SASL_AUTHENTICATE]:
        w.compact_string(message).compact_bytes(b"").int64(0).tagged_fields()
        return bytes(w.buf)
    w.nullable_string(message).nullable_bytes(b"")
    if version >= 1:
        w.int64(0)  # session_lifetime_ms: no re-authentication
    return bytes(w.buf)


def plain(tokens: TokenTable, message: bytes) -> tuple[Principal, bytes] | None:
    """The principal a PLAIN message names, and its token's digest: its password a token of ``tokens``
    whose name is the user name (and the authorization id, if any); None for anything else."""
    fields = message.split(b"\x00")
    if len(fields) != 3:
        return None
    try:
        authzid, user, password = (f.decode("utf-8") for f in fields)
    except UnicodeDecodeError:
        return None
    presented = digest(password)
    principal = tokens.by_digest(presented)  # compared with every token, matched or not
    if principal is None or principal.name != user or (authzid and authzid != user):
        return None
    return principal, presented
