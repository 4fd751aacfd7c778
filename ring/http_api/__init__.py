"""The HTTP APIs: the client port's front and types (front, sending, web, incoming), its routes (app,
groups_api, admin, cluster_api), wire formats (codec, fetch_codec), the OpenAPI document (openapi),
the servers (server), and the peer API on aiohttp (peer, with its error middleware)."""
