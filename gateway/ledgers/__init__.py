"""Ledgers: what the gateway must remember across calls — each behind a small interface,
with an in-memory implementation (one process) and, where replicas must agree, a
database-backed one. Only this package and `context/store/` touch a database."""
