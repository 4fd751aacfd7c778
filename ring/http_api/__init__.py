"""The HTTP APIs: the client port's front and types (front, web, incoming), its routes (app,
groups_api, admin, cluster_api), wire formats (codec), the OpenAPI document (openapi), the
servers (server), and the peer API on aiohttp (peer, with its error middleware)."""
