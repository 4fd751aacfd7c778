"""Client tokens: the tokens file, who a bearer token is, and what it may do.

A broker started with ``--auth-tokens FILE`` lets a client request in only
with ``Authorization: Bearer TOKEN`` for a token in that file. The file holds
SHA-256 digests, never tokens, one grant a line (``#`` starts a comment)::

    # digest                                                                  name   permissions      topics
    sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824  alice  produce,consume  orders,clicks-*
    sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  ops    admin            *

A line may end with quotas, as Kafka's client quotas (``ring.quotas``)::

    sha256:...  bulk  produce  logs-*  produce_bytes_per_s=1048576 requests_per_s=200

``produce_bytes_per_s``, ``fetch_bytes_per_s`` and ``requests_per_s``, each
optional; they bound every token of that name together (give them once per
name: lines that disagree are refused). A token without any has no quota.

Permissions are ``produce``, ``consume`` and ``admin`` (which includes the
other two). Topics are names, or prefixes ending in ``*`` (topic names
cannot contain ``*``), or ``*`` alone for every topic. A token may have
several lines (several grants); all its lines must give the same name.
Tokens are random secrets (``python -m ring.auth new NAME PERMS TOPICS``
makes one and prints its line), so a plain SHA-256 is enough to store them:
nobody guesses a 256-bit token from its digest.

Authentication hashes the presented token and compares the digest with every
digest in the file with ``hmac.compare_digest``, without stopping at a match,
so the time taken says nothing about which token, or which part of one,
matched. Everything here is pure: no I/O but reading the text given, no
clock, no randomness outside ``main``; ``CURRENT`` names the identity a
request is being served for, for the requests it leads to.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import sys
from dataclasses import dataclass, field
from typing import Iterable

import orjson

from ring import limits
from ring.errors import BadRequest
from ring.quotas import Quota

PRODUCE = "produce"
CONSUME = "consume"
ADMIN = "admin"
PERMISSIONS = (PRODUCE, CONSUME, ADMIN)
# What each permission in a file line grants: admin is the superset on its topics.
_IMPLIES = {PRODUCE: frozenset({PRODUCE}), CONSUME: frozenset({CONSUME}),
            ADMIN: frozenset({PRODUCE, CONSUME, ADMIN})}
DIGEST_PREFIX = "sha256:"


def digest(token: str | bytes) -> bytes:
    raw = token.encode("utf-8", "surrogateescape") if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


def topic_matches(pattern: str, topic: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return topic.startswith(pattern[:-1])
    return topic == pattern



def secret_matches(configured: str | None, given: str | None) -> bool:
    """The cluster secret a peer request (or a PolarStreams consumer port's) carries, checked in
    constant time; with no secret configured nothing matches."""
    if not configured or given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), configured.encode("utf-8"))

@dataclass(frozen=True)
class Grant:
    permissions: frozenset[str]  # expanded: admin brings produce and consume
    topics: tuple[str, ...]  # names or prefixes ending in '*'

    def allows(self, permission: str, topic: str | None) -> bool:
        if permission not in self.permissions:
            return False
        return topic is None or any(topic_matches(p, topic) for p in self.topics)


@dataclass(frozen=True)
class Principal:
    """Who a request is from, and its grants. ``everything`` is a broker (or auth off)."""

    name: str
    grants: tuple[Grant, ...] = ()
    everything: bool = False
    # From the tokens file; never carried to another broker: the broker a client called enforces it.
    quota: Quota | None = None

    def allows(self, permission: str, topic: str | None = None) -> bool:
        """May do ``permission`` on ``topic`` (None: on some topic, for cluster-wide routes)."""
        assert permission in PERMISSIONS, permission
        return self.everything or any(g.allows(permission, topic) for g in self.grants)

    def allows_any(self, topic: str) -> bool:
        """Holds some permission on ``topic``: enough to describe it."""
        return any(self.allows(p, topic) for p in PERMISSIONS)

    # --- carried between brokers (Ring-Principal header, behind the cluster secret) ---

    def to_header(self) -> str:
        doc = {"name": self.name, "all": self.everything,
               "grants": [[sorted(g.permissions), list(g.topics)] for g in self.grants]}
        return orjson.dumps(doc).decode()

    @classmethod
    def from_header(cls, text: str) -> Principal:
        """The inverse of ``to_header``; BadRequest for anything else (it came from a peer)."""
        if len(text) > limits.PRINCIPAL_HEADER_BYTES_MAX:
            raise BadRequest("Ring-Principal is too long")
        try:
            doc = orjson.loads(text)
            name, everything, raw = doc["name"], doc["all"], doc["grants"]
            grants = tuple(_grant(perms, topics) for perms, topics in raw)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise BadRequest(f"malformed Ring-Principal: {exc}") from None
        if not isinstance(name, str) or not isinstance(everything, bool):
            raise BadRequest("malformed Ring-Principal")
        return cls(name, grants, everything)


BROKER = Principal("broker", everything=True)  # a request a broker makes on its own account
ANONYMOUS = Principal("anonymous", everything=True)  # every request when authentication is off

# The identity the current request is served for (set by the client API's access
# middleware), so that what a broker asks other brokers on its behalf carries it.
# It holds a one-item list the middleware empties when the request ends: a task
# started while serving (a reconcile, a coordinator's loop) copies the context,
# and must not keep acting for that client once the request is over.
CURRENT: contextvars.ContextVar[list[Principal | None] | None] = contextvars.ContextVar("ring_principal",
                                                                                       default=None)


def current() -> Principal | None:
    """The identity of the request being served here, None outside one (a broker's own work)."""
    cell = CURRENT.get()
    return cell[0] if cell else None


def _grant(perms: Iterable[str], topics: Iterable[str]) -> Grant:
    perms, topics = list(perms), list(topics)
    if not perms or not topics or not all(isinstance(p, str) and p in PERMISSIONS for p in perms):
        raise ValueError(f"permissions must be among {', '.join(PERMISSIONS)}")
    for t in topics:
        name = t[:-1] if t.endswith("*") else t
        if not isinstance(t, str) or (name and not limits.TOPIC_NAME_PATTERN.fullmatch(name)) or "*" in name:
            raise ValueError(f"{t!r} is not a topic name, a prefix ending in '*', or '*'")
    expanded = frozenset().union(*(_IMPLIES[p] for p in perms))
    return Grant(expanded, tuple(topics))


@dataclass
class TokenTable:
    """Digest -> principal, from a tokens file."""

    entries: list[tuple[bytes, Principal]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str, source: str = "tokens file") -> TokenTable:
        names: dict[bytes, str] = {}
        grants: dict[bytes, list[Grant]] = {}
        quotas: dict[str, tuple[Quota, str]] = {}  # name -> its quota and the line that gave it
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{source}:{lineno}"
            fields = line.split()
            if len(fields) < 4:
                raise ValueError(f"{where}: expected 'sha256:HEX NAME PERMISSIONS TOPICS [QUOTA=N ...]', "
                                 f"got {len(fields)} fields")
            raw_digest, name, perms, topics = fields[:4]
            if not raw_digest.startswith(DIGEST_PREFIX):
                raise ValueError(f"{where}: the token must be given as sha256:HEX (its digest, not the token)")
            try:
                key = bytes.fromhex(raw_digest[len(DIGEST_PREFIX):])
            except ValueError:
                key = b""
            if len(key) != hashlib.sha256().digest_size:
                raise ValueError(f"{where}: {raw_digest[:20]}... is not a SHA-256 digest in hex (64 digits)")
            if len(name.encode()) > limits.BROKER_NAME_BYTES_MAX:
                raise ValueError(f"{where}: the name is over {limits.BROKER_NAME_BYTES_MAX} bytes")
            if names.setdefault(key, name) != name:
                raise ValueError(f"{where}: this token already has the name {names[key]!r}")
            try:
                grants.setdefault(key, []).append(_grant(perms.split(","), topics.split(",")))
                quota = Quota.parse(fields[4:]) if len(fields) > 4 else None
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if quota is not None and quotas.setdefault(name, (quota, where))[0] != quota:
                raise ValueError(f"{where}: {name!r} has other quotas at {quotas[name][1]}: "
                                 f"a name's quotas are given once")
        if len(names) > limits.AUTH_TOKENS_MAX:
            raise ValueError(f"{source}: more than {limits.AUTH_TOKENS_MAX} tokens")
        return cls([(k, Principal(names[k], tuple(grants[k]), quota=quotas.get(names[k], (None,))[0]))
                    for k in names])

    def replace(self, other: TokenTable) -> None:
        """Take ``other``'s tokens (a reloaded file): every guard holding this table sees them at once."""
        self.entries = other.entries

    def names(self) -> set[str]:
        return {principal.name for _, principal in self.entries}

    def authenticate(self, token: str | bytes) -> Principal | None:
        """The principal of ``token``, or None. Compares with every entry, matched or not."""
        return self.by_digest(digest(token))

    def by_digest(self, presented: bytes) -> Principal | None:
        """The principal of the token whose digest is ``presented`` (a connection that authenticated
        keeps the digest, not the token), or None; as ``authenticate``."""
        found: Principal | None = None
        for key, principal in self.entries:
            if hmac.compare_digest(presented, key) and found is None:
                found = principal
        return found

    def __len__(self) -> int:
        return len(self.entries)


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header; None if absent or another scheme."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def file_line(token: str, name: str, permissions: str, topics: str, *quotas: str) -> str:
    """A tokens-file line; ``quotas``: fields such as ``produce_bytes_per_s=1048576``."""
    _grant(permissions.split(","), topics.split(","))  # refuse what parse would refuse
    Quota.parse(list(quotas))
    return "  ".join([f"{DIGEST_PREFIX}{digest(token).hex()}", name, permissions, topics, *quotas])


def main(argv: list[str] | None = None) -> int:
    """``new NAME PERMS TOPICS``: a fresh token (stdout) and its tokens-file line (stderr).
    ``hash TOKEN NAME PERMS TOPICS``: the line for a token you already have."""
    import secrets

    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) == 4 and args[0] == "new":
            token = secrets.token_urlsafe(32)
            line = file_line(token, *args[1:])
            print(token)
            print(line, file=sys.stderr)
            return 0
        if len(args) == 5 and args[0] == "hash":
            print(file_line(*args[1:]))
            return 0
    except ValueError as exc:
        print(f"ring.auth: {exc}", file=sys.stderr)
        return 2
    print("usage: python -m ring.auth new NAME PERMISSIONS TOPICS\n"
          "       python -m ring.auth hash TOKEN NAME PERMISSIONS TOPICS\n"
          "PERMISSIONS: comma-separated produce,consume,admin; TOPICS: comma-separated names, prefix*, or *",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
