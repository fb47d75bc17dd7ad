"""check_context, for the proxy and the HTTP API alike (SPEC §6-7).

Modules: `runner` (the ordered checks of each phase and the fail-closed fold), `claims`
(typed binding claims and their versioned codec), `bindings` (AEAD sealing and the key
ring), `destination`, `inspect`, `prepared` (replayed prepared context).
Must not: do network I/O, sequence the wire path (proxy/flow.py does) or expose content.
Importing this package imports none of its modules: callers name the one they use.
"""
