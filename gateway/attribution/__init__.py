"""Token attribution (SPEC §11): which semantic blocks of a prompt cost what, across calls.

PURE: `registry` (the block registry and its legal origin/control pairs), `blocks` (a
request's prompt layout split into registered blocks with `ceil(runes/4)` estimates) and
`ledger` (the one-pass aggregation and the report). Storage lives in
`gateway.ledgers.attribution`; the flow records through `gateway.proxy.projections`.
"""
