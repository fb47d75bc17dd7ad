"""Route handlers: each parses its request, calls one service, and renders the result.
`provider` (the provider routes, into proxy/flow.py), `ops` (health, readiness, metrics,
models, capabilities, usage), `check` (POST /v1/context/check)."""
