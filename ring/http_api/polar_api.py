"""PolarStreams' REST API on its own three ports (``ring serve --polarstreams``), as PolarStreams serves it.

PolarStreams lays its HTTP/1.1 API out on three ports (9250, 9251, 9252 by
default), the same on every broker: *discovery* (``GET /v1/brokers``: the
brokers' host names and the other two ports), *producer* (``POST
/v1/topic/{topic}/messages``) and *consumer* (register, poll, commit,
goodbye: ``polar_consumer``). Every port answers ``GET /status``: 200, or 503
with ``Retry-After: 1`` while the broker has not joined its cluster.

These listeners are thin: produce goes to the broker's own produce path
(``Broker.intake.produce``) with the records ``polar_codec`` makes of the
body, consumers are members of ring's consumer groups (``groups_api``). What
PolarStreams answers, they answer: ``200 OK`` as text, and errors as plain
text with PolarStreams' status for each (``_polar_error``): an unknown or
invalid topic is 400 ``Invalid topic``, a body without a Content-Length or
over ``MESSAGE_BYTES_MAX`` 400, a produce no leader could take 421, a write
whose outcome is unknown 500, a consumer not registered 409. Errors ring has
and PolarStreams does not (401/403 with ``--auth-tokens``, 413, 429) keep
ring's status, as text.

Discovery names each broker by the host it advertises (``--advertise``, else
its listen host): PolarStreams' clients reach broker *i* at
``names[i]:producerPort`` and ``names[i]:consumerPort``, so every broker of
the cluster must run with ``--polarstreams`` on the same ports and at its own
host, as PolarStreams' brokers do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import orjson

from ring import auth, limits
from ring.catalog import validate_topic_name
from ring.errors import BadRequest, NotFound, PayloadTooLarge, RequestTimeout, RingError, StorageError
from ring.hashing import ordinal_from_name
from ring.http_api import access, codec, polar_codec, polar_consumer, web
from ring.http_api import budget as body_budget
from ring.http_api.admission import admission_of
from ring.http_api.keys import BROKER_KEY, POLAR_PORTS_KEY
from ring.http_api.groups_api import GROUPS_KEY
from ring.http_api.server import Server
from ring.http_api.web import Request, Response
from ring.produce import Produce
from ring.replication.intake import results_of

log = logging.getLogger("ring.polar")

ROLE_KEY = "polar role"  # discovery | producer | consumer

TEXT = "text/plain; charset=utf-8"
OK_TYPE = "text/html; charset=utf-8"  # what PolarStreams sends with "OK"
NOT_READY = "Broker is unavailable to handle producer/consumer requests"
NOT_REGISTERED = polar_consumer.NOT_REGISTERED
INVALID_TOPIC = "Invalid topic"
BAD_LENGTH = ("Content length must be defined (HTTP/1.1 chunked not supported), greater than 0 and less than "
              f"{limits.MESSAGE_BYTES_MAX} bytes")


@dataclass(frozen=True)
class Ports:
    discovery: int = 9250
    producer: int = 9251
    consumer: int = 9252

    @classmethod
    def parse(cls, text: str) -> Ports:
        """``DISCOVERY,PRODUCER,CONSUMER``; ValueError for anything else."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 3 or not all(p.isdigit() and 0 < int(p) <= 65535 for p in parts) or len(set(parts)) != 3:
            raise ValueError(f"--polarstreams-ports must be three different ports DISCOVERY,PRODUCER,CONSUMER, "
                             f"not {text!r}")
        return cls(*(int(p) for p in parts))

    def __iter__(self):
        return iter((self.discovery, self.producer, self.consumer))


def text(body: str, status: int = 200, headers: dict[str, str] | None = None,
         content_type: str = TEXT) -> Response:
    return Response(body.encode("utf-8"), status, content_type, headers)


def ready(broker: Any) -> bool:
    return broker.status()["status"] == "ok"


# --- errors -------------------------------------------------------------------------


def _polar_error(role: str, exc: RingError) -> Response:
    """``exc`` as PolarStreams answers it on a ``role`` port."""
    status, message = exc.status, exc.message
    if role == "producer":
        if isinstance(exc, NotFound) or getattr(exc, "code", "") in ("unknown_topic", "invalid_topic_name"):
            status, message = 400, INVALID_TOPIC
        elif status == 503:  # nothing was written: PolarStreams' "could not be handled at the moment"
            status, message = 421, f"Producer request could not be handled at the moment: {message}"
        elif isinstance(exc, (RequestTimeout, StorageError)) or status >= 500:
            status, message = 500, "Internal server error"
    elif status == 409 and role == "consumer" and not message.startswith(NOT_REGISTERED):
        message = f"{NOT_REGISTERED}: {message}"
    headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))} if exc.retry_after_s else None
    if status in (429, 503) and headers is None:
        headers = {"Retry-After": "1"}
    return text(message, status, headers)


# --- status and discovery -----------------------------------------------------------


_STATUS_TEXT = {"discovery": "Client discovery server listening on {}\n",
                "producer": "Producer server listening on {}\n", "consumer": "Consumer server listening on {}\n"}


async def status(request: Request) -> Response:
    if not ready(request.app[BROKER_KEY]):
        return text(NOT_READY, 503, {"Retry-After": "1"})
    role = request.app[ROLE_KEY]
    return text(_STATUS_TEXT[role].format(getattr(request.app[POLAR_PORTS_KEY], role)))


def brokers_doc(broker: Any, ports: Ports) -> dict[str, Any]:
    """``GET /v1/brokers``: PolarStreams' topology, names ordered by ordinal (ring order otherwise)."""
    members = [b for b in broker.cluster()["brokers"] if b["status"] != "removed"]

    def order(b: dict[str, Any]) -> tuple[float, int]:
        ordinal = ordinal_from_name(b["name"])
        return (float("inf") if ordinal is None else ordinal, b["token"] or 0)

    names = [urlsplit(b["client_url"]).hostname or "" for b in sorted(members, key=order)]
    return {"length": len(names), "names": names, "producerPort": ports.producer, "consumerPort": ports.consumer}


async def brokers(request: Request) -> Response:
    return web.json(brokers_doc(request.app[BROKER_KEY], request.app[POLAR_PORTS_KEY]))


# --- produce ------------------------------------------------------------------------


def _check_produce(request: Request) -> None:
    """The topic, the body's length and the key, before the body is read."""
    try:
        topic = validate_topic_name(request.match_info["topic"])
    except BadRequest:
        raise BadRequest(INVALID_TOPIC) from None
    length = request.content_length
    if length is None or not 0 < length <= limits.MESSAGE_BYTES_MAX:
        raise BadRequest(BAD_LENGTH)
    raw_key = request.query.get("partitionKey")
    key = raw_key.encode("utf-8", "surrogatepass") if raw_key else None
    if key is not None and len(key) > limits.KEY_BYTES_MAX:
        raise PayloadTooLarge(f"partitionKey is over the limit of {limits.KEY_BYTES_MAX} bytes")
    request.state = (topic, key)


async def produce(request: Request) -> Response:
    broker = request.app[BROKER_KEY]
    topic, key = request.state
    values, is_json = polar_codec.produce_values(request.content_type, request.body)
    request.body = b""
    if values:  # an NDJSON body of empty lines holds no record: stored as nothing, as there
        await results_of(topic, broker.intake.produce(Produce(topic, codec.stored_as_given(values, key, is_json),
                                                              key=key)))
    return text("OK", content_type=OK_TYPE)


async def get_messages(request: Request) -> Response:
    return text("Producer server doesn't allow getting topic messages\n", 405)


# --- the apps -----------------------------------------------------------------------


def make_apps(broker: Any, groups: Any, ports: Ports, tokens: auth.TokenTable | None) -> dict[str, web.App]:
    """The discovery, producer and consumer apps; ``groups`` is the client app's ``Groups``."""
    apps: dict[str, web.App] = {}
    for role in ("discovery", "producer", "consumer"):
        app = web.App()
        app.answer_error = partial(_polar_error, role)
        app.body_budget = body_budget.body_budget_of(broker)
        app.admission = admission_of(broker)
        app.clock = broker.clock
        if tokens is not None:
            app.guard = access.Guard(tokens, broker.config.cluster_secret, broker.config.tls.mutual)
        app[ROLE_KEY], app[POLAR_PORTS_KEY], app[BROKER_KEY], app[GROUPS_KEY] = role, ports, broker, groups
        app.router.add("GET", "/status", status)
        apps[role] = app
    apps["discovery"].router.add("GET", "/v1/brokers", brokers)
    apps["producer"].router.add("POST", "/v1/topic/{topic}/messages", produce, body_max=limits.MESSAGE_BYTES_MAX,
                                prepare=_check_produce)
    apps["producer"].router.add("GET", "/v1/topic/{topic}/messages", get_messages)
    polar_consumer.install(apps["consumer"])
    return apps


class Listeners:
    """The three PolarStreams listeners of one broker, on its listen host."""

    def __init__(self, broker: Any, groups: Any, host: str, ports: Ports, tokens: auth.TokenTable | None = None,
                 access_log: bool = False) -> None:
        apps = make_apps(broker, groups, ports, tokens)
        tls = broker.config.tls.client_port_context()
        self.servers = [Server(apps[role], host, port, access_log=access_log, ssl_context=tls)
                        for role, port in zip(("discovery", "producer", "consumer"), ports)]

    async def start(self) -> None:
        started: list[Server] = []
        try:
            for srv in self.servers:
                await srv.start()
                started.append(srv)
        except OSError:
            for srv in started:
                await srv.stop()
            raise

    async def stop(self) -> None:
        for srv in self.servers:
            await srv.stop()

    @property
    def urls(self) -> list[str]:
        return [srv.url for srv in self.servers]
