"""Who may call which client route: the access guard (``Guard``) and its rule table.

With no tokens file every request is let in (``ANONYMOUS``, local use). With
one, a request needs ``Authorization: Bearer TOKEN`` for a token in the file,
and the token's grants must allow the route's rule, else 401 (no or unknown
token, with ``WWW-Authenticate: Bearer``) or 403 (known token, not allowed):

    open            GET /, /admin/{file}, /v1/status, /v1/openapi.json; PolarStreams' GET /status
    authenticated   GET /v1/cluster, /v1/topics, /v1/groups, /metrics, the admin page's trends (and their
                    relay); PolarStreams' GET /v1/brokers
    describe        GET /v1/topics/{topic} and its admin relay: any permission on the topic
    produce         POST /v1/topics/{topic}/messages (and PolarStreams' POST /v1/topic/{topic}/messages)
    consume         fetch, offsets and ranges of {topic}; resetting a group's offsets of {topic};
                    other group routes (join, poll, commit, positions, leave, and PolarStreams' register,
                    poll, commit, goodbye) need consume on some topic
                    here, and consume on each topic they name or the member subscribed
                    (checked by the handler: ``require``)
    admin           POST /v1/topics (admin on the new name), PATCH and DELETE /v1/topics/{topic},
                    truncate {topic}; decommissioning a
                    broker (admin on every topic: a grant whose topics include '*')

A route missing from ``RULES`` needs admin on every topic, so a new route is
closed until someone decides; a test checks every route has a rule.

Brokers call each other's client ports too (proxied reads, group requests
sent to the coordinator). Such a request carries the cluster secret
(``Ring-Cluster-Secret``), and with ``--peer-ca`` the connection must also
present a certificate that CA signed; it then acts as the identity in
``Ring-Principal`` (the original client's, checked by the first broker), or
as the broker itself without one. A client cannot claim an identity: the
``Ring-Principal`` header counts only beside a valid secret, and a wrong
secret is a 401. The identity being served is also in ``auth.CURRENT`` (a context
variable) so that a broker's outgoing requests carry it (``ring.cluster.peers``).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from ring import auth, tls
from ring.errors import Forbidden, Unauthorized
from ring.cluster.peers import H_PRINCIPAL, H_SECRET

log = logging.getLogger("ring.http")

OPEN = "open"
AUTHENTICATED = "authenticated"
DESCRIBE = "describe"  # any permission on match_info["topic"]
TOPIC_PRODUCE = "produce"  # on match_info["topic"]
TOPIC_CONSUME = "consume"
TOPIC_ADMIN = "admin"
SOME_CONSUME = "consume on some topic"  # the handler checks the topics it learns
SOME_ADMIN = "admin on some topic"
ALL_ADMIN = "admin on every topic"

RULES: dict[tuple[str, str], str] = {
    ("GET", "/"): OPEN,
    ("GET", "/admin/{file}"): OPEN,
    ("GET", "/v1/status"): OPEN,
    ("GET", "/v1/openapi.json"): OPEN,
    ("GET", "/v1/cluster"): AUTHENTICATED,
    ("GET", "/v1/topics"): AUTHENTICATED,
    ("POST", "/v1/topics"): SOME_ADMIN,  # and admin on the new name: app.create_topic
    ("GET", "/v1/topics/{topic}"): DESCRIBE,
    ("GET", "/admin/brokers/{broker}/topics/{topic}"): DESCRIBE,
    ("PATCH", "/v1/topics/{topic}"): TOPIC_ADMIN,
    ("DELETE", "/v1/topics/{topic}"): TOPIC_ADMIN,
    ("POST", "/v1/topics/{topic}/messages"): TOPIC_PRODUCE,
    ("POST", "/v1/topic/{topic}/messages"): TOPIC_PRODUCE,
    ("GET", "/v1/topics/{topic}/partitions/{partition}/messages"): TOPIC_CONSUME,
    ("GET", "/v1/topics/{topic}/partitions/{partition}/offsets"): TOPIC_CONSUME,
    ("GET", "/v1/topics/{topic}/partitions/{partition}/ranges"): TOPIC_CONSUME,
    ("POST", "/v1/topics/{topic}/partitions/{partition}/truncate"): TOPIC_ADMIN,
    ("POST", "/v1/topics/{topic}/partitions/{partition}/unclean-election"): TOPIC_ADMIN,
    ("GET", "/metrics"): AUTHENTICATED,  # names and counts any token can list anyway: a scraper needs no grant
    ("GET", "/admin/trends"): AUTHENTICATED,  # the same counts, sampled for the admin page's charts
    ("GET", "/admin/brokers/{broker}/trends"): AUTHENTICATED,
    ("GET", "/v1/groups"): AUTHENTICATED,
    ("GET", "/v1/groups/{group}"): AUTHENTICATED,
    # A group names no topic to check a grant on, and deleting it moves every reader of it back to its
    # reset policy: the cluster's admins', as a broker's decommission is.
    ("DELETE", "/v1/groups/{group}"): ALL_ADMIN,
    ("POST", "/v1/groups/{group}/members"): SOME_CONSUME,
    ("POST", "/v1/groups/{group}/members/{consumer}/poll"): SOME_CONSUME,
    ("DELETE", "/v1/groups/{group}/members/{consumer}"): SOME_CONSUME,
    ("GET", "/v1/groups/{group}/members/{consumer}/positions"): SOME_CONSUME,
    ("PUT", "/v1/groups/{group}/members/{consumer}/positions"): SOME_CONSUME,
    ("POST", "/v1/groups/{group}/offsets"): SOME_CONSUME,
    ("PUT", "/v1/groups/{group}/offsets/{topic}"): TOPIC_CONSUME,
    ("POST", "/v1/cluster/brokers/{name}/decommission"): ALL_ADMIN,
    # PolarStreams' ports (ring serve --polarstreams: polar_api)
    ("GET", "/status"): OPEN,
    ("GET", "/v1/brokers"): AUTHENTICATED,
    ("GET", "/v1/topic/{topic}/messages"): OPEN,  # answered 405, as PolarStreams does
    ("PUT", "/v1/consumer/register"): SOME_CONSUME,
    ("POST", "/v1/consumer/register"): SOME_CONSUME,
    ("POST", "/v1/consumer/poll"): SOME_CONSUME,
    ("POST", "/v1/consumer/commit"): SOME_CONSUME,
    ("POST", "/v1/consumer/goodbye"): SOME_CONSUME,
}
# HEAD is answered beside every GET route as GET would be, so it needs what GET needs.


def plane_of(method: str, template: str, rule: str) -> str:
    """The data-plane kind of a route, for admission and quotas (``admission``): "produce" for a
    produce, "fetch" for reading records and offsets and for group polls and commits, "" for the
    control plane (status, metrics, topics, groups' membership, the admin page), never refused by load."""
    if rule == TOPIC_PRODUCE:
        return "produce"
    if (rule == TOPIC_CONSUME and method == "GET") or (
            rule == SOME_CONSUME and method == "POST" and template.endswith(("/poll", "/offsets", "/commit"))):
        return "fetch"
    return ""


def rule_for(method: str, path: str) -> str:
    if method == "HEAD":
        method = "GET"
    return RULES.get((method, path), ALL_ADMIN)


def permitted(principal: auth.Principal, rule: str, topic: str | None) -> bool:
    """Whether ``principal`` may call a route with ``rule`` (``topic`` from its path)."""
    if rule in (OPEN, AUTHENTICATED):
        return True
    if rule == DESCRIBE:
        return topic is not None and principal.allows_any(topic)
    if rule in (TOPIC_PRODUCE, TOPIC_CONSUME, TOPIC_ADMIN):
        return topic is not None and principal.allows(rule, topic)
    if rule == SOME_CONSUME:
        return principal.allows(auth.CONSUME)
    if rule == SOME_ADMIN:
        return principal.allows(auth.ADMIN)
    assert rule == ALL_ADMIN, rule
    return principal.everything or any(auth.ADMIN in g.permissions and "*" in g.topics for g in principal.grants)


_ON_PATH_TOPIC = (DESCRIBE, TOPIC_PRODUCE, TOPIC_CONSUME, TOPIC_ADMIN)


class TokenRequired(Unauthorized):
    """401 that tells the client which scheme to use (RFC 6750)."""

    headers = {"WWW-Authenticate": 'Bearer realm="ring"'}


def principal_of(request: Any) -> auth.Principal:
    """The identity a handler is serving; ANONYMOUS when authentication is off."""
    return request.principal or auth.ANONYMOUS


def require(request: Any, permission: str, topics: Iterable[str]) -> None:
    """For handlers that learn topics from a body or a group: 403 unless each is allowed."""
    principal = principal_of(request)
    for topic in topics:
        if not principal.allows(permission, topic):
            raise Forbidden(f"{principal.name} may not {permission} topic {topic!r}"[:300],
                            permission=permission, topic=topic[:300])


_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def describe_security(doc: dict) -> dict:
    """Add the bearer scheme to an OpenAPI document: open routes need nothing, the others
    a token (when the broker runs with --auth-tokens) and may answer 401 and 403."""
    components = doc.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http", "scheme": "bearer",
        "description": "a client token from the broker's --auth-tokens file; brokers without one ignore it"}
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if method not in _METHODS:
                continue
            rule = rule_for(method.upper(), path)
            if rule == OPEN:
                op["security"] = []
                continue
            # Optional in the document: a broker without a tokens file takes requests without one.
            op["security"] = [{"bearer": []}, {}]
            op["description"] = (op.get("description", "") + f"\n\nNeeds (with --auth-tokens): {rule}.").strip()
            responses = op.setdefault("responses", {})
            responses.setdefault("401", {"description": "no client token, or an unknown one", **error})
            responses.setdefault("403", {"description": f"the token lacks {rule}", **error})
    return doc


class Guard:
    """Client authentication on the client port (``--auth-tokens``): who a request comes from, and
    whether its route's rule lets it in. Run by the front once the request's head is in, before its
    body is read; it sets ``request.principal``."""

    def __init__(self, tokens: auth.TokenTable, secret: str | None, mutual_tls: bool) -> None:
        self.tokens = tokens
        self.secret = secret
        self.mutual_tls = mutual_tls

    def _from_broker(self, request: Any) -> auth.Principal:
        if not auth.secret_matches(self.secret, request.headers.get(H_SECRET)):
            log.warning("refused a request from %s with a wrong cluster secret: %s %s",
                        request.remote, request.method, request.path)
            raise Unauthorized("wrong cluster secret")
        if self.mutual_tls and not tls.peer_certificate_verified(request.transport):
            log.warning("refused a broker request from %s without a certificate from the peer CA",
                        request.remote)
            raise Unauthorized("a broker's request needs its certificate (signed by the peer CA)")
        carried = request.headers.get(H_PRINCIPAL)
        return auth.Principal.from_header(carried) if carried else auth.BROKER

    def identify(self, request: Any) -> auth.Principal:
        if H_SECRET in request.headers:
            return self._from_broker(request)
        token = auth.parse_bearer(request.headers.get("Authorization"))
        if token is None:
            raise TokenRequired("this broker needs a client token: Authorization: Bearer TOKEN")
        principal = self.tokens.authenticate(token)
        if principal is None:
            raise TokenRequired("unknown client token")
        return principal

    def check(self, request: Any) -> None:
        """401 or 403 unless the request may call its route; its principal set when it may."""
        route = request.route
        rule = route.rule
        if rule == OPEN:
            return
        principal = self.identify(request)
        topic = request.match_info.get("topic")
        if not permitted(principal, rule, topic):
            what = f"{rule} on topic {topic!r}" if rule in _ON_PATH_TOPIC else rule
            raise Forbidden(f"{principal.name} may not {request.method} {route.template}: it needs {what}"[:400],
                            needs=rule)
        request.principal = principal
