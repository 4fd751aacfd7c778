"""The simulated network on the virtual loop (``tests.sim.vnet``): aiohttp's server and client talk
HTTP and websockets over it with seeded delays; a cut link and a killed host refuse and reset."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from tests.sim.vloop import VirtualLoop, run
from tests.sim.vnet import Network

SERVER = ("127.0.0.1", 9000)


async def _serve(loop: VirtualLoop) -> web.AppRunner:
    async def hello(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return web.json_response({"you": request.remote, "body": (await request.read()).decode()})

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            await ws.send_bytes(msg.data[::-1])
        return ws

    app = web.Application()
    app.router.add_post("/hello", hello)
    app.router.add_get("/ws", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await loop.create_server(runner.server, *SERVER)
    return runner


def _world(seed: int, client: str = "10.0.0.9"):
    async def main(loop: VirtualLoop):
        net = Network(loop)

        async def server_side() -> web.AppRunner:
            return await _serve(loop)

        runner = await loop.spawn("127.0.0.1", server_side())

        async def client_side() -> tuple[dict, list[bytes], float]:
            async with aiohttp.ClientSession() as session:
                async with session.post("http://127.0.0.1:9000/hello", data=b"hi") as r:
                    assert r.status == 200
                    doc = await r.json()
                took = loop.time()
                got = []
                async with session.ws_connect("http://127.0.0.1:9000/ws") as ws:
                    for word in (b"abc", b"xyz"):
                        await ws.send_bytes(word)
                        got.append((await ws.receive()).data)
            return doc, got, took

        out = await loop.spawn(client, client_side())
        await loop.spawn("127.0.0.1", runner.cleanup())
        return out, net.digest(), net.deliveries

    return run(seed, main)


def test_http_and_websockets_cross_the_simulated_network() -> None:
    (doc, got, took), _, deliveries = _world(1)
    assert doc == {"you": "10.0.0.9", "body": "hi"}
    assert got == [b"cba", b"zyx"]
    assert 1.0 < took < 1.1  # the handler's second plus the network's milliseconds, all virtual
    assert deliveries >= 6


def test_the_trace_depends_on_the_seed_only() -> None:
    assert _world(3)[1] == _world(3)[1] != _world(4)[1]


def test_a_cut_link_refuses_and_a_killed_host_resets() -> None:
    async def main(loop: VirtualLoop) -> list[str]:
        net = Network(loop)
        await loop.spawn("127.0.0.1", _serve(loop))
        seen: list[str] = []

        async def client_side() -> None:
            async with aiohttp.ClientSession() as session:
                net.cut("10.0.0.9", "127.0.0.1")
                with pytest.raises(aiohttp.ClientConnectorError):
                    await session.post("http://127.0.0.1:9000/hello", data=b"x")
                seen.append("refused while cut")
                net.heal("10.0.0.9", "127.0.0.1")
                loop.call_later(0.5, loop.kill, "127.0.0.1")  # during the handler's second
                with pytest.raises(aiohttp.ClientError):
                    await session.post("http://127.0.0.1:9000/hello", data=b"x")
                seen.append(f"reset at {loop.time():.1f}")
                with pytest.raises(aiohttp.ClientConnectorError):
                    await session.post("http://127.0.0.1:9000/hello", data=b"x")
                seen.append("refused once dead")

        await loop.spawn("10.0.0.9", client_side())
        return seen

    assert run(5, main) == ["refused while cut", "reset at 0.5", "refused once dead"]


def test_a_cut_resets_the_connections_open_across_it() -> None:
    async def main(loop: VirtualLoop) -> tuple[str, float, int]:
        net = Network(loop)
        await loop.spawn("127.0.0.1", _serve(loop))

        async def client_side() -> tuple[str, float, int]:
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect("http://127.0.0.1:9000/ws") as ws:
                    await ws.send_bytes(b"ab")
                    assert (await ws.receive()).data == b"ba"
                    loop.call_later(2.0, net.cut, "10.0.0.9", "127.0.0.1")
                    msg = await ws.receive()
                    return msg.type.name, loop.time(), len(net.open)

        return await loop.spawn("10.0.0.9", client_side())

    kind, at, still_open = run(6, main)
    assert kind in ("CLOSED", "ERROR") and 2.0 <= at < 2.1
    assert still_open == 0


def test_bytes_held_while_reading_is_paused_come_before_later_bytes() -> None:
    """A receiver that pauses reading gets what arrived meanwhile first when it resumes, then what arrives
    after: one connection is one ordered stream, whatever the receiver's flow control does."""

    class Receiver(asyncio.Protocol):
        def __init__(self) -> None:
            self.got: list[bytes] = []

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.got.append(data)

    async def main(loop: VirtualLoop) -> list[bytes]:
        Network(loop, delay_s=(0.001, 0.001))
        receiver = Receiver()
        await loop.create_server(lambda: receiver, "127.0.0.1", 9001)

        async def sender() -> None:
            transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", 9001)
            await asyncio.sleep(0.01)
            receiver.transport.pause_reading()
            transport.write(b"1")
            transport.write(b"2")
            await asyncio.sleep(0.01)  # both held by the paused receiver
            # The receiver resumes in the instant "3" arrives, just before it is delivered.
            loop.call_in("127.0.0.1", 0.001, receiver.transport.resume_reading)
            transport.write(b"3")
            await asyncio.sleep(0.01)

        await loop.spawn("10.0.0.9", sender())
        return receiver.got

    assert b"".join(run(1, main)) == b"123"


def test_writes_that_arrive_in_the_same_instant_arrive_in_the_order_written() -> None:
    class Receiver(asyncio.Protocol):
        def __init__(self) -> None:
            self.got = bytearray()

        def data_received(self, data: bytes) -> None:
            self.got += data

    async def main(loop: VirtualLoop) -> bytes:
        Network(loop, delay_s=(0.001, 0.001))  # every write arrives 1 ms after it is made
        receiver = Receiver()
        await loop.create_server(lambda: receiver, "127.0.0.1", 9002)

        async def sender() -> None:
            transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", 9002)
            for i in range(100):
                transport.write(b"%d," % i)
            await asyncio.sleep(0.01)

        await loop.spawn("10.0.0.9", sender())
        return bytes(receiver.got)

    assert run(1, main) == b"".join(b"%d," % i for i in range(100))
