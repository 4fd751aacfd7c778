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
token. ``GET /admin/brokers/{broker}/trends`` relays that broker's
``GET /admin/trends`` (its samples for the page's charts, ``trends.py``) the
same way. Only those reads, only to brokers in the cluster view, with a
bounded time and answer size.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Callable

import aiohttp
import orjson

from ring import limits
from ring.catalog import validate_topic_name
from ring.cluster import peers
from ring.errors import NotFound, PayloadTooLarge, Unavailable
from ring.http_api import trends
from ring.http_api.web import App, Request, Response

log = logging.getLogger("ring.admin")

STATIC_DIR = Path(__file__).with_name("static")
_JS = "text/javascript; charset=utf-8"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "app.js": _JS,  # the page: loading, refresh, tables, actions; imports the modules below
    "api.js": _JS,
    "charts.js": _JS,
    "dialogs.js": _JS,
    "dom.js": _JS,
    "groups.js": _JS,
    "load.js": _JS,
    "ring.js": _JS,
    "tokens.js": _JS,
    "trends.js": _JS,
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

ADMIN_KEY = "admin"


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

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def client_url(self, name: str) -> str | None:
        for b in self.broker.cluster().get("brokers", []):
            if b.get("name") == name:
                return b.get("client_url")
        return None


def _file_response(admin: Admin, name: str) -> Response:
    return Response(admin.files[name], 200, FILES[name], SECURITY_HEADERS)


def get_page(request: Request) -> Response:
    return _file_response(request.app[ADMIN_KEY], "index.html")


def get_asset(request: Request) -> Response:
    name = request.match_info["file"]
    if name not in FILES:
        raise NotFound(f"no admin file {name[:80]!r}")
    return _file_response(request.app[ADMIN_KEY], name)


async def relay_topic(request: Request) -> Response:
    admin: Admin = request.app[ADMIN_KEY]
    topic = validate_topic_name(request.match_info["topic"])
    return await _relay(admin, request.match_info["broker"], f"/v1/topics/{topic}",
                        lambda: admin.broker.describe_topic(topic))


async def relay_trends(request: Request) -> Response:
    admin: Admin = request.app[ADMIN_KEY]
    return await _relay(admin, request.match_info["broker"], TRENDS_PATH, request.app[trends.TRENDS_KEY].doc)


async def _relay(admin: Admin, name: str, path: str, here: Callable[[], Any]) -> Response:
    """GET ``path`` as broker ``name`` answers it; ``here()`` when that is this broker."""
    if name == admin.broker.config.name:
        return Response(orjson.dumps(here()))
    url = admin.client_url(name)
    if not url:
        raise NotFound(f"no broker {name[:80]!r} in the cluster view", broker=name[:80])
    headers = {"Accept": "application/json"}
    try:
        async with admin.session().get(f"{url}{path}", headers=headers) as resp:
            body = await resp.content.read(RELAY_BYTES_MAX + 1)
            if len(body) > RELAY_BYTES_MAX:
                raise PayloadTooLarge(f"{name} answered more than {RELAY_BYTES_MAX} bytes")
            ctype = resp.headers.get("Content-Type", "application/json")
            return Response(body, resp.status, ctype)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise Unavailable(f"broker {name} did not answer: {exc or type(exc).__name__}", broker=name) from None


TRENDS_PATH = "/admin/trends"
ROUTES = [  # /admin/trends before /admin/{file}, which would take it
    ("GET", "/", get_page),
    ("GET", TRENDS_PATH, trends.get_trends),
    ("GET", "/admin/{file}", get_asset),
    ("GET", "/admin/brokers/{broker}/topics/{topic}", relay_topic),
    ("GET", "/admin/brokers/{broker}/trends", relay_trends),
]

_TEXT = {"description": "the file", "content": {"text/html": {"schema": {"type": "string"}}}}
_ERROR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_TRENDS_DOC = f"""A sample every {limits.TRENDS_INTERVAL_MS} ms, the last {limits.TRENDS_SAMPLES_MAX} kept: t (ms since
the epoch), ms (what it covers), topics {{topic: [records acknowledged to producers, records handed to fetches and
group polls]}} by the requests this broker answered (the {limits.TRENDS_TOPICS_MAX} busiest; quiet topics are
left out), groups {{group: records behind}} for the groups this broker coordinates (the {limits.TRENDS_GROUPS_MAX}
most behind)."""
_TRENDS = {"type": "object", "required": ["broker", "interval_ms", "samples_max", "samples"], "properties": {
    "broker": {"type": "string"}, "interval_ms": {"type": "integer"}, "samples_max": {"type": "integer"},
    "samples": {"type": "array", "items": {"type": "object", "required": ["t", "ms", "topics", "groups"],
                                           "properties": {
        "t": {"type": "integer"}, "ms": {"type": "integer"},
        "topics": {"type": "object", "additionalProperties": {
            "type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}},
        "groups": {"type": "object", "additionalProperties": {"type": "integer"}}}}}}}
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
    TRENDS_PATH: {"get": {
        "summary": "This broker's samples for the admin page's charts", "operationId": "adminTrends",
        "description": _TRENDS_DOC,
        "responses": {"200": {"description": "the samples, oldest first", "content": {
            "application/json": {"schema": _TRENDS}}}}}},
    "/admin/brokers/{broker}/trends": {
        "parameters": [{"name": "broker", "in": "path", "required": True, "schema": {"type": "string"},
                        "description": "a broker name from GET /v1/cluster"}],
        "get": {"summary": "GET /admin/trends as another broker answers it (the page sums every broker's)",
                "operationId": "adminRelayTrends",
                "responses": {"200": {"description": "that broker's samples", "content": {
                    "application/json": {"schema": _TRENDS}}}, "404": _ERROR, "503": _ERROR}}},
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


def install(app: App, broker: Any) -> Admin:
    """Serve the admin page from ``app``; call before the app starts."""
    admin = Admin(broker)
    app[ADMIN_KEY] = admin
    trends.install(app, broker)
    for method, path, handler in ROUTES:
        app.router.add(method, path, handler)
    app.on_cleanup.append(admin.close)
    return admin
