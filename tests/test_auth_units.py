"""The tokens file, authentication and permission checks (ring.auth), and the route rules
of the client API's access middleware (ring.http_api.access): pure, no broker."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import auth
from ring.errors import BadRequest
from ring.http_api import access

ALICE, OPS = "alice-token-0123456789", "ops-token-9876543210"


def _table() -> auth.TokenTable:
    return auth.TokenTable.parse("\n".join([
        "# comment line",
        auth.file_line(ALICE, "alice", "produce,consume", "orders,clicks-*"),
        auth.file_line(ALICE, "alice", "consume", "audit"),  # a second grant for the same token
        "",
        auth.file_line(OPS, "ops", "admin", "*") + "   # trailing comment",
    ]))


def test_file_lines_store_digests_and_authenticate_the_tokens() -> None:
    line = auth.file_line(ALICE, "alice", "produce", "orders")
    assert ALICE not in line and hashlib.sha256(ALICE.encode()).hexdigest() in line
    table = _table()
    assert len(table) == 2
    alice = table.authenticate(ALICE)
    assert alice is not None and alice.name == "alice" and len(alice.grants) == 2
    assert table.authenticate(OPS).name == "ops"
    for wrong in ("", ALICE[:-1], ALICE + "x", ALICE.upper(), "sha256:" + hashlib.sha256(ALICE.encode()).hexdigest(),
                  hashlib.sha256(ALICE.encode()).hexdigest()):
        assert table.authenticate(wrong) is None, wrong


def test_permissions_by_topic_name_and_prefix() -> None:
    table = _table()
    alice, ops = table.authenticate(ALICE), table.authenticate(OPS)
    assert alice.allows("produce", "orders") and alice.allows("consume", "orders")
    assert not alice.allows("produce", "orders2")  # a name is exact
    assert alice.allows("produce", "clicks-eu") and alice.allows("produce", "clicks-")
    assert not alice.allows("produce", "clicks") and not alice.allows("produce", "audit")
    assert alice.allows("consume", "audit") and not alice.allows("admin", "orders")
    assert alice.allows_any("audit") and not alice.allows_any("other")
    assert alice.allows("consume") and not alice.allows("admin")  # on some topic
    # admin implies produce and consume on its topics; '*' is every topic
    for perm in auth.PERMISSIONS:
        assert ops.allows(perm, "anything") and ops.allows(perm)


@pytest.mark.parametrize("text, message", [
    ("sha256:abcd alice produce orders", "SHA-256"),
    ("plaintext-token alice produce orders", "digest"),
    ("sha256:" + "0" * 64 + " alice produce", "got 3 fields"),
    ("sha256:" + "0" * 64 + " alice write orders", "permissions"),
    ("sha256:" + "0" * 64 + " alice produce or*ders", "topic"),
    ("sha256:" + "0" * 64 + " alice produce a/b", "topic"),
    ("sha256:" + "0" * 64 + " alice produce orders\nsha256:" + "0" * 64 + " bob consume orders", "name"),
])
def test_bad_lines_are_refused_with_their_line_number(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        auth.TokenTable.parse(text, "tokens.txt")
    assert "tokens.txt:" in str(info.value)


def test_bearer_header_parsing() -> None:
    assert auth.parse_bearer("Bearer abc") == "abc"
    assert auth.parse_bearer("bearer   abc ") == "abc"
    for bad in (None, "", "Bearer", "Bearer ", "Basic abc", "abc"):
        assert auth.parse_bearer(bad) is None


def test_authentication_compares_with_every_entry() -> None:
    """No early exit: the number of digest comparisons is the same whichever token matches."""
    calls = []
    original = auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return original(a, b)

    table = auth.TokenTable.parse("\n".join(auth.file_line(f"tok-{i}", f"n{i}", "consume", "*") for i in range(50)))
    auth.hmac.compare_digest = counting
    try:
        counts = []
        for token in ("tok-0", "tok-49", "nope"):
            calls.clear()
            table.authenticate(token)
            counts.append(len(calls))
    finally:
        auth.hmac.compare_digest = original
    assert counts == [50, 50, 50]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_principal_header_round_trips_and_refuses_garbage(junk: str) -> None:
    alice = _table().authenticate(ALICE)
    back = auth.Principal.from_header(alice.to_header())
    assert back == alice
    try:
        got = auth.Principal.from_header(junk)
    except BadRequest:
        return
    assert isinstance(got, auth.Principal)


def test_route_rules() -> None:
    alice = _table().authenticate(ALICE)
    ops = _table().authenticate(OPS)
    scoped_admin = auth.TokenTable.parse(auth.file_line("s", "s", "admin", "orders*")).authenticate("s")
    assert access.rule_for("GET", "/v1/status") == access.OPEN
    assert access.rule_for("HEAD", "/v1/status") == access.OPEN
    assert access.rule_for("GET", "/v1/new-route-nobody-decided") == access.ALL_ADMIN
    assert access.permitted(alice, access.TOPIC_PRODUCE, "orders")
    assert not access.permitted(alice, access.TOPIC_PRODUCE, "audit")
    assert access.permitted(alice, access.DESCRIBE, "audit")
    assert not access.permitted(alice, access.DESCRIBE, None)
    assert not access.permitted(alice, access.SOME_ADMIN, None)
    assert access.permitted(scoped_admin, access.SOME_ADMIN, None)
    assert not access.permitted(scoped_admin, access.ALL_ADMIN, None)
    assert access.permitted(ops, access.ALL_ADMIN, None)
    assert access.permitted(auth.BROKER, access.ALL_ADMIN, None)


def test_every_client_route_has_a_rule(tmp_path) -> None:
    """A route nobody decided on needs admin on every topic: list it in access.RULES instead."""
    from ring.config import BrokerConfig
    from ring.clock import ManualClock
    from ring.cluster.node import ClusterBroker
    from ring.http_api.app import make_app

    from ring.http_api.groups_api import GROUPS_KEY
    from ring.http_api.polar_api import Ports, make_apps

    broker = ClusterBroker(BrokerConfig(data_dir=tmp_path), ManualClock())
    app = make_app(broker)
    apps = [app, *make_apps(broker, app[GROUPS_KEY], Ports(), None).values()]  # and PolarStreams' ports
    routes = {route for a in apps for route in a.routes()}
    missing = sorted(r for r in routes if r not in access.RULES)
    assert not missing, f"routes without an access rule: {missing}"


def test_openapi_marks_open_routes_and_adds_401_403_elsewhere() -> None:
    from ring.http_api import openapi

    doc = openapi.document()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    status = doc["paths"]["/v1/status"]["get"]
    assert status["security"] == [] and "401" not in status["responses"]
    produce = doc["paths"]["/v1/topics/{topic}/messages"]["post"]
    assert {"bearer": []} in produce["security"] and {"401", "403"} <= set(produce["responses"])


async def test_the_identity_lasts_as_long_as_the_request() -> None:
    """Tasks a request starts act for its client while it is served, and as the broker afterwards."""
    import asyncio

    import aiohttp

    from ring.http_api.server import Server
    from ring.http_api.web import App, Response

    table = _table()
    seen: dict[str, object] = {}
    done = asyncio.Event()

    async def later() -> None:
        seen["during"] = auth.current()
        await asyncio.sleep(0.2)
        seen["after"] = auth.current()
        done.set()

    async def handler(request: object) -> object:
        asyncio.get_running_loop().create_task(later())
        await asyncio.sleep(0.05)
        return Response(b"ok", 200, "text/plain")

    app = App()
    app.guard = access.Guard(table, "s", False)
    app.router.add("GET", "/v1/topics", handler)
    server = Server(app, "127.0.0.1", 0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{server.url}/v1/topics", headers={"Authorization": f"Bearer {ALICE}"}) as r:
                assert r.status == 200
        await asyncio.wait_for(done.wait(), 5)
    finally:
        await server.stop()
    assert getattr(seen["during"], "name", None) == "alice" and seen["after"] is None
    assert auth.current() is None
