"""A produce's options (``timeout_ms``) travel with it to the leader: the forward link's request item
carries them as a map by name (and, with none set, is the five fields a leader of the link's first
version reads), the HTTP way to a leader that serves no link carries them as one JSON query parameter,
and the leader checks each (a wait in [1, PRODUCE_TIMEOUT_MS_MAX]) and refuses a name it does not know;
the request's ``ack_timeout_ms`` is what the leader's wait uses.
"""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from ring import limits
from ring.cluster import forwards
from ring.errors import BadRequest
from ring.produce import Batches, Produce

BODY = b"batches"


def _split(body: bytes) -> Batches:
    return Batches([bytearray(body)], 1)


def _over_the_link(req: Produce, partition: int) -> forwards.Forward:
    message = msgpack.packb([forwards.request_item(7, req, partition, BODY)], use_bin_type=True)
    (f,) = forwards.decode_requests(message)
    return f


def test_a_forwarded_produce_keeps_its_timeout() -> None:
    req = Produce("t", _split(BODY), None, None, "all", None, 300)
    f = _over_the_link(req, 2)
    got = f.request(_split)
    assert (f.id, got.topic, got.partition, got.consistency, got.timeout_ms) == (7, "t", 2, "all", 300)
    assert got.ack_timeout_ms == 300 and got.records.batches == [bytearray(BODY)]
    assert forwards.request_item(7, req, 2, BODY)[5] == {"timeout_ms": 300}
    q = forwards.query(req, 2)
    assert q["options"] == '{"timeout_ms":300}'
    assert forwards.Forward.from_query(q, 2, BODY).request(_split).ack_timeout_ms == 300


def test_without_a_timeout_the_item_is_the_first_versions_and_the_wait_is_the_default() -> None:
    req = Produce("t", _split(BODY), 0, None, "quorum")
    assert forwards.request_item(1, req, 0, BODY) == [1, "t", 0, "quorum", BODY]
    assert "options" not in forwards.query(req, 0)
    got = _over_the_link(req, 0).request(_split)
    assert got.timeout_ms is None and got.ack_timeout_ms == limits.REPLICATION_ACK_TIMEOUT_MS


@pytest.mark.parametrize("timeout_ms", [0, -1, limits.PRODUCE_TIMEOUT_MS_MAX + 1, "300", True, 1.5])
def test_the_leader_refuses_a_timeout_out_of_bounds(timeout_ms: object) -> None:
    f = forwards.Forward(1, "t", 0, "all", BODY, {"timeout_ms": timeout_ms})
    with pytest.raises(BadRequest) as refused:
        f.request(_split)
    assert refused.value.extra["parameter"] == "timeout_ms"


@pytest.mark.parametrize("raw", ['{"timeout_ms":0}', '{"timeout_ms":"300"}', '{"timeout_ms":1e3}',
                                 '{"timeout_ms":%d}' % (limits.PRODUCE_TIMEOUT_MS_MAX + 1), "[300]", "{", "300"])
def test_the_leader_refuses_malformed_options_in_the_query(raw: str) -> None:
    with pytest.raises(BadRequest):
        forwards.Forward.from_query({"topic": "t", "consistency": "all", "options": raw}, 0, BODY).request(_split)


@pytest.mark.parametrize("options", [{"linger": 5}, {"timeout_ms": 300, "acks": "all"}, [["timeout_ms", 300]]])
def test_the_leader_refuses_options_it_does_not_know_rather_than_drop_them(options: object) -> None:
    with pytest.raises(BadRequest, match="options"):
        forwards.Forward(1, "t", 0, "all", BODY, options).request(_split)


async def test_a_leader_of_the_links_first_version_is_asked_over_http() -> None:
    """A leader of an older release serves ``ring-forward.1``, whose items have five fields: this
    release's forwarder opens no link to it (its items may have six) and forwards over HTTP instead,
    whose query the older leader reads without the parameters it does not know."""
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    seen: list[object] = []

    async def older_leader(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("ring-forward.1",))
        await ws.prepare(request)
        async for msg in ws:
            seen.append(msg.data)
        return ws

    app = web.Application()
    app.router.add_get(forwards.PATH, older_leader)
    async with TestServer(app) as server, ClientSession() as session:
        links = forwards.ForwardLinks(session, lambda: 0.0)
        req = Produce("t", _split(BODY), 0, None, "all", None, 300)
        url = str(server.make_url("")).rstrip("/")
        assert await asyncio.wait_for(links.call(url, req, 0, BODY), 10) is None  # a link would wait for an answer
        assert links.open() == 0 and seen == []
