"""The admin page every broker serves at ``/``, and the one read-only helper route it needs.

The page is a few static files (``static/index.html``, ``style.css`` and
the ES modules ``app.js`` imports) read once at start and served with a strict Content Security
Policy: no inline script, nothing loaded from anywhere but this broker. All
it shows and does goes through the public client API (``/v1/...``) with the
client token the user typed, so the page can do nothing a curl cannot.

One thing the public API cannot give a page: each replica's lag is known
only to the partition's leader, which may be another broker, and a page may
only call its own origin. ``GET /admin/brokers/{broker}/topics/{topic}``
therefore asks broker ``{broker}`` (by the client URL gossip gives for it)
for ``GET /v1/topics/{topic}`` and relays its answer; the request carries the
cluster secret and the caller's identity (``ring.cluster.peers``), not its
token. Only that one read, only to brokers in the cluster view, with a
bounded time and answer size.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from ring import limits
from ring.catalog import validate_topic_name
from ring.cluster import peers
from ring.errors import NotFound, PayloadTooLarge, Unavailable

log = logging.getLogger("ring.admin")

STATIC_DIR = Path(__file__).with_name("static")
_JS = "text/javascript; charset=utf-8"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "app.js": _JS,  # the page: loading, refresh, tables, actions; imports the modules below
    "api.js": _JS,
    "dialogs.js": _JS,
    "dom.js": _JS,
    "groups.js": _JS,
    "ring.js": _JS,
    "tokens.js": _JS,
}
# The page runs only its own script and talks only to this broker: an injected
# string (a topic or broker name) can never become code.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# Answers relayed from another broker: a topic description, well under a request's bound.
RELAY_BYTES_MAX = limits.REQUEST_BYTES_MAX
RELAY_TIMEOUT_S = limits.PEER_REQUEST_TIMEOUT_S

ADMIN_KEY: web.AppKey["Admin"] = web.AppKey("admin", object)  # type: ignore[arg-type]


class Admin:
    """The page's bytes, and a lazily opened client session for the relay."""

    def __init__(self, broker: Any, static_dir: Path = STATIC_DIR) -> None:
        self.broker = broker
        self.files = {name: (static_dir / name).read_bytes() for name in FILES}
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            config = self.broker.config
            self._session = peers.make_session(config.cluster_secret, config.tls, RELAY_TIMEOUT_S)
        return self._session

    async def close(self, _app: web.Application | None = None) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def client_url(self, name: str) -> str | None:
        for b in self.broker.cluster().get("brokers", []):
            if b.get("name") == name:
                return b.get("client_url")
        return None


def _file_response(admin: Admin, name: str) -> web.Response:
    return web.Response(body=admin.files[name], headers={"Content-Type": FILES[name], **SECURITY_HEADERS})


async def get_page(request: web.Request) -> web.Response:
    return _file_response(request.app[ADMIN_KEY], "index.html")


async def get_asset(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    if name not in FILES:
        raise NotFound(f"no admin file {name[:80]!r}")
    return _file_response(request.app[ADMIN_KEY], name)


async def relay_topic(request: web.Request) -> web.Response:
    admin: Admin = request.app[ADMIN_KEY]
    name = request.match_info["broker"]
    topic = validate_topic_name(request.match_info["topic"])
    if name == admin.broker.config.name:
        return web.Response(body=orjson.dumps(admin.broker.describe_topic(topic)), content_type="application/json")
    url = admin.client_url(name)
    if not url:
        raise NotFound(f"no broker {name[:80]!r} in the cluster view", broker=name[:80])
    headers = {"Accept": "application/json"}
    try:
        async with admin.session().get(f"{url}/v1/topics/{topic}", headers=headers) as resp:
            body = await resp.content.read(RELAY_BYTES_MAX + 1)
            if len(body) > RELAY_BYTES_MAX:
                raise PayloadTooLarge(f"{name} answered more than {RELAY_BYTES_MAX} bytes")
            ctype = resp.headers.get("Content-Type", "application/json")
            return web.Response(status=resp.status, body=body, headers={"Content-Type": ctype})
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise Unavailable(f"broker {name} did not answer: {exc or type(exc).__name__}", broker=name) from None


ROUTES = [
    ("GET", "/", get_page),
    ("GET", "/admin/{file}", get_asset),
    ("GET", "/admin/brokers/{broker}/topics/{topic}", relay_topic),
]

_TEXT = {"description": "the file", "content": {"text/html": {"schema": {"type": "string"}}}}
_ERROR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
OPENAPI_PATHS: dict[str, Any] = {
    "/": {"get": {"summary": "The admin page", "operationId": "adminPage", "responses": {"200": _TEXT}}},
    "/admin/{file}": {
        "parameters": [{"name": "file", "in": "path", "required": True, "schema": {"enum": sorted(FILES)},
                        "description": "one of the page's files"}],
        "get": {"summary": "A file of the admin page", "operationId": "adminFile",
                "responses": {"200": {"description": "the file", "content": {
                    "text/html": {"schema": {"type": "string"}},
                    "text/javascript": {"schema": {"type": "string"}},
                    "text/css": {"schema": {"type": "string"}}}}, "404": _ERROR}}},
    "/admin/brokers/{broker}/topics/{topic}": {
        "parameters": [
            {"name": "broker", "in": "path", "required": True, "schema": {"type": "string"},
             "description": "a broker name from GET /v1/cluster"},
            {"name": "topic", "in": "path", "required": True,
             "schema": {"type": "string", "pattern": f"^{limits.TOPIC_NAME_PATTERN.pattern}$"},
             "description": "topic name"}],
        "get": {"summary": "GET /v1/topics/{topic} as another broker answers it (its leaders know replica lag)",
                "operationId": "adminRelayTopic",
                "responses": {"200": {"description": "that broker's answer", "content": {
                    "application/json": {"schema": {"type": "object"}}}},
                    "400": _ERROR, "404": _ERROR, "503": _ERROR}}},
}


def install(app: web.Application, broker: Any) -> Admin:
    """Serve the admin page from ``app``; call before the app starts."""
    admin = Admin(broker)
    app[ADMIN_KEY] = admin
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    app.on_cleanup.append(admin.close)
    return admin
