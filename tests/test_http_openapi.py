"""The OpenAPI document describes exactly the routes the app serves, and a group poll's answer as a broker gives it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import jsonschema_rs  # schemathesis' validator
import msgpack

from ring.config import BrokerConfig
from ring.clock import ManualClock
from ring.cluster.node import ClusterBroker
from ring.http_api import openapi
from ring.http_api.app import make_app

_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def _app_routes() -> set[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        app = make_app(ClusterBroker(BrokerConfig(data_dir=Path(tmp)), ManualClock()))
        routes = {(method.lower(), template) for method, template in app.routes()}
    return routes


def _documented_routes() -> set[tuple[str, str]]:
    doc = openapi.document()
    return {(method, path) for path, item in doc["paths"].items() for method in item if method in _METHODS}


def test_document_lists_exactly_the_apps_routes() -> None:
    app_routes = _app_routes()
    assert app_routes, "the app has no routes?"
    assert _documented_routes() == app_routes


def test_path_parameters_are_declared() -> None:
    doc = openapi.document()
    for path, item in doc["paths"].items():
        names = {seg[1:-1] for seg in path.split("/") if seg.startswith("{")}
        for method, op in item.items():
            if method not in _METHODS:
                continue
            params = item.get("parameters", []) + op.get("parameters", [])
            declared = {p["name"] for p in params if p["in"] == "path"}
            assert declared == names, (method, path)
            assert "200" in op["responses"] or "201" in op["responses"], (method, path)


def test_document_is_json_and_31() -> None:
    import orjson

    doc = orjson.loads(orjson.dumps(openapi.document()))
    assert doc["openapi"] == "3.1.0" and doc["info"]["title"] == "ring"


def test_group_poll_records_match_the_document(broker, topic: str) -> None:
    """A real group poll's records, headers and a record without a value among them, validate against
    the poll answer's schema."""
    http = broker.http
    assert http.create_topic(topic, partitions=1).status == 201
    body = msgpack.packb([{"value": b"v", "headers": [["h", "1"], ["h", "2"]]}, {"key": "k", "headers": {"x": None}},
                          {"value": b"\xff"}])
    assert http.produce(topic, body, "application/msgpack", partition=0).status == 200
    join = http.post(f"/v1/groups/g-{topic}/members", json_body={"consumer": "c", "topics": [topic]})
    assert join.status == 200, join.body
    r = http.post(f"/v1/groups/g-{topic}/members/c/poll")
    assert r.status == 200, r.body
    records = r.json()["records"]
    assert len(records) == 3 and records[0]["headers"] == [["h", "1"], ["h", "2"]] and "value" not in records[1]
    doc = openapi.document()
    answer = doc["paths"]["/v1/groups/{group}/members/{consumer}/poll"]["post"]["responses"]["200"]
    validator = jsonschema_rs.validator_for({**answer["content"]["application/json"]["schema"],
                                             "components": doc["components"]})  # what its $refs name
    errors = [str(e) for e in validator.iter_errors(r.json())]
    assert not errors, errors
