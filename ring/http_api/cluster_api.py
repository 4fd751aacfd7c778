"""Client-API routes that change cluster membership, and their OpenAPI path items.

``POST /v1/cluster/brokers/{name}/decommission`` takes a broker off the ring
(the admin page's "decommission" button calls it): its partitions get new
replicas on the brokers placement now names, filled from their leaders
before they count for quorum, the high watermark or elections, and its own
replicas are closed (their data stays on disk). The broker keeps running
until it is stopped; started again later, it joins afresh. A broker down
longer than ``--down-grace-s`` is removed the same way without being asked.
"""

from __future__ import annotations

from typing import Any

from ring import limits
from ring.errors import BadRequest, Unavailable
from ring.http_api.web import App, Request, Response, json
from ring.http_api.keys import BROKER_KEY

_NAME_MAX = limits.BROKER_NAME_BYTES_MAX


async def decommission(request: Request) -> Response:
    broker = request.app[BROKER_KEY]
    name = request.match_info["name"]
    if not name or len(name.encode()) > _NAME_MAX:
        raise BadRequest(f"broker name must be 1-{_NAME_MAX} bytes")
    act = getattr(broker, "decommission", None)
    if act is None:
        raise Unavailable("a broker alone has no cluster to leave")
    return json(await act(name))


ROUTES = [
    ("POST", "/v1/cluster/brokers/{name}/decommission", decommission),
]


def register(app: App) -> None:
    for method, path, handler in ROUTES:
        app.router.add(method, path, handler)


_ERROR = {"$ref": "#/components/schemas/Error"}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


OPENAPI_PATHS: dict[str, Any] = {
    "/v1/cluster/brokers/{name}/decommission": {
        "post": {
            "summary": "Take a broker off the ring",
            "operationId": "decommissionBroker",
            "description": "The broker's partitions get new replicas where placement now puts them; each new "
                           "replica is filled from its partition's leader before it counts for quorum, the high "
                           "watermark or elections, and no acknowledged record is lost. Partitions the broker "
                           "led fail over (or are handed over while it is alive). The broker may be stopped "
                           "once GET /v1/cluster shows it removed; started again, it joins afresh. A broker "
                           "down longer than the grace period (ring serve --down-grace-s, default 300 s) is "
                           "removed the same way.",
            "parameters": [{"name": "name", "in": "path", "required": True,
                            "schema": {"type": "string", "maxLength": _NAME_MAX}, "description": "broker name"}],
            "responses": {
                "200": {"description": "removed; the cluster's brokers as this broker now sees them",
                        "content": {"application/json": {"schema": {
                            "type": "object", "properties": {"decommissioned": {"type": "string"},
                                                             "brokers": {"type": "array"}}}}}},
                "400": _err("malformed broker name"),
                "404": _err("no broker of that name is known"),
                "503": _err("a broker alone, or still joining the cluster"),
            },
        },
    },
}
