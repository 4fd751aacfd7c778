"""What the apps keep for their route modules, so route modules never import the app that registers
them: the client app's broker (``BROKER_KEY``, set by ``app.make_app``), the peer app's node
(``NODE_KEY``, set by ``peer.make_peer_app``) and PolarStreams' ports (``POLAR_PORTS_KEY``, set by
``polar_api.Listeners``)."""

from __future__ import annotations

from aiohttp import web

BROKER_KEY = "broker"
POLAR_PORTS_KEY = "polar ports"  # polar_api.Ports
NODE_KEY: web.AppKey = web.AppKey("node", object)
