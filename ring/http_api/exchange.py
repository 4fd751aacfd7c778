"""One request on a connection of the client port, and the bytes that head its answer.

``Exchange`` is what the front (``front.Connection``) keeps per request, from
its head to the last byte of its answer; ``answer_head`` writes the status
line and headers of an answer; ``HttpError`` and ``HeadError`` are the
statuses the front answers itself (no route, wrong method, a head over its
bounds), in the JSON shape of every other error.
"""

from __future__ import annotations

from http import HTTPStatus

from ring.errors import RingError
from ring.http_api import web
from ring.http_api.incoming import Incoming
from ring.http_api.web import Request, Response

# What a request is doing; an exchange moves only forward.
RECEIVING, READY, RUNNING, ANSWERED = range(4)
NO_BODY_STATUSES = frozenset({204, 304})
METHODS = {m.encode(): m for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")}


class Exchange:
    """One request and, once there is one, its answer."""

    __slots__ = ("req", "response", "state", "keep_alive", "incoming", "started", "expect_continue",
                 "head_only", "cell", "linger", "cost", "http10")

    def __init__(self, req: Request, keep_alive: bool, started: float) -> None:
        self.req = req
        self.response: Response | None = None
        self.state = RECEIVING
        self.keep_alive = keep_alive
        self.incoming: Incoming | None = None  # None: the body (if any) is dropped as it comes
        self.started = started
        self.expect_continue = False
        self.head_only = req.method == "HEAD"
        self.cell: list | None = None  # auth.CURRENT's cell while this request is served
        self.linger = False  # answered early while its body still comes: read it (dropped) before closing
        self.cost = 0  # bytes its answer is counted for, from built until sent (front.Connection.answer_bytes)
        self.http10 = False  # an HTTP/1.0 request: a keep-alive answer says so


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS_LINES = {s: _status_line(s) for s in (100, 200, 201, 204, 400, 401, 403, 404, 405, 408, 409, 413, 414,
                                              415, 416, 429, 431, 500, 503, 504)}


def answer_head(resp: Response, size: int, close: bool, date: bytes) -> bytes:
    """The status line and headers of an answer of ``size`` body bytes (``date``: the Date line)."""
    status = resp.status
    line = _STATUS_LINES.get(status) or _status_line(status)
    headers = resp.headers
    if not close and resp.content_type == web.CT_JSON:
        if headers is None:
            return b"%sContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n" % (line, size, date)
        if len(headers) == 2 and status not in NO_BODY_STATUSES:  # a fetch's (X-Next-Offset, X-High-Watermark): one format, checked as one
            (n1, v1), (n2, v2) = headers.items()
            extra = f"{n1}: {v1}\r\n{n2}: {v2}\r\n"
            if extra.count("\n") == 2 and extra.count("\r") == 2:
                return b"%sContent-Type: application/json\r\nContent-Length: %d\r\n%s%s\r\n" % (
                    line, size, extra.encode("latin-1"), date)
    text = ""
    if status not in NO_BODY_STATUSES:
        if resp.content_type:
            text = f"Content-Type: {resp.content_type}\r\n"
        text += f"Content-Length: {size}\r\n"
    if resp.headers:
        extra = "".join([f"{name}: {value}\r\n" for name, value in resp.headers.items()])
        if extra.count("\n") != len(resp.headers) or extra.count("\r") != len(resp.headers):
            raise ValueError(f"a header of an answer holds a line break: {list(resp.headers)}")
        text += extra
    if close:
        text += "Connection: close\r\n"
    return b"%s%s%s\r\n" % (line, text.encode("latin-1"), date)


class HttpError(RingError):
    """A status the front answers itself (404, 405), in the JSON shape of every other error."""

    def __init__(self, status: int, phrase: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(phrase)
        self.status = status
        self.code = web.HTTP_CODES.get(status, "error")
        if headers:
            self.headers = headers


class HeadError(HttpError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)


def check_framing(headers: dict[str, str], version: str) -> None:
    """What RFC 9112 requires of a request's head before its body can be read: a Transfer-Encoding
    that ends with chunked, once (else its length cannot be known, 6.3: 400) and names no coding this
    front does not undo (6.1: 501, not a body stored still encoded); one Host, and one at all in
    HTTP/1.1 (3.2: 400)."""
    coding = dict.get(headers, "transfer-encoding")
    if coding is not None:
        codings = [c.strip().lower() for c in coding.split(",")]
        if codings[-1] != "chunked" or "chunked" in codings[:-1]:
            raise HeadError(400, "a request's Transfer-Encoding must end with chunked, once")
        if len(codings) > 1:
            raise HeadError(501, f"Transfer-Encoding {coding[:60]!r}: only chunked is supported")
    if version == "1.1" and dict.get(headers, "host") is None:
        raise HeadError(400, "an HTTP/1.1 request must carry a Host header field")


def origin_path(target: str) -> str:
    """The path of an absolute-form target (``http://host/path``); "" for anything else (a 404)."""
    scheme, sep, rest = target.partition("://")
    if not sep or not scheme.isalpha():
        return ""
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/"
