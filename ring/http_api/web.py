"""The client port's request and answer types, its router, and the app that holds them.

The client port is served by ring's own HTTP/1.1 front (``front.py``), not by
aiohttp's server: a produce or a fetch is small, and aiohttp's request
machinery (its Request and Response objects, the middleware chain, a task and
timers per request) cost several times the work such a request needs. What a
handler sees is a ``Request`` whose head was parsed by httptools and whose
body has already arrived (bounded, decoded, counted by the front), and what
it gives back is a ``Response``, a coroutine that will produce one, or a
``Later`` (an answer built when a future is done, with no task at all).

Routes are templates (``/v1/topics/{topic}/messages``) matched segment by
segment; percent-encoded segments reach handlers decoded (``%2F`` included,
as one segment: the names' own checks refuse it). Each route carries what
the front needs before the body arrives: its access rule (``access.RULES``),
the largest body it takes, and an optional ``prepare`` that checks the
query and headers so a bad request is refused before its body is read.
Every GET route answers HEAD too, without the body.
"""

from __future__ import annotations

import asyncio
import math
from http import HTTPStatus
from typing import Any, Awaitable, Callable, Iterable, Union
from urllib.parse import unquote, unquote_plus

import orjson

from ring.clock import Clock, SystemClock
from ring.errors import RingError

CT_JSON = "application/json"


class Query(dict):
    """A query string's parameters: ``get`` gives the first value of a name, ``getall`` every one."""

    __slots__ = ("pairs",)

    def getall(self, name: str, default: Iterable[str] = ()) -> list[str]:
        found = [v for k, v in self.pairs if k == name]
        return found if found else list(default)


def parse_query(text: str) -> Query:
    q = Query()
    pairs = []
    for part in text.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        if "%" in part or "+" in part:
            name, value = unquote_plus(name), unquote_plus(value)
        pairs.append((name, value))
        if name not in q:
            q[name] = value
    q.pairs = pairs
    return q


class Headers(dict):
    """Request headers by lower-cased name (repeated fields joined with ", "); lookups ignore case."""

    __slots__ = ()

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class Request:
    """One request: its head, its whole body, where it came in, and who is asking."""

    __slots__ = ("method", "path", "query_string", "_query", "headers", "body", "body_size", "match_info", "route",
                 "app", "conn", "seq", "principal", "state", "via")

    def __init__(self, method: str, path: str, query_string: str, headers: Headers, app: "App",
                 conn: Any = None, seq: int = 0) -> None:
        self.method = method
        self.path = path  # as received (percent-encoded), without the query
        self.query_string = query_string
        self._query: Query | None = None
        self.headers = headers
        self.body = b""
        self.body_size = 0  # bytes of the body as received (decoded): kept when a handler drops the body
        self.match_info: dict[str, str] = {}
        self.route: Route | None = None
        self.app = app
        self.conn = conn  # the front's connection: ``id``, ``transport``, ``written_through(seq)``
        self.seq = seq  # this request's place on its connection, from 0
        self.principal: Any = None  # who is served (access.Guard); None when authentication is off
        self.state: Any = None  # what a route's ``prepare`` found, for its handler
        self.via: Any = None  # link.Via: what its connection had written whole when it began (group polls)

    @property
    def query(self) -> Query:
        if self._query is None:
            self._query = parse_query(self.query_string)
        return self._query

    @property
    def content_type(self) -> str:
        """The media type of the body, lower-cased, without parameters ("application/octet-stream" when absent)."""
        raw = self.headers.get("content-type")
        if not raw:
            return "application/octet-stream"
        return raw.split(";", 1)[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        raw = self.headers.get("content-length")
        return int(raw) if raw is not None and raw.isdigit() else None

    @property
    def path_qs(self) -> str:
        return self.path + ("?" + self.query_string if self.query_string else "")

    @property
    def transport(self) -> Any:
        return None if self.conn is None else self.conn.transport

    @property
    def remote(self) -> str | None:
        peer = None if self.transport is None else self.transport.get_extra_info("peername")
        return None if not peer else str(peer[0])

    def replace(self, method: str | None = None, path: str | None = None, query: dict[str, str] | None = None,
                body: bytes | None = None, headers: dict[str, str] | None = None) -> Request:
        """The same request with another method, path (with its own query, if any), query or headers."""
        qs = self.query_string
        if path is not None:
            path, _, qs = path.partition("?")
        if query is not None:
            from urllib.parse import urlencode

            qs = urlencode(query)
        hdrs = self.headers if headers is None else Headers({k.lower(): v for k, v in headers.items()})
        other = Request(method or self.method, path if path is not None else self.path, qs, hdrs,
                        self.app, self.conn, self.seq)
        other.body = self.body if body is None else body
        other.body_size = len(other.body)
        other.principal = self.principal
        other.match_info = dict(self.match_info)
        other.route = self.route
        other.via = self.via
        return other


class Response:
    """An answer: status, body bytes and headers. ``hold`` (answer_budget.Hold) is released once the body
    has been handed to the socket; ``on_written`` is called once every byte of it left this process;
    ``before_last`` right before its last byte is handed to the transport, in the same step (a group
    poll marks its connection then: ``link``)."""

    __slots__ = ("status", "body", "content_type", "headers", "hold", "records", "on_written", "before_last")

    def __init__(self, body: bytes = b"", status: int = 200, content_type: str | None = CT_JSON,
                 headers: dict[str, str] | None = None, hold: Any = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers
        self.hold = hold
        self.records = 0  # for metrics: records a produce acknowledged or a fetch moved past
        self.on_written: Callable[[], None] | None = None
        self.before_last: Callable[[], None] | None = None

    def release(self) -> None:
        """Drop the body and give its hold back (sent, or never to be sent)."""
        self.body = b""
        if self.hold is not None:
            self.hold.release()
            self.hold = None


def json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status)


class Later:
    """An answer that is ready when ``future`` is (an ``asyncio.Future``, or anything with its
    ``done`` and ``add_done_callback``): ``make(future)`` builds it (an exception it raises, the
    future's own included, is answered like one a handler raised). No task runs for it."""

    __slots__ = ("future", "make")

    def __init__(self, future: Any, make: Callable[[Any], Response]) -> None:
        self.future = future
        self.make = make


Answer = Union[Response, Later, Awaitable[Response]]
Handler = Callable[[Request], Answer]


# --- errors ------------------------------------------------------------------------------

# Codes of statuses the front answers itself, in the vocabulary of ring.errors.
HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
              413: "payload_too_large", 414: "uri_too_long", 415: "unsupported_media_type",
              431: "request_header_fields_too_large", 500: "internal", 501: "not_implemented"}


def error(status: int, body: dict[str, Any], retry_after_s: float | None = None,
          headers: dict[str, str] | None = None) -> Response:
    headers = dict(headers) if headers else {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return Response(orjson.dumps(body), status, headers=headers or None)


def ring_error(exc: RingError) -> Response:
    # An error class may name headers of its own (a 401's WWW-Authenticate).
    return error(exc.status, exc.to_json(), exc.retry_after_s, getattr(exc, "headers", None))


def http_error(status: int, message: str | None = None, headers: dict[str, str] | None = None) -> Response:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    code = HTTP_CODES.get(status, phrase.lower().replace(" ", "_").replace("-", "_"))
    return error(status, {"error": code, "message": message or phrase}, headers=headers)


# --- routes ------------------------------------------------------------------------------


class Route:
    __slots__ = ("method", "template", "handler", "parts", "rule", "body_max", "prepare", "stats", "plane")

    def __init__(self, method: str, template: str, handler: Handler, body_max: int | None,
                 prepare: Callable[[Request], None] | None, rule: str) -> None:
        self.method = method
        self.template = template
        self.handler = handler
        self.parts = template.split("/")
        self.rule = rule
        self.body_max = body_max  # None: the route reads no body (one is received and dropped)
        self.prepare = prepare
        self.stats: Any = None  # metrics.RouteStats, set when metrics are installed
        self.plane = ""  # "produce", "fetch", or "" off the data plane (access.plane_of, for admission)


class Routes:
    """The routes of one port: a request's method and path to its Route and path parameters."""

    def __init__(self) -> None:
        self._static: dict[str, dict[str, Route]] = {}  # path -> method -> route
        self._dynamic: dict[int, list[tuple[str, dict[str, Route]]]] = {}  # segments -> [(template, methods)]
        self._routes: list[Route] = []
        self.route_added: Callable[[Route], None] | None = None  # metrics gives each route its counters
        # path -> (methods, parameters) of paths seen lately: a produce or fetch path repeats
        self._seen: dict[str, tuple[dict[str, Route] | None, dict[str, str]]] = {}

    def add(self, method: str, template: str, handler: Handler, *, body_max: int | None = None,
            prepare: Callable[[Request], None] | None = None) -> Route:
        from ring.http_api import access

        route = Route(method, template, handler, body_max, prepare, access.rule_for(method, template))
        route.plane = access.plane_of(method, template, route.rule)
        if "{" not in template:
            methods = self._static.setdefault(template, {})
        else:
            rows = self._dynamic.setdefault(len(route.parts), [])
            methods = next((m for t, m in rows if t == template), None)  # type: ignore[assignment]
            if methods is None:
                methods = {}
                rows.append((template, methods))
        assert method not in methods, (method, template)
        methods[method] = route
        self._routes.append(route)
        if self.route_added is not None:
            self.route_added(route)
        return route

    def routes(self) -> list[Route]:
        return list(self._routes)

    def resolve(self, method: str, path: str) -> tuple[Route | None, dict[str, str], list[str]]:
        """(route, path parameters, methods the path allows): no route and no methods is a 404,
        no route with methods a 405. The parameters are shared by requests of the same path: read only."""
        seen = self._seen.get(path)
        if seen is None:
            seen = self._lookup(path)
            if len(path) <= _SEEN_PATH_BYTES_MAX:
                if len(self._seen) >= _SEEN_PATHS_MAX:
                    self._seen.clear()
                self._seen[path] = seen
        methods, params = seen
        if methods is None:
            return None, params, []
        route = methods.get(method) or (methods.get("GET") if method == "HEAD" else None)
        return route, params, sorted(methods) if route is None else []

    def _lookup(self, path: str) -> tuple[dict[str, Route] | None, dict[str, str]]:
        methods = self._static.get(path)
        if methods is not None:
            return methods, {}
        segs = path.split("/")
        for _, candidate in self._dynamic.get(len(segs), ()):
            params = _match(candidate[next(iter(candidate))].parts, segs)
            if params is not None:
                return candidate, params
        return None, {}


# Paths remembered by the router, and the longest remembered: bounded whatever clients send.
_SEEN_PATHS_MAX = 1024
_SEEN_PATH_BYTES_MAX = 512


def _match(parts: list[str], segs: list[str]) -> dict[str, str] | None:
    params = {}
    for part, seg in zip(parts, segs):
        if part.startswith("{"):
            if not seg:
                return None
            params[part[1:-1]] = unquote(seg) if "%" in seg else seg
        elif part != seg:
            return None
    return params


class App:
    """The client API: its router, the state its handlers share (by key), the access guard, the
    request-body budget, how errors are answered, and what to close when the server stops."""

    def __init__(self) -> None:
        from ring.http_api.admission import Admission
        from ring.http_api.budget import BodyBudget

        self.router = Routes()
        self.guard: Any = None  # access.Guard when client authentication is on
        self.body_budget = BodyBudget()
        self.admission = Admission()  # the broker's own (admission_of) once the app serves one
        self.clock: Clock = SystemClock()  # the broker's once the app serves one: its front's deadlines
        self.metrics: Any = None
        # How a RingError is answered: ring's JSON (PolarStreams' ports answer theirs as text).
        self.answer_error: Callable[[RingError], Response] = ring_error
        self.on_startup: list[Callable[[], Awaitable[None]]] = []  # once its server accepts
        self.on_cleanup: list[Callable[[], Awaitable[None]]] = []
        self._state: dict[Any, Any] = {}

    def __getitem__(self, key: Any) -> Any:
        return self._state[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._state[key] = value

    def __contains__(self, key: Any) -> bool:
        return key in self._state

    def get(self, key: Any, default: Any = None) -> Any:
        return self._state.get(key, default)

    def add_routes(self, routes: Iterable[tuple[str, str, Handler]], **options: Any) -> None:
        for method, template, handler in routes:
            self.router.add(method, template, handler, **options)

    def routes(self) -> list[tuple[str, str]]:
        """(method, template) of every route, as the OpenAPI document lists them (HEAD implied by GET)."""
        return [(r.method, r.template) for r in self.router.routes()]

    async def startup(self) -> None:
        for start in self.on_startup:
            await start()

    async def cleanup(self) -> None:
        for close in reversed(self.on_cleanup):
            await close()
