"""Two trivial HTTP servers that a request's CPU cost in ring is read against.

``python -m ring.bench.yardsticks aiohttp|httptools --port N`` serves, on
uvloop, one answer for any request: the body (if any) is read and parsed
with ``orjson.loads``, and a fixed 60-byte JSON object goes back. The
``aiohttp`` one is an ``aiohttp.web`` handler (what a small request costs
through aiohttp's server); the ``httptools`` one an ``asyncio.Protocol``
feeding ``httptools.HttpRequestParser`` and writing the answer from
``on_message_complete`` (the parse-and-answer floor of a Python server on
this machine). Neither does any of ring's work, so ring's CPU per request over
theirs is what ring's request path costs beyond HTTP itself.

It prints ``listening <port>`` once it accepts, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import orjson

ANSWER = orjson.dumps({"topic": "yardstick", "partition": 0, "base_offset": 12345, "count": 1})


class _HttptoolsConnection(asyncio.Protocol):
    """Keep-alive HTTP/1.1 on httptools: answers in order, one per request."""

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.body:
            orjson.loads(b"".join(self.body))
            self.body.clear()
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(ANSWER), ANSWER))
        if not self.parser.should_keep_alive():
            self.transport.close()


async def _serve_httptools(port: int, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_HttptoolsConnection, "127.0.0.1", port, reuse_address=True)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    await stop.wait()
    server.close()


async def _serve_aiohttp(port: int, stop: asyncio.Event) -> None:
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        body = await request.read()
        if body:
            orjson.loads(body)
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    print(f"listening {site._server.sockets[0].getsockname()[1]}", flush=True)  # type: ignore[union-attr]
    await stop.wait()
    await runner.cleanup()


async def _main(kind: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await (_serve_aiohttp if kind == "aiohttp" else _serve_httptools)(port, stop)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ring.bench.yardsticks", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=("aiohttp", "httptools"))
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_main(args.kind, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
