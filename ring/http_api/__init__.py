"""The client HTTP API: routes (app), wire formats (codec), error mapping
(middleware), the OpenAPI document (openapi) and the guarded server (server)."""
