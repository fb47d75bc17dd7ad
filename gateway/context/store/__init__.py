"""Context store: the storage interface (base.py) and its SQLite and PostgreSQL implementations."""
