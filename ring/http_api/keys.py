"""What the client app keeps for its route modules: the broker behind it (``BROKER_KEY``), set by
``app.make_app``, so the route modules never import ``app``."""

from __future__ import annotations

BROKER_KEY = "broker"
