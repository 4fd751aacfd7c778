"""A PolarStreams HTTP client written from PolarStreams' documentation, not from ring's code.

It follows PolarStreams' REST API documentation (docs/rest_api, the consumer
request flow) and its network formats (docs/developer/NETWORK_FORMATS.md):
discovery on the discovery port (``GET /v1/brokers``), produce on the
producer port, and the consumer flow on the consumer port: register once,
poll every broker in turn, each over its own keep-alive connection (as
PolarStreams' clients do), commit, goodbye. Poll answers are decoded from
PolarStreams' binary encoding (big-endian: uint16 item count; per item int64
token, uint8 range index, uint32 generation version, uint8 topic length,
topic, int64 start offset, int32 payload length, zstd payload of records
``int64 timestamp µs, uint32 length, body``) or its JSON one.
"""

from __future__ import annotations

import http.client
import struct
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson
import zstandard

BINARY = "application/vnd.polar.consumermessage"


@dataclass
class Item:
    topic: str
    token: int
    range_index: int
    version: int
    start_offset: int
    values: list[bytes]
    timestamps_us: list[int]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def decode_binary(body: bytes) -> list[Item]:
    count, = struct.unpack_from(">H", body, 0)
    pos, items = 2, []
    for _ in range(count):
        token, range_index, version, topic_len = struct.unpack_from(">qBIB", body, pos)
        pos += 14
        topic = body[pos:pos + topic_len].decode("utf-8")
        pos += topic_len
        offset, payload_len = struct.unpack_from(">qi", body, pos)
        pos += 12
        payload = zstandard.ZstdDecompressor().decompress(body[pos:pos + payload_len], max_output_size=1 << 26)
        pos += payload_len
        values, stamps, at = [], [], 0
        while at < len(payload):
            ts, length = struct.unpack_from(">qI", payload, at)
            at += 12
            values.append(payload[at:at + length])
            stamps.append(ts)
            at += length
        items.append(Item(topic, token, range_index, version, offset, values, stamps))
    assert pos == len(body), (pos, len(body))
    return items


def decode_json(body: bytes) -> list[Item]:
    return [Item(i["topic"], int(i["token"]), i["rangeIndex"], i["version"], int(i["startOffset"]),
                 [orjson.dumps(v) for v in i["values"]], []) for i in orjson.loads(body)]


class Connection:
    """One keep-alive HTTP/1.1 connection to one port of one broker."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout_s)

    def request(self, method: str, path: str, query: Any = None, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        url = path + ("?" + urlencode(query, doseq=True) if query else "")
        self.conn.request(method, url, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        data = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)

    def close(self) -> None:
        self.conn.close()


class PolarClient:
    """Discovers the brokers through one of them, then talks to each on its own ports."""

    def __init__(self, host: str, discovery_port: int) -> None:
        topology = orjson.loads(Connection(host, discovery_port).request("GET", "/v1/brokers").body)
        names = topology.get("names") or [f"{topology['baseName']}{i}.{topology['serviceName']}"
                                          for i in range(topology["length"])]
        assert len(names) == topology["length"]
        self.topology = topology
        self.hosts = names
        self.producers = [Connection(h, topology["producerPort"]) for h in names]
        self.consumers = [Connection(h, topology["consumerPort"]) for h in names]

    def produce(self, broker: int, topic: str, body: bytes, content_type: str = "application/json",
                partition_key: str | None = None) -> Reply:
        query = {"partitionKey": partition_key} if partition_key else None
        return self.producers[broker].request("POST", f"/v1/topic/{topic}/messages", query, body,
                                              {"Content-Type": content_type})

    def register(self, consumer_id: str, group: str, topics: list[str], on_new_group: str | None = None) -> Reply:
        query: dict[str, Any] = {"consumerId": consumer_id, "group": group, "topic": topics}
        if on_new_group:
            query["onNewGroup"] = on_new_group
        return self.consumers[0].request("PUT", "/v1/consumer/register", query)

    def poll(self, broker: int, consumer_id: str, as_json: bool = False) -> tuple[Reply, list[Item]]:
        headers = {"Accept": "application/json"} if as_json else {}
        reply = self.consumers[broker].request("POST", "/v1/consumer/poll", {"consumerId": consumer_id},
                                               headers=headers)
        if reply.status != 200:
            return reply, []
        if as_json:
            assert reply.headers["content-type"].startswith("application/json"), reply.headers
            return reply, decode_json(reply.body)
        assert reply.headers["content-type"] == BINARY, reply.headers
        return reply, decode_binary(reply.body)

    def commit(self, broker: int, consumer_id: str) -> Reply:
        return self.consumers[broker].request("POST", "/v1/consumer/commit", {"consumerId": consumer_id})

    def goodbye(self, broker: int, consumer_id: str, commit: bool = True) -> Reply:
        query = {"consumerId": consumer_id, **({} if commit else {"commit": "false"})}
        return self.consumers[broker].request("POST", "/v1/consumer/goodbye", query)

    def close(self) -> None:
        for c in self.producers + self.consumers:
            c.close()
