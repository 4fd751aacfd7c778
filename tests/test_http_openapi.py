"""The OpenAPI document describes exactly the routes the app serves."""

from __future__ import annotations

import tempfile
from pathlib import Path

from aiohttp import web

from ring.broker import BrokerConfig
from ring.clock import ManualClock
from ring.cluster.node import ClusterBroker
from ring.http_api import openapi
from ring.http_api.app import make_app

_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def _app_routes() -> set[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        app = make_app(ClusterBroker(BrokerConfig(data_dir=Path(tmp)), ManualClock()))
        routes = set()
        for route in app.router.routes():
            assert isinstance(route.resource, web.Resource)
            routes.add((route.method.lower(), route.resource.canonical))
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
